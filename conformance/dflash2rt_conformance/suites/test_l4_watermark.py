"""L4 watermark (issue 17): a watermarked speculative step is distortion-free, and exactly the
float64 reference's keyed step.

* Law over keys (χ², detectable TV printed as L4 does): for many keys and contexts, one
  watermarked spec step (the backend's ``select_marked`` → ``verify_marked``, what the engine
  runs: the torch ops, or a kernel backend's keyed kernels) on fixed draft / target tables; the
  token a step emits at slot j, over the steps that reach slot j, has the target's law p_j
  (chain speculative sampling with independent keyed noise). T = 1, and T = 0.7 with top-p
  0.95. Sharing one key between draft and target, or an acceptance coin that reuses the draft
  draw's value, biases it (fixture mutants). The Triton interpreter, one kernel program at a
  time, runs this law over the torch ops (``watermark.generate``; reported as a metric) and its
  kernels only in the exactness check below.
* Exactness: each sample's accept length and tokens (the backend's step) equal the NumPy
  reference's keyed step (``reference.watermark``: keyed values, Gumbel-max argmin E / p, the
  coin rule coin · q(d) < p(d), in float64 over the float64 laws of the float32 tables: the
  runtime's float32 laws can only flip a decision within float32 rounding of a boundary, which
  these samples do not meet). 64 rows per key, 16 with ``--dflash2rt-small``.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch

from dflash2rt.backend import TRITON_INTERPRETER
from dflash2rt.ops.batch import BlockNoise, SamplingBatch
from dflash2rt.ops.selector import SelectorParams
from dflash2rt.watermark import WatermarkKey
from dflash2rt.watermark import generate as wmgen
from dflash2rt_conformance import stats
from dflash2rt_conformance.reference import watermark as ref
from dflash2rt_conformance.reference.sampling import target_probs

pytestmark = pytest.mark.dflash2rt_level("L4")

V, GAMMA, K, H = 6, 3, 4, 4
CASES = {"T1": (1.0, 1.0), "T0.7-topp0.95": (0.7, 0.95)}


def _tables(salt: str):
    g = np.random.default_rng(zlib.crc32(salt.encode()))
    return g.normal(0, 1.0, (GAMMA, V)), g.normal(0, 1.0, (GAMMA + 1, V))


def _triple(sub):
    return (sub.k0, sub.k1, sub.word)


def watermarked_step(backend, key: WatermarkKey, windows: np.ndarray, draft_logits, target_logits,
                     temp: float, top_p: float, torch_ops: bool = False):
    """One watermarked spec step per row (window [R, H] of tokens before the anchor's
    successor, all contexts fresh) → (accept_len [R], tokens [R, γ+1]) as NumPy; the backend's
    ``select_marked`` / ``verify_marked``, or with ``torch_ops`` ``watermark.generate``'s."""
    dev = backend.device
    r = windows.shape[0]
    win = torch.tensor(windows, dtype=torch.int64, device=dev)
    wm = wmgen.WatermarkBatch(key, H, win, torch.zeros(r, 1, dtype=torch.int64, device=dev),
                              torch.zeros(r, dtype=torch.int64, device=dev))
    sampling = SamplingBatch.build([temp] * r, [0] * r, [top_p] * r, dev)
    dl = torch.tensor(draft_logits, dtype=torch.float32, device=dev).expand(r, GAMMA, V)
    tl = torch.tensor(target_logits, dtype=torch.float32, device=dev).expand(r, GAMMA + 1, V)
    zero = torch.zeros(V, 0, device=dev)
    noise = BlockNoise.draw(torch.zeros(r, dtype=torch.int64, device=dev),
                            torch.arange(r, device=dev), torch.zeros(r, dtype=torch.int64,
                                                                      device=dev), GAMMA)
    args = (dl, torch.zeros(r, GAMMA, 0, device=dev), win[:, -1], zero, zero, SelectorParams(K),
            sampling, noise.walk)
    if torch_ops:
        sel = wmgen.select_marked(wm, *args, backend.has_fp64)
        ver = wmgen.verify_marked(wm, tl, sel, sampling, noise, backend.has_fp64)
    else:
        sel = backend.select_marked(wm, *args)
        ver = backend.verify_marked(wm, tl, sel, sampling, noise)
    return ver.accept_len.cpu().numpy(), ver.tokens.cpu().numpy()


