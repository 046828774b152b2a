"""Seeded bugs the L0 oracle must detect (docs/verification.md): an oracle that catches none
proves nothing.

Each name is a change to the reference pipeline in ``laws.spec_round``:

- ``shared_noise``: the acceptance coin of slot j reuses the draft's walk uniform of slot j.
- ``off_by_one_row``: slot j is verified against target row j+1 (the bonus row repeats).
- ``le_u_zero``: uniforms on the floor lattice k/m (u = 0 possible) and ``u·q <= p``, so a
  token with p = 0 is accepted when u = 0 and ties u·q = p are accepted.
- ``onehot_softmax_q``: the draft takes the argmax of its law (deterministic) but reports the
  softmax q, as if the token had been sampled from it.

``SCHEDULE_MUTANTS`` change the adaptive block-size schedule (``schedules.py``) instead:

- ``peeks_first_accept``: the block size reads the current step's slot-0 acceptance coin — the
  full block when it is small (< 1/2, the draft will likely be accepted), else a target-only
  step. Detected by the L0 adaptive law on the reference and by L3 on a backend. (Choosing
  between two speculative blocks by the slot-0 coin would be harmless — slot 0 is decided
  before the block size matters — so the peek must decide whether the step speculates, or read
  a coin past the smaller block.)
"""

from __future__ import annotations

import numpy as np

from .sampling import inverse_cdf
from .verify import dense_q, draft_mass

MUTANTS = {
    "shared_noise": "acceptance coin = the draft's walk uniform of the same slot",
    "off_by_one_row": "slot j verified against target row j+1",
    "le_u_zero": "u = 0 allowed and u·q <= p (non-strict)",
    "onehot_softmax_q": "argmax draft scored with the softmax q",
}


SCHEDULE_MUTANTS = {
    "peeks_first_accept": "block size chosen from the current step's slot-0 acceptance coin "
                          "(full block if u < 1/2, else target-only)",
}


def peeking_schedule(bmax: int):
    """``schedules.Schedule`` that reads the current step's first acceptance coin (the bug)."""
    def schedule(history: tuple, ctx: tuple, peek: float) -> int:
        return bmax if peek < 0.5 else 1
    return schedule


def verify_le(p, draft, cand, q, u_accept, u_residual, u_bonus) -> tuple[int, int]:
    """``verify_sampled_row`` with the non-strict test ``u·q <= p`` (the mutation)."""
    gamma, v = len(draft), p.shape[1]
    for j in range(gamma):
        if not u_accept[j] * draft_mass(draft[j], cand[j], q[j]) <= p[j][draft[j]]:
            resid = np.array([max(a - b, 0 * a) for a, b in zip(p[j], dense_q(cand[j], q[j], v))])
            return j, inverse_cdf(p[j] if resid.sum() <= 0 else resid, u_residual[j])
    return gamma, inverse_cdf(p[gamma], u_bonus[0])
