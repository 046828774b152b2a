"""Attention over a KV cache: the runtime's op (``attention``: per-row key ranges) and the
general masked form (``attend``) that training and references use.

Both run on ``torch.nn.functional.scaled_dot_product_attention`` with ``enable_gqa``: query head
h reads KV head h // (nh / n_kv) (Hugging Face order) without a ``repeat_kv`` copy. Softmax in
float32 for half types (float64 stays float64).

The runtime writes a step's new K/V into the cache first (``write_rows``) and then attends
over the cache's live prefix: row (r, j) sees keys ``lo[r, j] <= p < hi[r, j]``.
    target (causal):            lo = 0,  hi = lens[r] + j + 1
    draft block (non-causal):   lo = max(0, pos - window + 1) (≤ lens[r]), hi = lens[r] + B
Backends implement ``attention`` with this contract (``Backend.attention``); the Triton kernel
(kernels/attention.py) reads lo / hi on the device, so a captured step attends over the live
context only.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from ..errors import InvalidInputError

AttentionFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                        float], torch.Tensor]


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
           scale: float | None = None) -> torch.Tensor:
    """softmax(q k^T * scale) v over keys where mask is True.

    q [R, Tq, nh, hd], k/v [R, Tk, n_kv, hd] (nh a multiple of n_kv), mask bool broadcastable to
    [R, Tq, Tk]. A query row whose mask is all False gets the uniform average of every key
    (finite, never NaN), so it cannot poison other rows. Returns [R, Tq, nh, hd] in q's dtype.
    """
    nh, n_kv = q.shape[2], k.shape[2]
    if nh % n_kv or k.shape != v.shape or q.shape[-1] != k.shape[-1] or q.shape[0] != k.shape[0]:
        raise InvalidInputError(f"attend: incompatible q {tuple(q.shape)}, k {tuple(k.shape)}, "
                                f"v {tuple(v.shape)}")
    if mask.dtype != torch.bool:
        raise InvalidInputError(f"attend: mask must be bool, got {mask.dtype}")
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    mask = mask | ~mask.any(dim=-1, keepdim=True)                 # empty rows: every key
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
        attn_mask=mask.unsqueeze(-3), scale=scale, enable_gqa=nh != n_kv)  # [R, nh, Tq, hd]
    return out.transpose(1, 2)


def range_mask(lo: torch.Tensor, hi: torch.Tensor, n_keys: int) -> torch.Tensor:
    """lo, hi [R, T] → bool [R, T, n_keys]: key p visible to row (r, j) iff lo <= p < hi."""
    p = torch.arange(n_keys, device=lo.device)
    return (p >= lo.unsqueeze(-1)) & (p < hi.unsqueeze(-1))


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lo: torch.Tensor,
              hi: torch.Tensor, scale: float) -> torch.Tensor:
    """q [R, T, nh, hd] over cache rows k, v [R, L, n_kv, hd] (a cache's first L rows, not
    copied); row (r, j) attends keys lo[r, j] <= p < hi[r, j] (int64 [R, T], hi <= L, and
    lo < hi: every row sees at least one key). → [R, T, nh, hd] in q's dtype."""
    if lo.shape != q.shape[:2] or hi.shape != q.shape[:2]:
        raise InvalidInputError(f"attention: lo {tuple(lo.shape)} and hi {tuple(hi.shape)} must "
                                f"be [R, T] = {tuple(q.shape[:2])}")
    return attend(q, k, v, range_mask(lo, hi, k.shape[1]), scale)


def write_rows(buf: torch.Tensor, new: torch.Tensor, pos: torch.Tensor) -> None:
    """buf [R, max_len, ...] receives new [R, T, ...] at positions pos [R, T] (each < max_len;
    no device→host sync)."""
    req = torch.arange(buf.shape[0], device=buf.device).view(-1, 1)
    buf.index_put_((req, pos), new.to(buf.dtype))
