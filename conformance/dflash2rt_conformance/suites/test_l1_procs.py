"""L1: logit processors (bias, repetition / frequency / presence penalties, min-p) of the
runtime (``dflash2rt.ops.procs``, applied by the engine before the backend's verify) vs the
float64 reference (``reference.procs``), at block boundaries: verify row j must use the counts
after the block's first j drafts. The greedy cases are built so that row j accepts d_{j+1} only
if d_j (and the anchor, at row 0) is already penalized: a runtime that uses the pre-block
counts, or row 0's processing on every row, rejects early."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dflash2rt.engine.request import SamplingParams
from dflash2rt.ops import procs as ops_procs
from dflash2rt.ops.batch import BlockNoise, SamplingBatch
from dflash2rt.ops.sampling import target_probs
from dflash2rt_conformance.reference import procs as ref_procs
from dflash2rt_conformance.reference import sampling as ref_sampling

pytestmark = pytest.mark.dflash2rt_level("L1")

V, GAMMA = 37, 4
PROMPT = (3, 4)
COMMITTED = (9, 9, 11)                    # output so far; the anchor is 11
ANCHOR = COMMITTED[-1]
DRAFT = (20, 21, 22, 23)
CASES = {                                 # name: SamplingParams fields
    "frequency": dict(frequency_penalty=1.0),
    "presence": dict(presence_penalty=1.0),
    "repetition": dict(repetition_penalty=2.0),
    "bias_and_frequency": dict(frequency_penalty=1.5, logit_bias={22: 0.25, 5: -3.0}),
}


def _batch(params: SamplingParams, dev) -> ops_procs.ProcBatch:
    pb = ops_procs.ProcBatch.build([params], [PROMPT], V, dev)
    pb.commit_(torch.tensor([COMMITTED], device=dev), torch.tensor([len(COMMITTED)], device=dev))
    return pb


def _boundary_logits() -> np.ndarray:
    """Row j: the next draft d_{j+1} (the bonus token 30 at row γ) at 5.0, the previous token
    (anchor at row 0, d_j after) at 5.2 — it wins unless its count includes row j's prefix."""
    x = np.random.default_rng(7).uniform(-2.0, 1.0, (GAMMA + 1, V))
    for j in range(GAMMA + 1):
        x[j, DRAFT[j] if j < GAMMA else 30] = 5.0
        x[j, ANCHOR if j == 0 else DRAFT[j - 1]] = 5.2
    return x


def _reference(raw: np.ndarray, kw: dict) -> np.ndarray:
    out = []
    for j in range(raw.shape[0]):
        out.append(ref_procs.process_row(
            raw[j], PROMPT, COMMITTED + DRAFT[:j], kw.get("repetition_penalty", 1.0),
            kw.get("frequency_penalty", 0.0), kw.get("presence_penalty", 0.0),
            kw.get("logit_bias")))
    return np.stack(out)


@pytest.mark.parametrize("case", list(CASES))
def test_procs_rows_at_block_boundaries(case, backend, results):
    kw, dev = CASES[case], backend.device
    raw = _boundary_logits()
    want = _reference(raw, kw)
    pb = _batch(SamplingParams(**kw), dev)
    draft = torch.tensor([DRAFT], device=dev)
    got = pb.process(torch.tensor(raw[None], dtype=torch.float32, device=dev), draft)[0]
    err = float(np.max(np.abs(got.double().cpu().numpy() - want)))
    results.metric("L1", f"procs rows {case} max |err|", err)
    assert err <= 1e-5, f"[L1 procs case={case}] processed rows differ from the reference " \
                        f"by {err:.3g}; rows {np.argwhere(np.abs(got.cpu().numpy() - want) > 1e-5)[:5, 0].tolist()}"
    sampling = SamplingBatch.greedy_batch(1, dev)
    cand = draft.unsqueeze(-1)
    ver = backend.verify(got[None], draft, cand, torch.ones(1, GAMMA, 1, device=dev), sampling,
                         BlockNoise.unused(1, GAMMA, dev))
    want_tokens = [int(np.flatnonzero(r == r.max())[0]) for r in want]
    acc = next((j for j in range(GAMMA) if want_tokens[j] != DRAFT[j]), GAMMA)
    expect = list(DRAFT[:acc]) + [want_tokens[acc]]
    tokens = [t for t in ver.tokens[0].tolist() if t >= 0]
    assert acc == GAMMA, f"[L1 procs case={case}] the case does not reach the block's end"
    assert tokens == expect, f"[L1 procs case={case}] greedy verify over processed rows " \
                             f"emitted {tokens}, the reference {expect} (row j must be " \
                             "processed with the counts after d_1..d_j)"


