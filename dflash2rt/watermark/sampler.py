"""Watermarked draws: Gumbel-max (exponential minimum) over keyed values, and the keyed coin.

For a law p and independent E_x ~ Exp(1), argmin_x E_x / p_x has law p exactly (the race of
exponential clocks). With E_x = -log r(key, context, x) the draw is a deterministic function of the
key, the context and p — the watermark — while over keys it is a draw from p (distortion-free up
to the 2⁻²³ grid of the values, the same grid every dflash2rt uniform has). The mapping from values
to tokens is exact: keys compare as float64 E / p with p the float32 law, the minimum wins, ties go
to the lower token id, and p = 0 is never chosen. A row that is not a law (NaN, ±inf, negative, or
no positive mass) returns -1: the caller flags it, as ``ops.sampling.inverse_cdf`` does.

Draft (subkey A), target (B) and coin (C) values are independent because their subkeys are.
The race needs float64 (``has_fp64``, as in ``ops.verify``): on a device without it the draws
raise ``WatermarkUnsupportedError`` before any float64 tensor exists, whether ``has_fp64`` is
passed or set for the decode by ``Backend.run_context()``; the coin is integer work and an exact
float32 map, and runs everywhere.
"""

from __future__ import annotations

import torch

from ..errors import BackendError
from ..ops.exact32 import fp64_enabled
from .keys import SubKey
from .values import COIN_TOKEN, keyed_uniforms, neg_log

_INF = float("inf")


class WatermarkUnsupportedError(BackendError):
    """Watermarked sampling asked of a device that cannot run it (no float64)."""


def require_fp64(has_fp64: bool | None = None) -> None:
    if not fp64_enabled(has_fp64):
        raise WatermarkUnsupportedError(
            "watermarked sampling compares -log(r) / p in float64 and this device has no "
            "float64; run the watermark on a device with float64 (cpu, cuda, rocm)")


def _law_rows(p: torch.Tensor) -> torch.Tensor:
    """[R, K] float64 → bool [R]: finite, non-negative, some positive mass."""
    return torch.isfinite(p).all(-1) & ~(p < 0).any(-1) & (p > 0).any(-1)


def _race(p: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """Keys E / p (float64), +inf where p is not positive."""
    return torch.where(p > 0, e / torch.where(p > 0, p, 1.0), _INF)


def exp_min_index(probs: torch.Tensor, e: torch.Tensor, has_fp64: bool | None = None
                  ) -> torch.Tensor:
    """probs [R, V] (any float dtype), e [R, V] float64 → int64 [R]: argmin e / p, lowest id on
    ties, -1 for a row that is not a law."""
    require_fp64(has_fp64)
    p = probs.to(torch.float64)
    key = _race(p, e)                                                    # [R, V]
    v = p.shape[-1]
    ids = torch.arange(v, device=p.device)
    first = torch.where(key == key.amin(-1, keepdim=True), ids, v).amin(-1)
    return torch.where(_law_rows(p), first, -1)


def exp_min_candidates(probs: torch.Tensor, ids: torch.Tensor, e: torch.Tensor,
                       has_fp64: bool | None = None) -> torch.Tensor:
    """Over a sparse candidate set: probs / ids / e [R, K] → int64 [R], the winning *position*
    in K (lowest token id on ties, then lowest position), -1 for a row that is not a law."""
    require_fp64(has_fp64)
    p = probs.to(torch.float64)
    key = _race(p, e)                                                    # [R, K]
    k = p.shape[-1]
    tied = key == key.amin(-1, keepdim=True)
    big = torch.iinfo(torch.int64).max
    low_id = torch.where(tied, ids, big).amin(-1, keepdim=True)
    pos = torch.arange(k, device=p.device)
    first = torch.where(tied & (ids == low_id), pos, k).amin(-1)
    return torch.where(_law_rows(p), first, -1)


def draw_dense(sub: SubKey, ctx: torch.Tensor, probs: torch.Tensor,
               has_fp64: bool | None = None) -> torch.Tensor:
    """Gumbel-max token per row: ctx [R] int64 context hashes, probs [R, V] → int64 [R]."""
    require_fp64(has_fp64)
    v = probs.shape[-1]
    tokens = torch.arange(v, dtype=torch.int64, device=probs.device)
    u = keyed_uniforms(sub, ctx.to(probs.device).view(-1, 1), tokens.view(1, -1))   # [R, V]
    return exp_min_index(probs, neg_log(u), has_fp64)


def draw_sparse(sub: SubKey, ctx: torch.Tensor, ids: torch.Tensor, probs: torch.Tensor,
                has_fp64: bool | None = None) -> torch.Tensor:
    """Gumbel-max over candidates (the draft walk): ids / probs [R, K] → position in K [R].

    The keyed value of a candidate depends on its token id only, so the draw is the dense draw of
    the same law restricted to the candidates (tested)."""
    require_fp64(has_fp64)
    u = keyed_uniforms(sub, ctx.to(probs.device).view(-1, 1), ids.to(torch.int64))  # [R, K]
    return exp_min_candidates(probs, ids.to(torch.int64), neg_log(u), has_fp64)


def coin(sub: SubKey, ctx: torch.Tensor) -> torch.Tensor:
    """The acceptance coin: float32 uniforms ∈ (0, 1) per context hash [...], from subkey C and
    a token word no vocabulary uses (independent of both draws)."""
    return keyed_uniforms(sub, ctx, COIN_TOKEN)
