"""L1: constraint masks of the runtime (``dflash2rt.constraints``: a token automaton's state
gathered along the drafts on the device, applied by the engine before the backend's verify)
vs the float64 reference (``reference.constraints``), at block boundaries: verify row j must
be masked with the state after the committed tokens and d_1..d_j. In "every_row_moves", row
j's best raw token is allowed at row 0's state but forbidden at row j's, with the next draft
just below it: a runtime that masks every row with row 0's state rejects at slot 2. In
"forbidden_draft", a draft the mask forbids is rejected, and greedy verify emits the
reference's token there."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dflash2rt.constraints import TokenAutomaton
from dflash2rt.constraints.device import ConstraintBatch
from dflash2rt.ops.batch import BlockNoise, SamplingBatch
from dflash2rt_conformance.reference import constraints as ref

pytestmark = pytest.mark.dflash2rt_level("L1")

V, GAMMA, STATES = 37, 4, 8
COMMITTED = (5,)                          # the anchor, state 0 → 1
DRAFT = (20, 21, 22, 23)
TEMPT = 10                                # state k forbids TEMPT + k (and nothing else)


def _table(forbid_draft: int | None) -> np.ndarray:
    """State k → k + 1 (the last loops) on every token but TEMPT + k; with ``forbid_draft``,
    state 1 + that slot also forbids that slot's draft token."""
    t = np.tile(np.minimum(np.arange(STATES) + 1, STATES - 1)[:, None], (1, V))
    for k in range(STATES):
        t[k, TEMPT + k] = -1
    if forbid_draft is not None:
        t[1 + forbid_draft, DRAFT[forbid_draft]] = -1
    return t


def _logits() -> np.ndarray:
    """Row j: d_{j+1} (bonus row: 30) at 5.0, TEMPT + 1 + j (forbidden at row j's state,
    1 + j, allowed at row 0's) at 5.2; rows j >= 1: TEMPT + 1 at 4.0 (what greedy verify
    emits where a forbidden draft is rejected)."""
    x = np.random.default_rng(5).uniform(-2.0, 1.0, (GAMMA + 1, V))
    for j in range(GAMMA + 1):
        x[j, DRAFT[j] if j < GAMMA else 30] = 5.0
        x[j, TEMPT + 1 + j] = 5.2
        if j:
            x[j, TEMPT + 1] = 4.0
    return x


CASES = {"every_row_moves": None, "forbidden_draft": 2}


@pytest.mark.parametrize("case", list(CASES))
def test_constraint_rows_at_block_boundaries(case, backend, results):
    dev, table = backend.device, _table(CASES[case])
    raw = _logits()
    state = ref.walk(table, 0, COMMITTED)
    want = ref.block_rows(raw, table, state, DRAFT)
    cb = ConstraintBatch.build([TokenAutomaton(table)], V, dev)
    cb.commit_(torch.tensor([COMMITTED], device=dev), torch.tensor([len(COMMITTED)], device=dev))
    draft = torch.tensor([DRAFT], device=dev)
    got = cb.mask(torch.tensor(raw[None], dtype=torch.float32, device=dev), draft)[0]
    g = got.double().cpu().numpy()
    same_inf = np.isneginf(g) == np.isneginf(want)
    err = float(np.max(np.abs(np.where(np.isfinite(want), g - want, 0.0))))
    results.metric("L1", f"constraint rows {case} max |err|", err)
    assert same_inf.all() and err <= 1e-6, \
        f"[L1 constraint case={case}] masked rows differ from the reference (rows " \
        f"{sorted(set(np.argwhere(~same_inf)[:, 0].tolist()))} mask other tokens; max |err| " \
        f"{err:.3g}): row j must be masked with the state after d_1..d_j"
    ver = backend.verify(got[None], draft, draft.unsqueeze(-1),
                         torch.ones(1, GAMMA, 1, device=dev), SamplingBatch.greedy_batch(1, dev),
                         BlockNoise.unused(1, GAMMA, dev))
    best = [int(np.flatnonzero(r == r.max())[0]) for r in want]
    acc = next((j for j in range(GAMMA) if best[j] != DRAFT[j]), GAMMA)
    expect = list(DRAFT[:acc]) + [best[acc]]
    assert acc == (GAMMA if CASES[case] is None else CASES[case]), \
        f"[L1 constraint case={case}] the case does not reach the slot it is built for"
    tokens = [t for t in ver.tokens[0].tolist() if t >= 0]
    assert tokens == expect, f"[L1 constraint case={case}] greedy verify over masked rows " \
                             f"emitted {tokens}, the reference {expect} (row j must be masked " \
                             "with the state after d_1..d_j)"
