"""L3 with a constraint: the joint law of the first L tokens of the backend's select + verify,
each verify row masked by the runtime (``dflash2rt.constraints``: row j with the automaton
state after d_1..d_j, gathered on the device), equals the target-only law under the same
constraint (TV ≤ 1e-12; greedy: the same chain).

The automaton's state is (last token, position), and it allows exactly the support of the
context's quarter table; the raw rows put the forbidden tokens *above* every allowed one, so
only the right mask turns a raw row into its lattice-exact quarter table — a runtime that masks
row j with another row's state (row 0's, the committed one) moves the law far from the target.
With ``draft side`` "unmasked" the backend's select proposes as it would without a constraint
(its q puts mass on forbidden tokens, which verification rejects); with "masked" the draft side
is the engine's under a constraint (``engine.stages.select_block``: candidate masks, then the
walk masked with the state after the path so far, q the masked law), on tables whose masked
laws stay on the quarter lattice."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dflash2rt.constraints import TokenAutomaton
from dflash2rt.constraints.device import ConstraintBatch
from dflash2rt_conformance import lattice
from dflash2rt_conformance.reference import constraints as ref
from dflash2rt_conformance.reference.sampling import softmax

pytestmark = pytest.mark.dflash2rt_level("L3")

V, K = 4, 3
PROMPT = (0,)
FORBIDDEN = 3.0                    # raw logit of forbidden tokens: above every log p ≤ 0


def _automaton(p_fn, horizon: int) -> TokenAutomaton:
    """States (position − len(PROMPT)) · V + last token; token v allowed iff the quarter
    table of (last, position) gives it mass; the last position's states are dead ends."""
    p0 = len(PROMPT)
    t = np.full(((horizon + 1) * V, V), -1)
    for k in range(horizon):
        for last in range(V):
            p = np.asarray(p_fn((0,) * (p0 + k - 1) + (last,)), float)
            t[k * V + last, p > 0] = (k + 1) * V + np.flatnonzero(p > 0)
    return TokenAutomaton(t, PROMPT[-1])


@pytest.mark.parametrize("draft_side", ["unmasked", "masked"])
@pytest.mark.parametrize("temperature", [1.0, 0.0], ids=["sampled", "greedy"])
def test_joint_law_with_constraint(temperature, draft_side, backend, results, sizes):
    dev, masked = backend.device, draft_side == "masked"
    p_fn, sel = lattice.context_tables("constraint" + "-draft" * masked, V, K, masked)
    a = _automaton(p_fn, sizes.l3_length + sizes.l3_gamma + 2)
    tilt = 0.0 if temperature > 0 else -0.01 * np.arange(V)   # greedy: no exact ties

    def raw_fn(ctx):
        p = np.asarray(p_fn(ctx), float)
        return np.where(p > 0, lattice.log_or_neg(p) + tilt, FORBIDDEN)

    def ref_p(ctx):                # the target-only law: the reference mask of the raw row
        return softmax(ref.mask_row(raw_fn(ctx), a.next, ref.walk(a.next, a.start,
                                                                   ctx[len(PROMPT):])))

    def committed(ctx, r):
        out, cb = list(ctx[len(PROMPT):]), ConstraintBatch.build([a] * r, V, dev)
        if out:
            cb.commit_(torch.tensor([out] * r, device=dev),
                       torch.full((r,), len(out), device=dev))
        return cb

    def process(ctx, vlog, draft):
        return committed(ctx, draft.shape[0]).mask(vlog, draft)

    def draft_fn(ctx, logits):
        cb = committed(ctx, logits.shape[0])
        return cb.draft_logits(logits), cb.walk()

    lattice.check_processed_joint_law(
        backend, results, sizes, PROMPT, p_fn, sel, raw_fn, process, ref_p, temperature,
        "constraint", f"constraint-{draft_side}-V{V}-g{sizes.l3_gamma}-L{sizes.l3_length}",
        "constraint", draft_side=draft_fn if masked else None)