@pytest.mark.parametrize("min_p", [0.05, 0.3, 0.9])
def test_min_p_law(min_p, backend, results):
    """target_probs with min-p (after temperature, top-k, top-p) vs the reference."""
    dev = backend.device
    raw = np.random.default_rng(11).normal(0, 2.0, (3, 2, V))
    temp, top_k, top_p = np.array([0.7, 1.0, 1.3]), np.array([0, 5, 0]), np.array([1.0, 1.0, 0.8])
    want = ref_sampling.target_probs(raw, temp, top_k, top_p, np.full(3, min_p))
    got = target_probs(torch.tensor(raw, dtype=torch.float32, device=dev),
                       torch.tensor(temp, dtype=torch.float32, device=dev),
                       torch.tensor(top_k, device=dev),
                       torch.tensor(top_p, dtype=torch.float32, device=dev),
                       min_p=torch.full((3,), min_p, device=dev)).double().cpu().numpy()
    err = float(np.max(np.abs(got - want)))
    results.metric("L1", f"min_p={min_p} max |err|", err)
    assert err <= 1e-5, f"[L1 min_p case=min_p_{min_p}] law differs from the reference by {err:.3g}"
    assert ((got > 0) == (want > 0)).all(), f"[L1 min_p case=min_p_{min_p}] support differs"


LOGPROB_CASES = {                 # name: (SamplingParams fields, temperature, top_k, top_p)
    "plain_t1": (dict(), 1.0, 0, 1.0),
    "frequency_t07_top_p": (dict(frequency_penalty=1.0), 0.7, 0, 0.9),
    "bias_repetition_min_p": (dict(repetition_penalty=1.8, logit_bias={30: 1.5}, min_p=0.05),
                              1.3, 12, 1.0),
    "greedy_presence": (dict(presence_penalty=0.8), 0.0, 0, 1.0),
}
N_TOP = 3


@pytest.mark.parametrize("case", list(LOGPROB_CASES))
def test_logprobs_at_block_boundaries(case, backend, results):
    """``logprobs``: each verify row's token log-probability and top-n alternatives under the
    final law (processors with the counts after d_1..d_j, then temperature / top-k / top-p /
    min-p; greedy rows at temperature 1) vs the float64 reference, through the int64 packing
    the step's one transfer carries (``token_logprobs`` / ``unpack_logprobs``)."""
    kw, temp, top_k, top_p = LOGPROB_CASES[case]
    dev = backend.device
    raw = np.random.default_rng(13).normal(0.0, 2.0, (GAMMA + 1, V))
    tokens = list(DRAFT) + [30]                                 # row j's emitted candidate
    want_rows = _reference(raw, kw)
    t_ref = temp if temp > 0 else 1.0
    want_p = ref_sampling.target_probs(want_rows[None], np.array([t_ref]), np.array([top_k]),
                                       np.array([top_p]), np.array([kw.get("min_p", 0.0)]))[0]
    with np.errstate(divide="ignore"):
        want_lp = np.log(want_p)                                # −inf where p = 0
    params = SamplingParams(**kw, temperature=temp, top_k=top_k, top_p=top_p, logprobs=N_TOP)
    pb = _batch(params, dev)
    draft = torch.tensor([DRAFT], device=dev)
    processed = pb.process(torch.tensor(raw[None], dtype=torch.float32, device=dev), draft)
    sampling = SamplingBatch.build([temp], [top_k], [top_p], dev, [kw.get("min_p", 0.0)])
    packed = ops_procs.token_logprobs(processed, sampling,
                                      torch.tensor([tokens], device=dev), N_TOP)
    got = ops_procs.unpack_logprobs(packed[0].tolist(), GAMMA + 1, N_TOP, N_TOP)
    err = 0.0
    for j, (own, top) in enumerate(got):
        want_own = want_lp[j, tokens[j]]
        head = f"[L1 logprobs case={case}] row {j}"
        if np.isneginf(want_own):
            assert np.isneginf(own), f"{head}: token {tokens[j]} has p = 0, got log-prob {own}"
        else:
            err = max(err, abs(own - want_own))
        order = [int(i) for i in np.argsort(-want_lp[j], kind="stable")[:N_TOP]
                 if np.isfinite(want_lp[j, i])]               # p = 0 alternatives: any id
        finite = sorted(i for i, v in top.items() if np.isfinite(v))
        assert finite == sorted(order) and len(top) == N_TOP, \
            f"{head}: top-{N_TOP} ids {sorted(top)}, the reference {sorted(order)}"
        err = max(err, max(abs(top[i] - want_lp[j, i]) for i in order))
    results.metric("L1", f"logprobs {case} max |err|", err)
    assert err <= 1e-4, f"[L1 logprobs case={case}] log-probabilities differ from the " \
                        f"reference by {err:.3g}"
