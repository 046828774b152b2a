"""Verification kernel: greedy accept + bonus, and chain speculative sampling with sparse q.

One program per request. Greedy rows scan the logits for per-row argmaxes (lowest index on ties).
Sampled rows decide u·q(d) < p(d) in float64, then scan the vocabulary twice in chunks for the
residual norm((p − q)+) (or p when that mass is 0, or p_γ for the bonus): once for its mass, once
for the inverse CDF; a row with no finite positive mass emits -1 and is flagged. Logit
processing (temperature, top-k, top-p) stays in torch (``p`` input). On a device without float64
``KernelBackend`` runs sampled batches through the float32 torch ops instead (``ops.exact32``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..ops.batch import BlockNoise, SamplingBatch
from ..ops.sampling import bad_rows, target_probs
from ..ops.verify import VerifyOut, assemble_tokens, check_verify_args, with_empty_draws
from .tuning import DEFAULT, Tuning


@triton.jit
def _argmax_row(ptr, V, BLOCK_V: tl.constexpr):
    """(max, lowest index of the max) of one row of V logits, scanning chunks."""
    best = -float("inf")
    best_i = 0
    for start in range(0, V, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        x = tl.load(ptr + offs, mask=offs < V, other=-float("inf")).to(tl.float32)
        m = tl.max(x, 0)
        i = tl.argmax(x, 0, tie_break_left=True) + start
        take = (m > best) | ((start == 0) & (m >= best))
        best_i = tl.where(take, i, best_i)
        best = tl.where(take, m, best)
    return best_i


@triton.jit
def _verify_kernel(logits_ptr, p_ptr, draft_ptr, cand_ptr, q_ptr, greedy_ptr, ua_ptr, ur_ptr,
                   ub_ptr, acc_ptr, emit_ptr, badq_ptr, V, GAMMA, K,
                   SAMPLED: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr):
    r = tl.program_id(0)
    rows = GAMMA + 1
    # Greedy: longest prefix with d_j == argmax_j, then the argmax at the first mismatch.
    g_acc = 0
    g_alive = 1
    g_emit = 0
    for j in range(0, rows):
        am = _argmax_row(logits_ptr + (r * rows + j) * V, V, BLOCK_V)
        d = tl.load(draft_ptr + r * GAMMA + tl.minimum(j, GAMMA - 1))
        stop = (g_alive == 1) & ((j == GAMMA) | (d != am))
        g_emit = tl.where(stop, am, g_emit)
        g_alive = tl.where(stop, 0, g_alive)
        g_acc += tl.where(g_alive == 1, 1, 0)
    acc, emit, bad_q = g_acc, g_emit, 0
    if SAMPLED:
        ks = tl.arange(0, BLOCK_K)
        kmask = ks < K
        s_acc = 0
        alive = 1
        for j in range(0, GAMMA):
            d = tl.load(draft_ptr + r * GAMMA + j)
            c = tl.load(cand_ptr + (r * GAMMA + j) * K + ks, mask=kmask, other=-1)
            qk = tl.load(q_ptr + (r * GAMMA + j) * K + ks, mask=kmask, other=0.0).to(tl.float64)
            q_d = tl.sum(tl.where(c == d, qk, 0.0), 0)
            p_d = tl.load(p_ptr + (r * rows + j) * V + d).to(tl.float64)
            u = tl.load(ua_ptr + r * GAMMA + j).to(tl.float64)
            q_broken = tl.sum(tl.where(kmask & ((qk != qk) | (qk < 0) | (qk == float("inf"))),
                                       1, 0), 0)
            bad_q = tl.where((q_d > 0.0) & (q_broken == 0), bad_q, 1)    # NaN q_d: broken
            alive = tl.where((u * q_d < p_d) & (alive == 1), 1, 0)
            s_acc += alive
        slot = tl.minimum(s_acc, GAMMA - 1)
        rejected = s_acc < GAMMA
        rej_k = (tl.zeros([BLOCK_K], dtype=tl.int32) + s_acc) < GAMMA   # q is empty at row γ
        c = tl.load(cand_ptr + (r * GAMMA + slot) * K + ks, mask=kmask & rej_k, other=-1)
        qk = tl.load(q_ptr + (r * GAMMA + slot) * K + ks, mask=kmask, other=0.0).to(tl.float64)
        prow = p_ptr + (r * rows + s_acc) * V
        mass = tl.full([], 0.0, tl.float64)          # loop-carried: fp64 from the start
        last_r = -1
        last_p = -1
        for start in range(0, V, BLOCK_V):           # pass 1: residual mass, last positives
            offs = start + tl.arange(0, BLOCK_V)
            p = tl.load(prow + offs, mask=offs < V, other=0.0).to(tl.float64)
            qd = tl.sum(tl.where(offs[:, None] == c[None, :], qk[None, :], 0.0), 1)
            w = tl.maximum(p - qd, 0.0)
            mass += tl.sum(w, 0)
            last_r = tl.maximum(last_r, tl.max(tl.where(w > 0, offs, -1), 0))
            last_p = tl.maximum(last_p, tl.max(tl.where(p > 0, offs, -1), 0))
        use_p = mass <= 0.0
        u = tl.where(rejected, tl.load(ur_ptr + r * GAMMA + slot),
                     tl.load(ub_ptr + r)).to(tl.float64)
        total = tl.full([], 0.0, tl.float64)
        for start in range(0, V, BLOCK_V):           # total of the chosen weights
            offs = start + tl.arange(0, BLOCK_V)
            p = tl.load(prow + offs, mask=offs < V, other=0.0).to(tl.float64)
            qd = tl.sum(tl.where(offs[:, None] == c[None, :], qk[None, :], 0.0), 1)
            total += tl.sum(tl.where(use_p, p, tl.maximum(p - qd, 0.0)), 0)
        target = u * total
        carry = tl.full([], 0.0, tl.float64)
        count = 0
        for start in range(0, V, BLOCK_V):           # pass 2: inverse CDF
            offs = start + tl.arange(0, BLOCK_V)
            p = tl.load(prow + offs, mask=offs < V, other=0.0).to(tl.float64)
            qd = tl.sum(tl.where(offs[:, None] == c[None, :], qk[None, :], 0.0), 1)
            w = tl.where(use_p, p, tl.maximum(p - qd, 0.0))
            cdf = tl.cumsum(w, 0) + carry
            count += tl.sum(tl.where((cdf <= target) & (offs < V), 1, 0), 0)
            carry += tl.sum(w, 0)
        s_emit = tl.minimum(count, tl.where(use_p, last_p, last_r))
        s_emit = tl.where((total > 0.0) & (total < float("inf")), s_emit, -1)   # not a law
        greedy = tl.load(greedy_ptr + r) != 0
        acc = tl.where(greedy, g_acc, s_acc)
        emit = tl.where(greedy, g_emit, s_emit)
        bad_q = tl.where(greedy, 0, bad_q)
    tl.store(acc_ptr + r, acc)
    tl.store(emit_ptr + r, emit)
    tl.store(badq_ptr + r, bad_q)


def verify(logits: torch.Tensor, draft: torch.Tensor, candidates: torch.Tensor, q: torch.Tensor,
           sampling: SamplingBatch, noise: BlockNoise, check: bool = True,
           tuning: Tuning = DEFAULT) -> VerifyOut:
    """Kernel version of ``dflash2rt.ops.verify.verify`` (same contract and outputs)."""
    r, rows, v = check_verify_args(logits, draft, candidates, q)
    k = candidates.shape[2]
    logits, draft, candidates = logits.contiguous(), draft.contiguous(), candidates.contiguous()
    p = (target_probs(logits, sampling.temperature, sampling.top_k, sampling.top_p,
                      top_k_max=sampling.top_k_max, top_p_rows=sampling.top_p_rows).contiguous()
         if sampling.any_sampled else logits)
    acc = torch.empty(r, dtype=torch.int64, device=logits.device)
    emit = torch.empty_like(acc)
    bad_q = torch.empty(r, dtype=torch.int32, device=logits.device)
    _verify_kernel[(r,)](logits, p, draft, candidates, q.contiguous(),
                         sampling.greedy.to(torch.int8), noise.accept.contiguous(),
                         noise.residual.contiguous(), noise.bonus.contiguous(), acc, emit, bad_q,
                         v, rows - 1, k, SAMPLED=sampling.any_sampled,
                         BLOCK_V=min(tuning.block_v, triton.next_power_of_2(v)),
                         BLOCK_K=triton.next_power_of_2(k), num_warps=tuning.num_warps)
    bad_q = bad_q.bool()
    bad = with_empty_draws(bad_rows(logits).any(dim=1), sampling.greedy, bad_q, emit)
    out = VerifyOut(acc, assemble_tokens(draft, acc, emit), bad, bad_q)
    if check:
        out.raise_if_bad()
    return out
