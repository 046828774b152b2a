"""L3 with logit processors: the joint law of the first L tokens of the backend's select +
verify, with the runtime's processing of each verify row (``dflash2rt.ops.procs``: row j with
the counts after d_1..d_j), equals the target-only law under the same processors (TV ≤ 1e-12).

The raw verify logits are built by inverting the reference processors (``reference.procs``)
around context-dependent quarter tables, so the *processed* rows are the lattice-exact tables:
a runtime that processes a row with the wrong counts (pre-block counts, row 0's state on every
row) moves the law far from the target. The target law is the float64 reference's processing
of the same raw rows, then target-only sampling."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dflash2rt.engine.request import SamplingParams
from dflash2rt.ops.procs import ProcBatch
from dflash2rt_conformance import lattice
from dflash2rt_conformance.reference import procs as ref_procs
from dflash2rt_conformance.reference.sampling import softmax

pytestmark = pytest.mark.dflash2rt_level("L3")

V, K = 4, 3
PROMPT = (0,)
SHIFT = 1.5                        # processed rows log p + SHIFT: mixed signs (repetition)
CASES = {
    "frequency": dict(frequency_penalty=1.5),
    "presence": dict(presence_penalty=-1.25),
    "repetition": dict(repetition_penalty=2.5),
    "all": dict(repetition_penalty=1.7, frequency_penalty=0.75, presence_penalty=0.5,
                logit_bias={1: 2.0, 3: -1.0}),
}


def _ref_kw(kw: dict) -> tuple:
    return (kw.get("repetition_penalty", 1.0), kw.get("frequency_penalty", 0.0),
            kw.get("presence_penalty", 0.0), kw.get("logit_bias"))


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("temperature", [1.0, 0.0], ids=["sampled", "greedy"])
def test_joint_law_with_processors(case, temperature, backend, results, sizes):
    kw, dev = CASES[case], backend.device
    p_fn, sel = lattice.context_tables(f"procs-{case}", V, K)
    rk = _ref_kw(kw)

    tilt = 0.0 if temperature > 0 else -0.01 * np.arange(V)   # greedy: no exact ties (float32)

    def raw_fn(ctx):
        y = lattice.log_or_neg(np.asarray(p_fn(ctx), float)) + SHIFT + tilt
        return ref_procs.invert(y, PROMPT, ctx[len(PROMPT):], *rk)

    def ref_p(ctx):                # the target-only law: reference processing of the raw row
        return softmax(ref_procs.process_row(raw_fn(ctx), PROMPT, ctx[len(PROMPT):], *rk))

    def process(ctx, vlog, draft):
        pb = ProcBatch.build([SamplingParams(**kw)] * draft.shape[0],
                             [PROMPT] * draft.shape[0], V, dev)
        out = list(ctx[len(PROMPT):])
        if out:
            pb.commit_(torch.tensor([out] * draft.shape[0], device=dev),
                       torch.full((draft.shape[0],), len(out), device=dev))
        return pb.process(vlog, draft)

    lattice.check_processed_joint_law(
        backend, results, sizes, PROMPT, p_fn, sel, raw_fn, process, ref_p, temperature,
        "procs", f"procs-{case}-V{V}-g{sizes.l3_gamma}-L{sizes.l3_length}", "processors")


MIN_P = 0.4                       # cuts 1/4 next to 3/4, keeps 1/4 next to 1/2 (quarter tables)
CUT = 0.3                         # weight of each zero-probability token, × the row's max


@pytest.mark.parametrize("temperature", [1.0, 0.0], ids=["sampled", "greedy"])
def test_joint_law_with_min_p(temperature, backend, results, sizes):
    """min-p in verify (no state, but it reshapes every verify row's law): the raw rows give each
    zero of the quarter table a weight of CUT × the row's max, which min-p = MIN_P removes (with
    a 1/4 beside a 3/4), so the *processed* law is the lattice-exact quarter table; a verifier
    that skips min-p or applies it to some rows only samples from rows with 15–50 % of their
    mass elsewhere."""
    p_fn, sel = lattice.context_tables("procs-min_p", V, K)
    tilt = 0.0 if temperature > 0 else -0.01 * np.arange(V)

    def raw_fn(ctx):
        p = np.asarray(p_fn(ctx), float)
        return np.log(np.where(p > 0, p, CUT * p.max())) + tilt

    def ref_p(ctx):
        return ref_procs.apply_min_p(softmax(raw_fn(ctx)), MIN_P)

    lattice.check_processed_joint_law(
        backend, results, sizes, PROMPT, p_fn, sel, raw_fn, None, ref_p, temperature,
        "procs", f"procs-min_p-V{V}-g{sizes.l3_gamma}-L{sizes.l3_length}", "min-p", min_p=MIN_P)
