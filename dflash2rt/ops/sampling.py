"""Logit processing shared by the selector walk and verification: temperature, top-k, top-p.

Order (as in Hugging Face and vLLM): divide by temperature, keep the top-k logits (ties with the
k-th value kept), then keep the smallest prefix of the descending distribution whose mass reaches
top-p (ties broken by lower token id). Probabilities are float32; rows of greedy requests
(temperature 0) are computed at temperature 1 and must be ignored by the caller.
"""

from __future__ import annotations

import torch

from ..errors import SamplingParamsError

NEG_INF = float("-inf")


def check_sampling_params(temperature: float, top_k: int, top_p: float) -> None:
    """Raise SamplingParamsError for values a request may not carry."""
    if not (temperature >= 0.0) or temperature == float("inf"):
        raise SamplingParamsError(f"temperature must be a finite number >= 0, got {temperature}")
    if int(top_k) != top_k or top_k < 0:
        raise SamplingParamsError(f"top_k must be an integer >= 0 (0 = off), got {top_k}")
    if not (0.0 < top_p <= 1.0):
        raise SamplingParamsError(f"top_p must be in (0, 1], got {top_p}")


def target_probs(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                 top_p: torch.Tensor) -> torch.Tensor:
    """logits [R, T, V] → float32 probabilities [R, T, V] after temperature / top-k / top-p.

    temperature [R] float (0 → computed at 1, caller uses argmax), top_k [R] int (0 = off),
    top_p [R] float (1 = off). Entries with p = 0 are exactly 0.
    """
    r, _, v = logits.shape
    t = torch.where(temperature > 0, temperature, torch.ones_like(temperature)).float()
    x = logits.float() / t.view(r, 1, 1)                                   # [R, T, V]
    srt, order = torch.sort(x, dim=-1, descending=True, stable=True)      # [R, T, V]
    rank = torch.arange(v, device=x.device).view(1, 1, v)
    k = torch.where(top_k > 0, top_k, torch.full_like(top_k, v)).clamp(max=v).view(r, 1, 1)
    kth = srt.gather(-1, (k - 1).expand(r, srt.shape[1], 1))              # [R, T, 1]
    keep = srt >= kth                                                      # top-k, ties kept
    srt = srt.masked_fill(~keep, NEG_INF)
    p_sorted = torch.softmax(srt, dim=-1)
    before = torch.cumsum(p_sorted, dim=-1) - p_sorted                     # mass ahead of a token
    keep_p = (before < top_p.float().view(r, 1, 1)) | (top_p >= 1).view(r, 1, 1) | (rank == 0)
    srt = srt.masked_fill(~keep_p, NEG_INF)
    masked = torch.full_like(x, NEG_INF).scatter(-1, order, srt)
    return torch.softmax(masked, dim=-1)


def bad_rows(logits: torch.Tensor) -> torch.Tensor:
    """[..., V] → bool [...]: True where a row holds NaN or +inf, or no finite entry at all.

    -inf is a legitimate mask (padded vocabulary tail, banned tokens) and is kept.
    """
    nan_or_posinf = torch.isnan(logits) | torch.isposinf(logits)
    return nan_or_posinf.any(dim=-1) | ~torch.isfinite(logits).any(dim=-1)


def inverse_cdf(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Sample index per row from non-negative weights [..., V] (float64) with uniforms u [...].

    Returns the first index whose cumulative weight exceeds u·total, clamped to the last index
    with positive weight (rounding can leave the cumulative sum short of u·total). An index with
    zero weight is never returned unless the whole row is zero (callers exclude that case).
    """
    cdf = torch.cumsum(weights, dim=-1)                                   # [..., V]
    target = u.to(cdf.dtype) * cdf[..., -1]
    idx = (cdf <= target.unsqueeze(-1)).sum(dim=-1)                       # first cdf > target
    v = weights.shape[-1]
    positions = torch.arange(v, device=weights.device)
    last_pos = torch.where(weights > 0, positions, -1).amax(dim=-1).clamp(min=0)
    return torch.minimum(idx, last_pos)
