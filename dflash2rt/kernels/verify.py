"""Verification kernel: greedy accept + bonus, and chain speculative sampling with sparse q.

One program per request, branching on its greedy flag. Greedy rows scan the logits of each row up
to the first mismatch for its argmax (lowest index on ties), in chunks of ``block_v`` with
per-lane running maxima and one reduction per row. Sampled rows decide u·q(d) < p(d) in float64,
then scan the one emitting row of p twice in chunks for the residual norm((p − q)+) (or p when
that mass is 0, or p_γ for the bonus): once for its mass and p's (per-lane sums), once for the
inverse CDF; a row with no finite positive mass emits -1 and is flagged. Nothing is sized by V
but the loop bounds: V = 151,936 or 202,048 is a loop of chunks. Logit
processing (temperature, top-k, top-p) stays in torch (``p`` input), as does each row's maximum
(one reduction over the GPU, not one program's scan): the kernel writes the step's tokens
(``assemble_tokens``) and its bad flags (``bad_rows``, ``with_empty_draws``) from it. On a
device without float64
the kernel is compiled with ``FP64=False``: acceptance decided exactly from the float32 bits and
the emitting draw in double-float float32 (``kernels.exact32``, the formulation of
``ops.exact32``), so no float64 value is in its code. Offsets are 64-bit (rows × V passes 2^31
at a few hundred requests with a 200k vocabulary).

A watermarked batch (``marks``: ``Marks.ctx`` / ``fresh`` [R, γ+1], computed in torch, and the
keyed coins already in ``noise.accept``): a sampled row whose emitting slot is fresh scans its
emitting row once more for the Gumbel-max under subkey B at that slot's context
(``Marks.emit``: argmin E / w in float64 over the residual or p, lowest id on ties, w = 0 never,
-1 when not a law). The kernel is launched unfused (``FP_FUSION``), watermarked or not.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from ..errors import InvalidInputError
from ..ops.batch import BlockNoise, SamplingBatch
from ..ops.sampling import target_probs
from ..ops.verify import VerifyOut, check_verify_args
from ..watermark.sampler import require_fp64
from . import exact32
from .launch import bytes_of, launch
from .tuning import DEFAULT, Tuning
from .watermark import FP_FUSION, keyed_uniform, neg_log, race_key, subkey_words

if TYPE_CHECKING:
    from ..watermark.generate import Marks


@triton.jit
def _argmax_row(ptr, V, BLOCK_V: tl.constexpr):
    """Lowest index of the maximum of one row of V logits. Each lane keeps its running best
    across chunks (strict >: the earlier chunk, a lower index, keeps a tie), and one reduction
    at the end takes the lowest index among the lanes holding the maximum."""
    lanes = tl.arange(0, BLOCK_V)
    best = tl.full([BLOCK_V], -float("inf"), tl.float32)
    best_i = lanes
    for start in range(0, V, BLOCK_V):
        offs = start + lanes
        x = tl.load(ptr + offs, mask=offs < V, other=-float("inf")).to(tl.float32)
        take = x > best
        best_i = tl.where(take, offs, best_i)
        best = tl.where(take, x, best)
    top = tl.max(best, 0)
    return tl.min(tl.where(best == top, best_i, V + BLOCK_V), 0)


@triton.jit
def _argmin_lane(key, offs, best, at):
    """Per-lane running argmin across chunks (strict <: an earlier chunk, a lower id, keeps a
    tie) → (best, at)."""
    take = key < best
    return tl.where(take, key, best), tl.where(take, offs, at)


@triton.jit
def _lowest_argmin(best, at, V, BLOCK_V: tl.constexpr):
    return tl.min(tl.where(best == tl.min(best, 0), at, V + BLOCK_V), 0)


@triton.jit
def _q_on(offs, cand_row, q_row, n):
    """q's float64 mass on each id of ``offs``: Σ_k q_k [cand_k = id] over the row's first n
    candidates, one candidate at a time (a [BLOCK_V, BLOCK_K] tile instead makes the kernel's
    code and its compile several times larger). Candidates are distinct (top-K ids), so an id
    gets at most one term: the same value as any summation order."""
    qd = tl.zeros_like(offs).to(tl.float64)
    for k in range(0, n):
        qd += tl.where(offs == tl.load(cand_row + k), tl.load(q_row + k).to(tl.float64), 0.0)
    return qd


@triton.jit
def _keyed_emit(prow, cand_row, q_row, n, ctx, sub_ptr, V, BLOCK_V: tl.constexpr):
    """``watermark.generate.Marks.emit`` over ``ops.verify``'s emitting law: the Gumbel-max
    token (subkey words at sub_ptr, context ctx) of (p - q)+ (torch's clamp: NaN stays NaN), or
    of p where that residual is empty; -1 where the law is not one. One scan keeps both
    running argmins and the law checks; the residual's decides which one counts."""
    lanes = tl.arange(0, BLOCK_V)
    inf = float("inf")
    best_r = tl.full([BLOCK_V], inf, tl.float64)
    best_p = tl.full([BLOCK_V], inf, tl.float64)
    at_r = lanes
    at_p = lanes
    nonfinite_r = tl.zeros([BLOCK_V], tl.int32)       # residual NaN / +inf: not a law
    positive_r = tl.zeros([BLOCK_V], tl.int32)
    broken_p = tl.zeros([BLOCK_V], tl.int32)          # p NaN / ±inf / negative
    positive_p = tl.zeros([BLOCK_V], tl.int32)
    for start in range(0, V, BLOCK_V):
        offs = start + lanes
        live = offs < V
        p = tl.load(prow + offs, mask=live, other=0.0).to(tl.float64)
        x = p - _q_on(offs, cand_row, q_row, n)
        w = tl.where(x < 0.0, 0.0, x)
        e = neg_log(keyed_uniform(ctx, offs, sub_ptr))
        best_r, at_r = _argmin_lane(race_key(w, e), offs, best_r, at_r)
        best_p, at_p = _argmin_lane(race_key(p, e), offs, best_p, at_p)
        nonfinite_r |= ((w != w) | (w == inf)).to(tl.int32)
        positive_r |= (w > 0.0).to(tl.int32)
        broken_p |= (live & ((p != p) | (p < 0.0) | (p == inf))).to(tl.int32)
        positive_p |= (p > 0.0).to(tl.int32)
    bad_r = tl.max(nonfinite_r, 0) > 0
    empty = ~bad_r & (tl.max(positive_r, 0) == 0)    # torch: resid.sum() <= 0 (NaN: False)
    law_p = (tl.max(broken_p, 0) == 0) & (tl.max(positive_p, 0) > 0)
    drawn = tl.where(empty, _lowest_argmin(best_p, at_p, V, BLOCK_V),
                     _lowest_argmin(best_r, at_r, V, BLOCK_V))
    return tl.where(tl.where(empty, law_p, ~bad_r), drawn, -1)


@triton.jit
def _accepts(u, q_hi, q_lo, p_d, FP64: tl.constexpr):
    """u·q(d) < p(d): in float64, or exactly from the float32 bits (``exact32.accept``)."""
    if FP64:
        return u.to(tl.float64) * q_hi < p_d.to(tl.float64)
    else:
        return exact32.accept(u, q_hi, q_lo, p_d)


@triton.jit
def _emit64(prow, cand_row, q_row, n, u, V, BLOCK_V: tl.constexpr):
    """The emitting row's draw in float64: the inverse CDF of the residual (p − q)+ (q: the
    first n candidates of cand_row / q_row), or of p where it is empty, with uniform u; -1
    where that is not a law. Two scans: the masses and last positives, then the cdf."""
    lanes = tl.arange(0, BLOCK_V)
    mass = tl.zeros([BLOCK_V], tl.float64)       # per lane; reduced once after the scan
    mass_p = tl.zeros([BLOCK_V], tl.float64)
    last_r = tl.full([BLOCK_V], -1, tl.int32)
    last_p = tl.full([BLOCK_V], -1, tl.int32)
    for start in range(0, V, BLOCK_V):           # pass 1: residual and p mass, last positives
        offs = start + lanes
        p = tl.load(prow + offs, mask=offs < V, other=0.0).to(tl.float64)
        w = tl.maximum(p - _q_on(offs, cand_row, q_row, n), 0.0)
        mass += w
        mass_p += p
        last_r = tl.maximum(last_r, tl.where(w > 0, offs, -1))
        last_p = tl.maximum(last_p, tl.where(p > 0, offs, -1))
    use_p = tl.sum(mass, 0) <= 0.0
    total = tl.where(use_p, tl.sum(mass_p, 0), tl.sum(mass, 0))
    target = u.to(tl.float64) * total
    carry = tl.full([], 0.0, tl.float64)
    count = 0
    for start in range(0, V, BLOCK_V):           # pass 2: inverse CDF
        offs = start + lanes
        p = tl.load(prow + offs, mask=offs < V, other=0.0).to(tl.float64)
        w = tl.where(use_p, p, tl.maximum(p - _q_on(offs, cand_row, q_row, n), 0.0))
        cdf = tl.cumsum(w, 0) + carry
        count += tl.sum(tl.where((cdf <= target) & (offs < V), 1, 0), 0)
        carry += tl.sum(w, 0)
    emit = tl.minimum(count, tl.max(tl.where(use_p, last_p, last_r), 0))
    return tl.where((total > 0.0) & (total < float("inf")), emit, -1)   # not a law


# GAMMA, the block's draft count, is a loop bound and an offset: one binary serves every block.
# The uniforms and the subkey words are read one value at a time, so their alignment (a row of
# a larger tensor, or not: a captured step reads the key words of a static input) would only
# make variants.
@triton.jit(do_not_specialize=["GAMMA"],
            do_not_specialize_on_alignment=["ua_ptr", "ur_ptr", "ub_ptr", "sub_ptr"])
def _verify_kernel(logits_ptr, p_ptr, draft_ptr, cand_ptr, q_ptr, greedy_ptr, ua_ptr, ur_ptr,
                   ub_ptr, ctx_ptr, fresh_ptr, sub_ptr, rowmax_ptr, acc_ptr, emit_ptr, badq_ptr,
                   tok_ptr, bad_ptr, V, GAMMA, K,
                   SAMPLED: tl.constexpr, MARKED: tl.constexpr, FP64: tl.constexpr,
                   BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr, LOG_V: tl.constexpr,
                   LEVELS_V: tl.constexpr, LOG_K: tl.constexpr, LEVELS_K: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)           # 64-bit: (r·rows + j)·V passes 2^31
    rows = GAMMA + 1
    greedy = tl.load(greedy_ptr + r) != 0
    acc = 0
    emit = 0
    bad_q = 0
    if greedy or not SAMPLED:
        # Greedy: longest prefix with d_j == argmax_j, then the argmax at the first mismatch.
        alive = 1
        for j in range(0, rows):
            if alive == 1:                           # rows after the first mismatch: unread
                am = _argmax_row(logits_ptr + (r * rows + j) * V, V, BLOCK_V)
                d = tl.load(draft_ptr + r * GAMMA + tl.minimum(j, GAMMA - 1))
                stop = (j == GAMMA) | (d != am)
                emit = tl.where(stop, am, emit)
                alive = tl.where(stop, 0, alive)
                acc += tl.where(stop, 0, 1)
    else:
        ks = tl.arange(0, BLOCK_K)
        kmask = ks < K
        alive = 1
        for j in range(0, GAMMA):
            d = tl.load(draft_ptr + r * GAMMA + j)
            c = tl.load(cand_ptr + (r * GAMMA + j) * K + ks, mask=kmask, other=-1)
            qk = tl.load(q_ptr + (r * GAMMA + j) * K + ks, mask=kmask, other=0.0)
            if FP64:
                qk = qk.to(tl.float64)
                q_hi = tl.sum(tl.where(c == d, qk, 0.0), 0)
                q_lo = q_hi
            else:
                q_hi, q_lo = exact32.hit_mass(c, qk.to(tl.float32), d, K, BLOCK_K, LOG_K,
                                              LEVELS_K)
            p_d = tl.load(p_ptr + (r * rows + j) * V + d)
            u = tl.load(ua_ptr + r * GAMMA + j)
            q_broken = tl.sum(tl.where(kmask & ((qk != qk) | (qk < 0) | (qk == float("inf"))),
                                       1, 0), 0)
            bad_q = tl.where((q_hi > 0.0) & (q_broken == 0), bad_q, 1)   # NaN q(d): broken
            alive = tl.where(_accepts(u, q_hi, q_lo, p_d, FP64) & (alive == 1), 1, 0)
            acc += alive
        slot = tl.minimum(acc, GAMMA - 1)
        rejected = acc < GAMMA
        rej_k = (tl.zeros([BLOCK_K], dtype=tl.int32) + acc) < GAMMA     # q is empty at row γ
        c = tl.load(cand_ptr + (r * GAMMA + slot) * K + ks, mask=kmask & rej_k, other=-1)
        qk = tl.load(q_ptr + (r * GAMMA + slot) * K + ks, mask=kmask, other=0.0)
        prow = p_ptr + (r * rows + acc) * V
        u = tl.where(rejected, tl.load(ur_ptr + r * GAMMA + slot), tl.load(ub_ptr + r))
        row = (r * GAMMA + slot) * K                # the emitting slot's candidates and q
        n_q = tl.where(rejected, K, 0)               # the bonus row's q is empty
        if FP64:
            emit = _emit64(prow, cand_ptr + row, q_ptr + row, n_q, u, V, BLOCK_V)
        else:
            emit = exact32.emit_residual(prow, c, qk.to(tl.float32), u.to(tl.float32), V, K,
                                         BLOCK_V, BLOCK_K, LOG_V, LEVELS_V, LOG_K, LEVELS_K)
        if MARKED:                                   # the emitting slot's context is fresh:
            if tl.load(fresh_ptr + r * rows + acc) != 0:       # the keyed draw replaces it
                emit = _keyed_emit(prow, cand_ptr + row, q_ptr + row, n_q,
                                   tl.load(ctx_ptr + r * rows + acc), sub_ptr, V, BLOCK_V)
    tl.store(acc_ptr + r, acc)
    tl.store(emit_ptr + r, emit)
    tl.store(badq_ptr + r, bad_q.to(tl.int8))
    # The step's outputs: the tokens (``assemble_tokens``), and the bad flag: a row of logits
    # whose maximum is not finite (``bad_rows``), or a sampled row with a law and nothing drawn
    # (``with_empty_draws``).
    bad = 0
    for j in range(0, rows):
        top = tl.load(rowmax_ptr + r * rows + j).to(tl.float32)
        bad = tl.where(tl.abs(top) < float("inf"), bad, 1)          # NaN and ±inf fail
        d = tl.load(draft_ptr + r * GAMMA + tl.minimum(j, GAMMA - 1))
        tl.store(tok_ptr + r * rows + j, tl.where(j < acc, d, tl.where(j == acc, emit, -1)))
    sampled = tl.load(greedy_ptr + r) == 0
    bad = tl.where(sampled & (bad_q == 0) & (emit < 0), 1, bad)
    tl.store(bad_ptr + r, bad.to(tl.int8))


def verify(logits: torch.Tensor, draft: torch.Tensor, candidates: torch.Tensor, q: torch.Tensor,
           sampling: SamplingBatch, noise: BlockNoise, check: bool = True,
           tuning: Tuning = DEFAULT, marks: Marks | None = None, has_fp64: bool = True
           ) -> VerifyOut:
    """Kernel version of ``dflash2rt.ops.verify.verify`` (same contract and outputs). ``marks``
    (a watermarked batch): the residual / bonus draw of a sampled row whose emitting slot is
    fresh is the Gumbel-max under subkey B at that slot's context (``Marks.emit``); the
    acceptance coins are already in ``noise`` (``Marks.noise``). ``has_fp64`` False: the
    sampled rows decide in the float32 formulation (``kernels.exact32``); no watermark."""
    if marks is not None and not has_fp64:
        require_fp64(False)
    r, rows, v = check_verify_args(logits, draft, candidates, q)
    if marks is not None and marks.ctx.shape != (r, rows):
        raise InvalidInputError(f"verify: marks.ctx {tuple(marks.ctx.shape)} must be [R, γ+1] = "
                                f"{(r, rows)}")
    k = candidates.shape[2]
    logits, draft, candidates = logits.contiguous(), draft.contiguous(), candidates.contiguous()
    p = (target_probs(logits, sampling.temperature, sampling.top_k, sampling.top_p,
                      top_k_max=sampling.top_k_max, top_p_rows=sampling.top_p_rows,
                      min_p=sampling.min_p).contiguous()
         if sampling.any_sampled else logits)
    acc = torch.empty(r, dtype=torch.int64, device=logits.device)
    emit = torch.empty_like(acc)
    bad_q = torch.empty(r, dtype=torch.int8, device=logits.device)
    tokens = torch.empty(r, rows, dtype=torch.int64, device=logits.device)
    bad = torch.empty(r, dtype=torch.int8, device=logits.device)
    marked = marks is not None and sampling.any_sampled
    keyed = (marks.ctx.contiguous(), bytes_of(marks.fresh),
             subkey_words(marks.key.target, logits.device)) if marked else (acc, acc, acc)
    block_v = min(tuning.block_v, triton.next_power_of_2(v))
    block_k = triton.next_power_of_2(k)
    launch(_verify_kernel, (r,), logits, p, draft, candidates, q.contiguous(),
           bytes_of(sampling.greedy), noise.accept.contiguous(),
           noise.residual.contiguous(), noise.bonus.contiguous(), *keyed,
           logits.amax(dim=-1), acc, emit, bad_q, tokens, bad, v,
           rows - 1, k, SAMPLED=sampling.any_sampled, MARKED=marked, FP64=has_fp64,
           BLOCK_V=block_v, LOG_V=block_v.bit_length() - 1,
           LEVELS_V=exact32.levels_for(block_v.bit_length() - 1),
           LOG_K=block_k.bit_length() - 1, LEVELS_K=exact32.levels_for(block_k.bit_length() - 1),
           BLOCK_K=block_k, num_warps=tuning.num_warps, **FP_FUSION)
    out = VerifyOut(acc, tokens, bad.view(torch.bool), bad_q.view(torch.bool))   # 0 / 1 bytes
    if check:
        out.raise_if_bad()
    return out
