"""Logit processing shared by the selector walk and verification: temperature, top-k, top-p,
min-p.

Order (as in Hugging Face and vLLM's V0 sampler): divide by temperature, keep the top-k logits
(ties with the k-th value kept), then keep the smallest prefix of the descending distribution
whose mass reaches top-p (ties broken by lower token id), then min-p: keep the tokens whose
probability is at least ``min_p`` times the largest one, renormalized. (vLLM's V1 sampler applies
min-p before top-k / top-p; the two orders differ only when top-p is also set.) Logit bias and
the penalties come before all of these, on the raw logits (``ops.procs``). Probabilities are float32; rows of greedy requests
(temperature 0) are computed at temperature 1 and must be ignored by the caller.

Temperature scaling cannot overflow: a row is shifted by its maximum before the division,
``(l - max l) / T`` (≤ 0, the maximum maps to exactly 0), so any positive float32 temperature,
down to the smallest subnormal, gives the correct law — at tiny T the one-hot (uniform over exact
ties) limit — and never NaN. A row with NaN / +inf or no finite entry is a bad row
(``bad_rows``): callers flag it and emit nothing from it.
"""

from __future__ import annotations

import math
import numbers
import struct
from typing import Sequence

import torch

from ..errors import SamplingParamsError
from .sort import sort_desc_stable

NEG_INF = float("-inf")
FLOAT32_MAX = 3.4028234663852886e38


def check_sampling_params(temperature: float, top_k: int, top_p: float) -> None:
    """Raise SamplingParamsError for values a request may not carry.

    Real numbers only (no bools, no strings); top_k an integer. Temperatures are staged as
    float32, so one that float32 cannot hold (it would turn into greedy or inf) is refused.
    """
    if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real) \
            or not math.isfinite(temperature) or temperature < 0:
        raise SamplingParamsError(
            f"temperature must be a finite number >= 0 (0 = greedy), got {temperature!r}")
    if temperature > 0:
        staged = staged_float32(temperature)
        if math.isinf(staged):
            raise SamplingParamsError(f"temperature {temperature!r} is too large for float32 "
                                      f"(max {FLOAT32_MAX:.3g})")
        if staged == 0.0:
            raise SamplingParamsError(f"temperature {temperature!r} rounds to 0 in float32 (it "
                                      "would silently decode greedily); use 0 for greedy")
    if isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral) \
            or not 0 <= top_k < 2**63:
        raise SamplingParamsError(
            f"top_k must be an integer in [0, 2**63) (0 = off), got {top_k!r}")
    if isinstance(top_p, bool) or not isinstance(top_p, numbers.Real) or not 0.0 < top_p <= 1.0:
        raise SamplingParamsError(f"top_p must be a number in (0, 1] (1 = off), got {top_p!r}")


def target_probs(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                 top_p: torch.Tensor, top_k_max: int | None = None,
                 top_p_rows: Sequence[int] | None = None,
                 min_p: torch.Tensor | None = None) -> torch.Tensor:
    """logits [R, T, V] → float32 probabilities [R, T, V] after temperature / top-k / top-p /
    min-p (``min_p`` [R] float, 0 = off; None: no row has min-p, the step is skipped).

    temperature [R] float (0 → computed at 1, caller uses argmax), top_k [R] int (0 = off),
    top_p [R] float (1 = off). Entries with p = 0 are exactly 0.

    Host facts (``SamplingBatch`` knows them; None = not known) let a batch skip work no row
    needs, with the same law bit for bit: ``top_k_max`` bounds every row's top_k (0: no row
    truncates by top-k), ``top_p_rows`` lists the rows whose float32 top_p is below 1. Only
    those rows are sorted (a full-vocabulary sort); the others are a softmax of the scaled
    logits, masked below the k-th largest value (``torch.topk`` of ``top_k_max``) when a row
    keeps fewer than all.
    """
    out = torch.softmax(_masked(logits, temperature, top_k, top_p, top_k_max, top_p_rows), -1)
    return out if min_p is None else apply_min_p(out, min_p)


def target_logprobs(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                    top_p: torch.Tensor, top_k_max: int | None = None,
                    top_p_rows: Sequence[int] | None = None,
                    min_p: torch.Tensor | None = None) -> torch.Tensor:
    """The log of ``target_probs``'s law, float32 [R, T, V], by log_softmax over the kept
    tokens: finite wherever the law keeps a token (also where its probability underflows
    float32), −inf exactly where it does not."""
    x = _masked(logits, temperature, top_k, top_p, top_k_max, top_p_rows)
    lp = torch.log_softmax(x, dim=-1)
    if min_p is None:
        return lp
    r = lp.shape[0]
    p = torch.softmax(x, dim=-1)                    # min-p decides on the law, as target_probs
    kept = p >= min_p.float().view(r, 1, 1) * p.amax(dim=-1, keepdim=True)
    cut = lp.masked_fill(~kept, NEG_INF)
    cut = cut - torch.logsumexp(cut, dim=-1, keepdim=True)
    return torch.where((min_p > 0).view(r, 1, 1), cut, lp)


