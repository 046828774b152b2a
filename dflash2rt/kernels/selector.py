"""Selector kernel: the low-rank candidate lattice and the walk, one program per request.

Top-K and the bad-logits flags come from one kernel (``kernels.topk``), the unary scores from
``unary_scores`` (no op at all for the identity multiplier without softcap); the walk kernel
keeps the K candidates of a slot in registers, scores the lattice row of the previous pick, and
walks: greedy argmax (lowest index on ties) or inverse CDF of softmax((row - max row) / T), and
flags a request whose walk read a lattice row that is not a finite law. The sampled walk sums
in tl.float64, or (``FP64=False``, a device without float64) in double-float float32
(``kernels.exact32.inverse_cdf``, the formulation of ``ops.exact32.inverse_cdf32``).

A watermarked batch (``wm``) walks as ``watermark.generate.Walk``: at slot e a sampled row
hashes its window (the last H tokens of the committed window and the path so far); where that
context is fresh (not in the request's record ``record[:used]``, not an earlier slot's) the pick
is the Gumbel-max over the K candidates under subkey A (``kernels.watermark``), else the inverse
CDF pick; q stays the softmax law. A lattice row that is not a law gives the keyed draw -1
(pick 0, flagged), as the torch ops' NaN law does. The kernel is launched unfused
(``FP_FUSION``, the keyed float64 series must not contract into FMAs), watermarked or not, so
a watermark leaves the greedy rows' arithmetic as it is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from ..ops.batch import SamplingBatch
from ..watermark.sampler import require_fp64
from ..ops.selector import SelectorOut, SelectorParams, check_select_args, \
    unary_scores
from . import exact32
from .launch import bytes_of, launch
from .topk import topk
from .tuning import DEFAULT, Tuning
from .watermark import FP_FUSION, context_hash, exp_min_candidates, keyed_uniform, neg_log, \
    subkey_words

if TYPE_CHECKING:
    from ..watermark.generate import WatermarkBatch

# The walk's per-slot vectors (the path, the slots' contexts) are BLOCK_G lanes with the slots
# past γ masked: a tile covering every block the engine takes (adaptive: up to twice the draft's
# trained block) gives one binary for all of them.
GAMMA_TILE = 32


def block_g(gamma: int) -> int:
    """BLOCK_G for γ slots: ``GAMMA_TILE``, or the power of two covering a larger γ."""
    return max(GAMMA_TILE, triton.next_power_of_2(gamma))


@triton.jit
def _walk_context(win_ptr, path, e, H: tl.constexpr, BLOCK_H: tl.constexpr,
                  BLOCK_G: tl.constexpr):
    """The context hash at slot e: the last H tokens of (committed window win_ptr[:H], then
    the path's picks path[:e])."""
    hs = tl.arange(0, BLOCK_H)
    gs = tl.arange(0, BLOCK_G)
    at = e + hs                                                   # position in window ++ path
    old = tl.load(win_ptr + at, mask=(hs < H) & (at < H), other=0)
    new = tl.sum(tl.where(gs[None, :] == (at - H)[:, None], path[None, :], 0), 1)
    win = tl.where(at < H, old, new)
    return tl.sum(context_hash(win[None, :], H, BLOCK_H), 0)


@triton.jit
def _fresh(ctx, rec_ptr, used, M, ctxs, e, BLOCK_M: tl.constexpr, BLOCK_G: tl.constexpr):
    """ctx is neither one of the request's recorded contexts (rec_ptr[:used]) nor an earlier
    slot's (ctxs[:e])."""
    n = tl.minimum(used, M)
    hits = tl.sum(tl.where((tl.arange(0, BLOCK_G) < e) & (ctxs == ctx), 1, 0), 0)
    for m0 in range(0, n, BLOCK_M):
        ms = m0 + tl.arange(0, BLOCK_M)
        rec = tl.load(rec_ptr + ms, mask=ms < n, other=0)
        hits += tl.sum(tl.where((ms < n) & (rec == ctx), 1, 0), 0)
    return hits == 0


# GAMMA, the block's slot count, is a loop bound and an offset: one binary serves every block.
# The walk uniforms and the subkey words are read one value at a time, so their alignment (a
# row of a larger tensor, or not: a captured step reads the key words of a static input) would
# only make variants.
@triton.jit(do_not_specialize=["GAMMA"], do_not_specialize_on_alignment=["u_ptr", "sub_ptr"])
def _walk_kernel(cand_ptr, unary_ptr, proj_ptr, a_ptr, b_ptr, anchor_ptr, temp_ptr, greedy_ptr,
                 u_ptr, win_ptr, rec_ptr, used_ptr, sub_ptr, draft_ptr, q_ptr, badl_ptr, GAMMA,
                 K, RANK, M, SAMPLED: tl.constexpr, MARKED: tl.constexpr, FP64: tl.constexpr,
                 BLOCK_K: tl.constexpr, LOG_K: tl.constexpr, LEVELS_K: tl.constexpr,
                 BLOCK_R: tl.constexpr, H: tl.constexpr, BLOCK_H: tl.constexpr,
                 BLOCK_G: tl.constexpr, BLOCK_M: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    ks = tl.arange(0, BLOCK_K)
    rs = tl.arange(0, BLOCK_R)
    gs = tl.arange(0, BLOCK_G)
    kmask = ks < K
    rmask = rs < RANK
    prev = tl.load(anchor_ptr + r)
    greedy = tl.load(greedy_ptr + r) != 0
    temp = tl.load(temp_ptr + r)
    bad = 0
    path = tl.zeros([BLOCK_G], tl.int64)           # MARKED: the picks so far
    ctxs = tl.zeros([BLOCK_G], tl.int64)           # MARKED: the contexts of the slots so far
    for e in range(0, GAMMA):
        base = (r * GAMMA + e) * K
        c = tl.load(cand_ptr + base + ks, mask=kmask, other=0)
        row = tl.load(unary_ptr + base + ks, mask=kmask, other=-float("inf"))
        pair = tl.load(a_ptr + prev * RANK + rs, mask=rmask, other=0.0).to(tl.float32) * \
            tl.load(proj_ptr + (r * GAMMA + e) * RANK + rs, mask=rmask, other=0.0).to(tl.float32)
        succ = tl.load(b_ptr + c[:, None] * RANK + rs[None, :],
                       mask=kmask[:, None] & rmask[None, :], other=0.0).to(tl.float32)
        row = row + tl.sum(succ * pair[None, :], 1)
        row = tl.where(kmask, row, -float("inf"))
        # A row the walk reads must be a finite law: no NaN / +inf, at least one finite entry.
        nan_inf = tl.sum(tl.where(kmask & ((row != row) | (row == float("inf"))), 1, 0), 0)
        finite = tl.sum(tl.where(kmask & (row == row) & (tl.abs(row) < float("inf")), 1, 0), 0)
        row_bad = (nan_inf > 0) | (finite == 0)
        bad = tl.where(row_bad, 1, bad)
        row = tl.where(row_bad & kmask, 0.0, row)  # the walk goes on (flagged) without NaN
        idx = tl.argmax(row, 0, tie_break_left=True)
        q = tl.where(ks == idx, 1.0, 0.0)
        if SAMPLED:
            x = (row - tl.max(row, 0)) / tl.where(greedy, 1.0, temp)   # ≤ 0: cannot overflow
            ex = tl.exp(x - tl.max(x, 0))
            qs = ex / tl.sum(ex, 0)
            u = tl.load(u_ptr + r * GAMMA + e)
            if FP64:
                cdf = tl.cumsum(qs.to(tl.float64), 0)
                total = tl.sum(qs.to(tl.float64), 0)
                idx_s = tl.sum(tl.where((cdf <= u.to(tl.float64) * total) & kmask, 1, 0), 0)
                idx_s = tl.minimum(idx_s, tl.max(tl.where(qs > 0, ks, -1), 0))
                law = (total > 0) & (total < float("inf"))           # False for NaN
            else:
                idx_s = exact32.inverse_cdf(qs, u, K, BLOCK_K, LOG_K, LEVELS_K)   # -1: no law
                law = idx_s >= 0
            bad = tl.where(greedy | law, bad, 1)
            idx = tl.where(greedy, idx, tl.where(law, idx_s, 0))
            q = tl.where(greedy, q, qs)
            if MARKED:                               # watermark.generate.Walk.pick
                if tl.load(greedy_ptr + r) == 0:
                    ctx = _walk_context(win_ptr + r * H, path, e, H, BLOCK_H, BLOCK_G)
                    if _fresh(ctx, rec_ptr + r * M, tl.load(used_ptr + r), M, ctxs, e,
                              BLOCK_M, BLOCK_G):
                        law_k = tl.where(row_bad, float("nan"), qs.to(tl.float64))  # as torch
                        drawn = exp_min_candidates(law_k, c,
                                                   neg_log(keyed_uniform(ctx, c, sub_ptr)),
                                                   kmask)
                        idx = tl.maximum(drawn, 0)
                        bad = tl.where(drawn < 0, 1, bad)
                    ctxs = tl.where(gs == e, ctx, ctxs)
        tl.store(q_ptr + base + ks, q, mask=kmask)
        prev = tl.sum(tl.where(ks == idx, c, 0), 0)
        tl.store(draft_ptr + r * GAMMA + e, prev)
        path = tl.where(gs == e, prev, path)
    tl.store(badl_ptr + r, bad)


def select(logits: torch.Tensor, proj: torch.Tensor, anchor: torch.Tensor,
           pred_codebook: torch.Tensor, succ_codebook: torch.Tensor, params: SelectorParams,
           sampling: SamplingBatch, u_walk: torch.Tensor, tuning: Tuning = DEFAULT,
           wm: WatermarkBatch | None = None, has_fp64: bool = True) -> SelectorOut:
    """Kernel version of ``dflash2rt.ops.selector.select`` (same contract and outputs). ``wm``
    (a watermarked batch): the sampled rows walk with ``watermark.generate.Walk``'s keyed
    draw (subkey A at the path's contexts, fresh ones only), reading wm's window / record.
    ``has_fp64`` False: the sampled walk draws in the float32 formulation; no watermark."""
    if wm is not None and not has_fp64:
        require_fp64(False)
    r, gamma, _ = logits.shape
    check_select_args(logits, proj, pred_codebook, succ_codebook, params, u_walk)
    vals, cand, bad = topk(logits, params.top_k)                          # [R, γ, K]
    unary = unary_scores(vals, params).contiguous()
    k, rank = params.top_k, proj.shape[2]
    draft = torch.empty(r, gamma, dtype=torch.int64, device=logits.device)
    q = torch.empty(r, gamma, k, dtype=torch.float32, device=logits.device)
    bad_lattice = torch.empty(r, dtype=torch.int8, device=logits.device)
    marked = wm is not None and sampling.any_sampled
    keyed = (wm.window.contiguous(), wm.record.contiguous(), wm.used.contiguous(),
             subkey_words(wm.key.draft, logits.device)) if marked else (draft,) * 4
    h, m = (wm.width, wm.record.shape[1]) if marked else (1, 1)
    launch(_walk_kernel, (r,), cand.contiguous(), unary, proj.contiguous(),
           pred_codebook.contiguous(), succ_codebook.contiguous(),
           anchor.to(torch.int64).contiguous(), sampling.temperature.contiguous(),
           bytes_of(sampling.greedy), u_walk.contiguous(), *keyed, draft, q, bad_lattice,
           gamma, k, rank, m, SAMPLED=sampling.any_sampled, MARKED=marked, FP64=has_fp64,
           BLOCK_K=triton.next_power_of_2(k), LOG_K=triton.next_power_of_2(k).bit_length() - 1,
           LEVELS_K=exact32.levels_for(triton.next_power_of_2(k).bit_length() - 1),
           BLOCK_R=max(triton.next_power_of_2(rank), 1), H=h,
           BLOCK_H=triton.next_power_of_2(h), BLOCK_G=block_g(gamma),
           BLOCK_M=min(256, triton.next_power_of_2(m)), num_warps=tuning.num_warps,
           **FP_FUSION)
    return SelectorOut(draft, cand, q, bad.any(dim=-1), bad_lattice.view(torch.bool))
