"""L4 watermark: a watermarked speculative step is distortion-free, and exactly the
float64 reference's keyed step.

* Law over keys (χ², detectable TV printed as L4 does): for many keys and contexts, one
  watermarked spec step (the backend's ``select`` → ``verify`` given the watermark's draw source
  ``KeyedDraws``, what the engine runs: the torch ops, or a kernel backend's keyed kernels) on
  fixed draft / target tables; the token a step emits at slot j, over the steps that reach slot
  j, has the target's law p_j (chain speculative sampling with independent keyed noise). T = 1,
  and T = 0.7 with top-p 0.95. Sharing one key between draft and target, or an acceptance coin
  that reuses the draft draw's value, biases it (fixture mutants). The Triton interpreter, one
  kernel program at a time, runs this law over the torch ops (``dflash2rt.ops`` given
  ``KeyedDraws``; reported as a metric) and its kernels only in the exactness check below.
* Exactness: each sample's accept length and tokens (the backend's step) equal the NumPy
  reference's keyed step (``reference.watermark``: keyed values, Gumbel-max argmin E / p, the
  coin rule coin · q(d) < p(d), in float64 over the float64 laws of the float32 tables: the
  runtime's float32 laws can only flip a decision within float32 rounding of a boundary, which
  these samples do not meet). 64 rows per key, 16 with ``--dflash2rt-small``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import zlib

import numpy as np
import pytest
import torch

from dflash2rt.backend import TRITON_INTERPRETER
from dflash2rt.ops import selector as ops_selector
from dflash2rt.ops import verify as ops_verify
from dflash2rt.ops.batch import BlockNoise, SamplingBatch
from dflash2rt.ops.selector import SelectorParams
from dflash2rt.watermark import WatermarkKey
from dflash2rt.watermark import generate as wmgen
from dflash2rt_conformance import stats
from dflash2rt_conformance.reference import watermark as ref
from dflash2rt_conformance.reference.sampling import target_probs
from dflash2rt_conformance.capability import skip_without_fp64

pytestmark = pytest.mark.dflash2rt_level("L4")

V, GAMMA, K, H = 6, 3, 4, 4
CASES = {"T1": (1.0, 1.0), "T0.7-topp0.95": (0.7, 0.95)}


def _tables(salt: str):
    g = np.random.default_rng(zlib.crc32(salt.encode()))
    return g.normal(0, 1.0, (GAMMA, V)), g.normal(0, 1.0, (GAMMA + 1, V))


def _triple(sub):
    return (sub.k0, sub.k1, sub.word)


def watermarked_step(backend, key: WatermarkKey, windows: np.ndarray, draft_logits, target_logits,
                     temp: float, top_p: float, torch_ops: bool = False,
                     record: np.ndarray | None = None, used: np.ndarray | None = None,
                     plain: bool = False):
    """One watermarked spec step per row (window [R, H] of tokens before the anchor's
    successor; the record of used contexts [R, M] with ``used`` [R] entries, default empty)
    → (accept_len [R], tokens [R, γ+1]) as NumPy; the backend's ``select`` / ``verify`` given
    the watermark's draw source (``KeyedDraws``), or with ``torch_ops`` the torch ops'
    (``dflash2rt.ops``) given it; ``plain``: the backend's ``select`` / ``verify`` given the
    ordinary noise (the same uniforms)."""
    dev = backend.device
    r = windows.shape[0]
    win = torch.tensor(windows, dtype=torch.int64, device=dev)
    rec = torch.zeros(r, 1, dtype=torch.int64) if record is None else torch.tensor(record)
    n_used = torch.zeros(r, dtype=torch.int64) if used is None else torch.tensor(used)
    wm = wmgen.WatermarkBatch(key, H, win, rec.to(dev), n_used.to(dev))
    sampling = SamplingBatch.build([temp] * r, [0] * r, [top_p] * r, dev)
    dl = torch.tensor(draft_logits, dtype=torch.float32, device=dev).expand(r, GAMMA, V)
    tl = torch.tensor(target_logits, dtype=torch.float32, device=dev).expand(r, GAMMA + 1, V)
    zero = torch.zeros(V, 0, device=dev)
    noise = BlockNoise.draw(torch.zeros(r, dtype=torch.int64, device=dev),
                            torch.arange(r, device=dev), torch.zeros(r, dtype=torch.int64,
                                                                      device=dev), GAMMA)
    args = (dl, torch.zeros(r, GAMMA, 0, device=dev), win[:, -1], zero, zero, SelectorParams(K),
            sampling)
    keyed = wmgen.KeyedDraws(wm, noise)
    if plain:
        sel = backend.select(*args, noise.walk)
        ver = backend.verify(tl, sel.draft, sel.candidates, sel.q, sampling, noise, False)
    elif torch_ops:
        sel = ops_selector.select(*args, keyed, backend.has_fp64)
        ver = ops_verify.verify(tl, sel.draft, sel.candidates, sel.q, sampling, keyed, False,
                                backend.has_fp64)
    else:
        sel = backend.select(*args, keyed)
        ver = backend.verify(tl, sel.draft, sel.candidates, sel.q, sampling, keyed, False)
    return ver.accept_len.cpu().numpy(), ver.tokens.cpu().numpy()


def reference_step(key: WatermarkKey, windows: np.ndarray, draft_logits, target_logits,
                   temp: float, top_p: float, coins: np.ndarray | None = None):
    """The float64 NumPy watermarked step (fresh contexts): walk by draw_sparse (A) over the
    top-K softmax, coin (C) · q(d) < p(d), residual / bonus by draw_dense (B). ``coins``
    [R, γ]: acceptance coins in place of the keyed ones (the lattice check)."""
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
            u = float(ref.coin(_triple(key.coin), c)[0]) if coins is None else coins[i, j]
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
    skip_without_fp64(backend)
    temp, top_p = CASES[case]
    draft_logits, target_logits = _tables("wm-" + case)
    quick = sizes.l4_samples is not None
    keys, rows = (12, 500) if quick else (64, 1000)
    alpha, power = 1e-3, 0.9
    torch_ops = backend.implementation.get("watermark") == TRITON_INTERPRETER
    results.metric("L4", f"watermark law {case} ran", "the torch ops (dflash2rt.ops given "
                   "KeyedDraws): the interpreter runs the kernels in watermark-exact" if torch_ops
                   else f"the backend's select / verify given KeyedDraws "
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
    skip_without_fp64(backend)
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


@contextlib.contextmanager
def injected_coins(coins: torch.Tensor):
    """Every ``Marks.noise`` (what ``KeyedDraws.verify_draws``, and so every backend's verify
    given the watermark's draw source, calls for the keyed acceptance coins) takes ``coins`` [R, γ] at its fresh slots instead of subkey C's values:
    the rest of the keyed step (walk, residual and bonus draws) is the backend's own."""
    keyed = wmgen.Marks.noise

    def noise(self, n):
        g = n.accept.shape[1]
        c = coins.to(device=n.accept.device, dtype=n.accept.dtype)
        return dataclasses.replace(n, accept=torch.where(self.fresh[:, :g], c, n.accept))

    wmgen.Marks.noise = noise
    try:
        yield
    finally:
        wmgen.Marks.noise = keyed


@pytest.mark.parametrize("case", list(CASES))
def test_keyed_acceptance_on_a_coin_lattice(case, backend, results, sizes):
    """The keyed acceptance, exactly, as L2 / L3 check the plain one: one context (so one keyed
    draft path and one keyed residual / bonus draw per slot), acceptance coins injected on the
    lattice (2k + 1) / 2N in every slot (all N^γ combinations). Each row's accept length and
    tokens equal the float64 reference's with the same coins, so the accept-length law over the
    lattice is the reference's exactly (TV 0); it differs from the analytic chain law
    Π α_j · (1 − α_a) (α_j = min(1, p_j(d_j) / q_j(d_j))) only by the lattice's resolution."""
    skip_without_fp64(backend)
    temp, top_p = CASES[case]
    # Tables (searched once over salts) whose lattice both accepts and rejects in every slot
    # in both cases: the target's logits are the draft's plus 1.5 × noise.
    draft_logits, target_logits = _tables("wm-lattice-38")
    target_logits[:GAMMA] = draft_logits + 1.5 * target_logits[:GAMMA]
    n = 8 if sizes.l4_samples is None else 4
    grid = (2 * np.arange(n) + 1) / (2 * n)                                 # exact in float32
    coins = np.array(list(itertools.product(grid, repeat=GAMMA)))         # [N^γ, γ]
    key = WatermarkKey(np.random.default_rng(7200).bytes(32))
    windows = np.repeat(_windows(300, 1), len(coins), 0)
    with injected_coins(torch.tensor(coins, dtype=torch.float32)):
        got = watermarked_step(backend, key, windows, draft_logits, target_logits, temp, top_p)
    want = reference_step(key, windows, draft_logits, target_logits, temp, top_p, coins)
    bad = np.flatnonzero((got[0] != want[0]) | (got[1] != want[1]).any(1))
    assert not len(bad), \
        f"[L4 watermark-lattice case={case}] coins {coins[bad[:3]].tolist()}: accept " \
        f"{got[0][bad[:3]].tolist()} vs the reference's {want[0][bad[:3]].tolist()}, tokens " \
        f"{got[1][bad[:3]].tolist()} vs {want[1][bad[:3]].tolist()}"
    for j in range(GAMMA):              # acceptance is a threshold in slot j's coin
        reach = got[0] >= j
        took, left = coins[reach & (got[0] > j), j], coins[reach & (got[0] == j), j]
        assert not (len(took) and len(left) and took.max() >= left.min()), \
            f"[L4 watermark-lattice case={case} slot={j}] coin {left.min()} rejected but " \
            f"coin {took.max()} accepted: not a rule coin · q(d) < p(d)"
    law = np.bincount(got[0], minlength=GAMMA + 1) / len(coins)
    ref_law = np.bincount(want[0], minlength=GAMMA + 1) / len(coins)
    summary = dict(rows=len(coins), lattice=n, accept_len_law=law.round(5).tolist(),
                   tv_vs_reference=float(0.5 * np.abs(law - ref_law).sum()),
                   implementation=backend.implementation.get("watermark"))
    results.metric("L4", f"watermark lattice {case}", summary)
    print(f"L4 watermark lattice {case}: {summary}")
    for j in range(GAMMA):
        assert (got[0] > j).any() and (got[0] == j).any(), \
            f"[L4 watermark-lattice case={case} slot={j}] the lattice never both accepts and " \
            f"rejects there (accept lengths {sorted(set(got[0].tolist()))}): it tests nothing"



def _every_context(window: np.ndarray) -> list[int]:
    """The context of every slot a step from ``window`` can reach, over every draft path (the
    drafts are ids < V): 1 + V + V² + V³ contexts."""
    out = []
    for j in range(GAMMA + 1):
        for path in itertools.product(range(V), repeat=j):
            out.append(int(ref.context_hash(np.array(list(window[j:]) + list(path))[None])[0]))
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_recorded_contexts_draw_with_the_ordinary_noise(case, backend, results, sizes):
    """Non-empty records. Rows whose record holds every context the step can reach draw every
    slot with the ordinary noise: exactly the backend's unwatermarked step. Rows whose record
    is as full but of another window's contexts, or holds this window's contexts only past its
    ``used`` count, are all fresh: exactly the keyed reference."""
    skip_without_fp64(backend)
    temp, top_p = CASES[case]
    draft_logits, target_logits = _tables("wm-" + case)
    rows = 24 if sizes.l4_samples is None else 9
    key = WatermarkKey(np.random.default_rng(7300).bytes(32))
    windows = _windows(400, rows)
    decoys = _windows(401, rows)
    n = len(_every_context(windows[0]))
    record = np.zeros((rows, 2 * n), np.int64)
    used = np.full(rows, n)
    kind = np.arange(rows) % 3                        # 0 recorded, 1 decoys, 2 past `used`
    for i in range(rows):
        mine, other = _every_context(windows[i]), _every_context(decoys[i])
        record[i] = (mine + other) if kind[i] == 0 else (other + mine)
        if kind[i] == 1:
            record[i, n:] = 0
    got = watermarked_step(backend, key, windows, draft_logits, target_logits, temp, top_p,
                           record=record, used=used)
    plain = watermarked_step(backend, key, windows, draft_logits, target_logits, temp, top_p,
                             plain=True)
    keyed = reference_step(key, windows, draft_logits, target_logits, temp, top_p)
    want = tuple(np.where((kind == 0).reshape((-1,) + (1,) * (a.ndim - 1)), a, b)
                 for a, b in zip(plain, keyed))
    bad = np.flatnonzero((got[0] != want[0]) | (got[1] != want[1]).any(1))
    assert not len(bad), \
        f"[L4 watermark-record case={case}] rows {bad[:5].tolist()} (kinds " \
        f"{kind[bad[:5]].tolist()}: 0 recorded, 1 decoys, 2 past used): accept " \
        f"{got[0][bad[:3]].tolist()} vs {want[0][bad[:3]].tolist()}"
    differs = int(((plain[1] != keyed[1]).any(1)).sum())
    assert differs, "the keyed and the ordinary noise give the same tokens: nothing is tested"
    results.metric("L4", f"watermark record {case}",
                   dict(rows=rows, record_entries=int(used[0]), keyed_vs_plain_differ=differs))
