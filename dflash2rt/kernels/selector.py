"""Selector kernel: the low-rank candidate lattice and the walk, one program per request.

Top-K and the unary scores come from torch (``topk_lowest_index``, ``unary_scores``); the kernel
keeps the K candidates of a slot in registers, scores the lattice row of the previous pick, and
walks: greedy argmax (lowest index on ties) or inverse CDF of softmax((row - max row) / T), and
flags a request whose walk read a lattice row that is not a finite law. The sampled walk sums
in tl.float64; on a device without float64 ``KernelBackend`` uses the float32 torch ops.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..ops.batch import SamplingBatch
from ..ops.sampling import bad_rows
from ..ops.selector import SelectorOut, SelectorParams, check_select_args, topk_lowest_index, \
    unary_scores
from .tuning import DEFAULT, Tuning


@triton.jit
def _walk_kernel(cand_ptr, unary_ptr, proj_ptr, a_ptr, b_ptr, anchor_ptr, temp_ptr, greedy_ptr,
                 u_ptr, draft_ptr, q_ptr, badl_ptr, GAMMA, K, RANK, SAMPLED: tl.constexpr,
                 BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr):
    r = tl.program_id(0)
    ks = tl.arange(0, BLOCK_K)
    rs = tl.arange(0, BLOCK_R)
    kmask = ks < K
    rmask = rs < RANK
    prev = tl.load(anchor_ptr + r)
    greedy = tl.load(greedy_ptr + r) != 0
    temp = tl.load(temp_ptr + r)
    bad = 0
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
            cdf = tl.cumsum(qs.to(tl.float64), 0)
            total = tl.sum(qs.to(tl.float64), 0)
            target = tl.load(u_ptr + r * GAMMA + e).to(tl.float64) * total
            idx_s = tl.sum(tl.where((cdf <= target) & kmask, 1, 0), 0)
            idx_s = tl.minimum(idx_s, tl.max(tl.where(qs > 0, ks, -1), 0))
            law = (total > 0) & (total < float("inf"))               # False for NaN
            bad = tl.where(greedy | law, bad, 1)
            idx = tl.where(greedy, idx, tl.where(law, idx_s, 0))
            q = tl.where(greedy, q, qs)
        tl.store(q_ptr + base + ks, q, mask=kmask)
        prev = tl.sum(tl.where(ks == idx, c, 0), 0)
        tl.store(draft_ptr + r * GAMMA + e, prev)
    tl.store(badl_ptr + r, bad)


def select(logits: torch.Tensor, proj: torch.Tensor, anchor: torch.Tensor,
           pred_codebook: torch.Tensor, succ_codebook: torch.Tensor, params: SelectorParams,
           sampling: SamplingBatch, u_walk: torch.Tensor, tuning: Tuning = DEFAULT
           ) -> SelectorOut:
    """Kernel version of ``dflash2rt.ops.selector.select`` (same contract and outputs)."""
    r, gamma, _ = logits.shape
    check_select_args(logits, proj, pred_codebook, succ_codebook, params, u_walk)
    vals, cand = topk_lowest_index(logits, params.top_k)                  # [R, γ, K]
    unary = unary_scores(vals, params).contiguous()
    k, rank = params.top_k, proj.shape[2]
    draft = torch.empty(r, gamma, dtype=torch.int64, device=logits.device)
    q = torch.empty(r, gamma, k, dtype=torch.float32, device=logits.device)
    bad_lattice = torch.empty(r, dtype=torch.int32, device=logits.device)
    _walk_kernel[(r,)](cand.contiguous(), unary, proj.contiguous(), pred_codebook.contiguous(),
                       succ_codebook.contiguous(), anchor.to(torch.int64).contiguous(),
                       sampling.temperature.contiguous(), sampling.greedy.to(torch.int8),
                       u_walk.contiguous(), draft, q, bad_lattice, gamma, k, rank,
                       SAMPLED=sampling.any_sampled, BLOCK_K=triton.next_power_of_2(k),
                       BLOCK_R=max(triton.next_power_of_2(rank), 1),
                       num_warps=tuning.num_warps)
    return SelectorOut(draft, cand, q, bad_rows(logits).any(dim=-1), bad_lattice.bool())