def _masked(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
            top_p: torch.Tensor, top_k_max: int | None, top_p_rows: Sequence[int] | None
            ) -> torch.Tensor:
    """The scaled logits [R, T, V] with what top-k / top-p drop at −inf (``target_probs``)."""
    r, t, v = logits.shape
    x = scale(logits, temperature.view(r, 1, 1))                          # [R, T, V], ≤ 0
    nucleus = list(range(r) if top_p_rows is None else top_p_rows)
    kmax = v if top_k_max is None else min(int(top_k_max), v)
    if len(nucleus) == r:
        return _sorted_masked(x, top_k, top_p)
    out = _top_k_masked(x, top_k, kmax)                                   # [R, T, V]
    if nucleus:
        rows = torch.tensor(nucleus, dtype=torch.int64, device=x.device)
        out = out.index_copy(0, rows, _sorted_masked(x[rows], top_k[rows], top_p[rows]))
    return out


def apply_min_p(p: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Probabilities [R, T, V] → those of tokens with p ≥ min_p · max p, renormalized; rows
    with min_p = 0 are returned unchanged (bit for bit)."""
    r = p.shape[0]
    mp = min_p.float().view(r, 1, 1)
    kept = torch.where(p >= mp * p.amax(dim=-1, keepdim=True), p, 0.0)
    return torch.where(mp > 0, kept / kept.sum(dim=-1, keepdim=True), p)


def _top_k_masked(x: torch.Tensor, top_k: torch.Tensor, kmax: int) -> torch.Tensor:
    """Rows without top-p: x [R, T, V] where x ≥ the row's k-th largest value (ties kept), else
    −inf, the k-th value read from ``torch.topk`` of kmax (≥ every row's top_k, or V)."""
    if kmax == 0:
        return x
    r, t, v = x.shape
    vals = torch.topk(x, kmax, dim=-1).values                             # [R, T, kmax] desc
    truncates = ((top_k > 0) & (top_k < v)).view(r, 1, 1)
    k = top_k.clamp(min=1, max=kmax).view(r, 1, 1)
    kth = torch.where(truncates, vals.gather(-1, (k - 1).expand(r, t, 1)), NEG_INF)
    return x.masked_fill(~(x >= kth), NEG_INF)


def _sorted_masked(x: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Scaled logits x [R, T, V] with what top-k and top-p drop at −inf: one stable descending
    sort per row, the k-th value, the top-p prefix of the sorted law (mass strictly ahead <
    top_p, ties by lower id)."""
    r, _, v = x.shape
    srt, order = sort_desc_stable(x)                                       # [R, T, V]
    rank = torch.arange(v, device=x.device).view(1, 1, v)
    k = torch.where(top_k > 0, top_k, torch.full_like(top_k, v)).clamp(max=v).view(r, 1, 1)
    kth = srt.gather(-1, (k - 1).expand(r, srt.shape[1], 1))              # [R, T, 1]
    keep = srt >= kth                                                      # top-k, ties kept
    srt = srt.masked_fill(~keep, NEG_INF)
    p_sorted = torch.softmax(srt, dim=-1)
    before = torch.cumsum(p_sorted, dim=-1) - p_sorted                     # mass ahead of a token
    keep_p = (before < top_p.float().view(r, 1, 1)) | (top_p >= 1).view(r, 1, 1) | (rank == 0)
    srt = srt.masked_fill(~keep_p, NEG_INF)
    return torch.full_like(x, NEG_INF).scatter(-1, order, srt)


def staged_float32(x: float) -> float:
    """``x`` as a float32 tensor holds it (inf when it overflows)."""
    try:
        return struct.unpack("f", struct.pack("f", float(x)))[0]
    except OverflowError:      # some Pythons raise, others round to inf
        return math.inf


def scale(logits: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """``(logits - rowmax) / T`` in float32 over the last axis; T = 0 (greedy) counts as 1.

    ``temperature`` broadcasts against ``logits[..., :1]``. The result is ≤ 0 with the row's
    maximum at exactly 0, so no positive temperature can overflow it (bad rows excepted).
    """
    x = logits.float()
    t = torch.where(temperature > 0, temperature, torch.ones_like(temperature)).float()
    return (x - x.amax(dim=-1, keepdim=True)) / t


def bad_rows(logits: torch.Tensor) -> torch.Tensor:
    """[..., V] → bool [...]: True where a row holds NaN or +inf, or no finite entry at all.

    -inf is a legitimate mask (padded vocabulary tail, banned tokens) and is kept.

    One reduction: the row's maximum is NaN when the row holds a NaN (max reductions propagate
    NaN), +inf when it holds +inf, and -inf when no entry is finite; it is finite exactly when
    the row is good, in one pass over [R, V] (docs/benchmarks/real-scale.md).
    """
    return ~torch.isfinite(logits.amax(dim=-1))


def inverse_cdf(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Sample index per row from non-negative weights [..., V] (float64) with uniforms u [...].
    (Devices without float64 use ``exact32.inverse_cdf32``, the same contract in float32.)

    Returns the first index whose cumulative weight exceeds u·total, clamped to the last index
    with positive weight (rounding can leave the cumulative sum short of u·total). An index with
    zero weight is never returned. A row that is not a law — a NaN, ±inf or negative weight, or
    zero total mass — returns -1: callers flag it and never emit from it.
    """
    cdf = torch.cumsum(weights, dim=-1)                                   # [..., V]
    total = cdf[..., -1]
    target = u.to(cdf.dtype) * total
    idx = (cdf <= target.unsqueeze(-1)).sum(dim=-1)                       # first cdf > target
    v = weights.shape[-1]
    positions = torch.arange(v, device=weights.device)
    last_pos = torch.where(weights > 0, positions, -1).amax(dim=-1)
    is_law = torch.isfinite(total) & (total > 0) & ~(weights < 0).any(dim=-1)
    return torch.where(is_law, torch.minimum(idx, last_pos), -1)