def reference_step(key: WatermarkKey, windows: np.ndarray, draft_logits, target_logits,
                   temp: float, top_p: float):
    """The float64 NumPy watermarked step (fresh contexts): walk by draw_sparse (A) over the
    top-K softmax, coin (C) · q(d) < p(d), residual / bonus by draw_dense (B)."""
    t32, tp32 = float(np.float32(temp)), float(np.float32(top_p))
    p = target_probs(np.float32(target_logits).astype(np.float64)[None], np.array([t32]),
                     np.array([0]), np.array([tp32]))[0]                    # [γ+1, V]
    x = np.float32(draft_logits).astype(np.float64)
    cand = np.argsort(-x, axis=1, kind="stable")[:, :K]                     # [γ, K]
    vals = np.take_along_axis(x, cand, 1)
    q = np.exp((vals - vals.max(1, keepdims=True)) / t32)
    q = q / q.sum(1, keepdims=True)
    r = windows.shape[0]
    acc_out, tok_out = np.zeros(r, np.int64), np.full((r, GAMMA + 1), -1, np.int64)
    for i in range(r):
        seq = list(windows[i])
        for j in range(GAMMA + 1):
            c = ref.context_hash(np.array(seq[-H:])[None])
            if j == GAMMA:                                                 # bonus
                tok_out[i, j] = ref.draw_dense(_triple(key.target), c, p[j][None])[0]
                break
            pos = ref.draw_sparse(_triple(key.draft), c, cand[j][None], q[j][None])[0]
            d = int(cand[j, pos])
            u = float(ref.coin(_triple(key.coin), c)[0])
            if u * q[j, pos] < p[j, d]:
                tok_out[i, j] = d
                seq.append(d)
                acc_out[i] += 1
                continue
            dense = np.zeros(V)
            dense[cand[j]] = q[j]
            resid = np.clip(p[j] - dense, 0, None)
            law = resid if resid.sum() > 0 else p[j]
            tok_out[i, j] = ref.draw_dense(_triple(key.target), c, law[None])[0]
            break
    return acc_out, tok_out


def _windows(seed: int, r: int) -> np.ndarray:
    """Distinct contexts made of ids ≥ V, so no slot's context repeats another's."""
    return np.random.default_rng(seed).integers(V, 1_000_000, (r, H))


@pytest.mark.parametrize("case", list(CASES))
def test_watermarked_step_is_distortion_free(case, backend, results, sizes):
    if not backend.has_fp64:
        pytest.skip(f"backend {backend.name} has no float64 (the watermark raises there)")
    temp, top_p = CASES[case]
    draft_logits, target_logits = _tables("wm-" + case)
    quick = sizes.l4_samples is not None
    keys, rows = (12, 500) if quick else (64, 1000)
    alpha, power = 1e-3, 0.9
    torch_ops = backend.implementation.get("watermark") == TRITON_INTERPRETER
    results.metric("L4", f"watermark law {case} ran", "the torch ops (watermark.generate): the "
                   "interpreter runs the kernels in watermark-exact" if torch_ops else
                   f"the backend's select_marked / verify_marked "
                   f"({backend.implementation.get('watermark')})")
    counts = [dict() for _ in range(GAMMA + 1)]
    for k in range(keys):
        key = WatermarkKey(np.random.default_rng(7000 + k).bytes(32))
        acc, tok = watermarked_step(backend, key, _windows(k, rows), draft_logits,
                                    target_logits, temp, top_p, torch_ops)
        for j in range(GAMMA + 1):
            for t in tok[acc >= j, j]:
                counts[j][int(t)] = counts[j].get(int(t), 0) + 1
    p = target_probs(np.float32(target_logits).astype(np.float64)[None],
                     np.array([float(np.float32(temp))]), np.array([0]),
                     np.array([float(np.float32(top_p))]))[0]
    for j in range(GAMMA + 1):
        n = sum(counts[j].values())
        expected = {t: float(p[j, t]) for t in range(V) if p[j, t] > 0}
        stat, dof, pval = stats.chi2_test(counts[j], expected, n)
        tv_hat = 0.5 * sum(abs(counts[j].get(t, 0) / n - float(p[j, t])) for t in range(V))
        det = stats.detectable_tv(n, len(expected), alpha, power)
        summary = dict(slot=j, samples=n, chi2=round(float(stat), 3), dof=dof,
                       p_value=float(pval), tv_estimate=round(tv_hat, 5),
                       detectable_tv=round(det, 5), alpha=alpha, power=power)
        results.metric("L4", f"watermark law {case} slot {j}", summary)
        print(f"L4 watermark law {case}: {summary}")
        assert pval >= alpha, \
            f"[L4 watermark case={case} slot={j}] χ² = {stat:.2f} on {dof} dof, p = " \
            f"{pval:.3g} < {alpha} (n = {n}, detectable TV {det:.4f}, TV estimate " \
            f"{tv_hat:.4f}); observed {sorted(counts[j].items())} vs expected " \
            f"{[(t, round(v * n, 1)) for t, v in sorted(expected.items())]}"


@pytest.mark.parametrize("case", list(CASES))
def test_watermarked_step_equals_reference(case, backend, results, sizes):
    if not backend.has_fp64:
        pytest.skip(f"backend {backend.name} has no float64 (the watermark raises there)")
    temp, top_p = CASES[case]
    draft_logits, target_logits = _tables("wm-" + case)
    mismatched, rows = 0, 64 if sizes.l4_samples is None else 16
    for k in range(4):
        key = WatermarkKey(np.random.default_rng(7100 + k).bytes(32))
        windows = _windows(100 + k, rows)
        got = watermarked_step(backend, key, windows, draft_logits, target_logits, temp, top_p)
        want = reference_step(key, windows, draft_logits, target_logits, temp, top_p)
        bad = np.flatnonzero((got[0] != want[0]) | (got[1] != want[1]).any(1))
        mismatched += len(bad)
        assert not len(bad), \
            f"[L4 watermark-exact case={case}] rows {bad[:5].tolist()} differ from the float64 " \
            f"reference: accept {got[0][bad[:3]].tolist()} vs {want[0][bad[:3]].tolist()}, " \
            f"tokens {got[1][bad[:3]].tolist()} vs {want[1][bad[:3]].tolist()}"
    results.metric("L4", f"watermark exact {case}", dict(rows=4 * rows, mismatched=mismatched))
