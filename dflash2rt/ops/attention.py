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
    _check(q, k, v, "attend")
    if mask.dtype != torch.bool:
        raise InvalidInputError(f"attend: mask must be bool, got {mask.dtype}")
    return _attend_visible(q, k, v, _visible(mask), scale)


def _attend_visible(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    mask: torch.Tensor | None, scale: float | None) -> torch.Tensor:
    """``attend`` with a mask in which every query row sees at least one key (None: every
    key)."""
    nh, n_kv = q.shape[2], k.shape[2]
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
        attn_mask=None if mask is None else mask.unsqueeze(-3), scale=scale,
        enable_gqa=nh != n_kv)  # [R, nh, Tq, hd]
    return out.transpose(1, 2)


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, op: str) -> None:
    """q [R, T, nh, hd] against k, v [R, L, n_kv, hd]: nh a multiple of n_kv, equal k and v."""
    if q.shape[2] % k.shape[2] or k.shape != v.shape or q.shape[-1] != k.shape[-1] \
            or q.shape[0] != k.shape[0]:
        raise InvalidInputError(f"{op}: incompatible q {tuple(q.shape)}, k {tuple(k.shape)}, "
                                f"v {tuple(v.shape)}")


def _visible(mask: torch.Tensor) -> torch.Tensor:
    """The keys each query row attends: ``mask``, or every key for a row whose mask is all
    False (finite, never NaN: such a row cannot poison the others)."""
    return mask | ~mask.any(dim=-1, keepdim=True)


def range_mask(lo: torch.Tensor, hi: torch.Tensor, n_keys: int) -> torch.Tensor:
    """lo, hi [R, T] → bool [R, T, n_keys]: key p visible to row (r, j) iff lo <= p < hi."""
    p = torch.arange(n_keys, device=lo.device)
    return (p >= lo.unsqueeze(-1)) & (p < hi.unsqueeze(-1))


class _LastMask:
    """The visible-key mask of the last (lo, hi, n_keys) asked for, on the CPU, and whether it
    is all True. A model passes the same lo / hi to every layer of a forward, so the mask is
    built once per forward, not once per layer (seven small ops that every layer would repeat).
    The entry is keyed by copies of lo / hi's values (two
    ``torch.equal`` of [R, T] per call), so a tensor changed in place, or a new one, rebuilds
    it. Accelerators build the mask every time and never call it full: comparing or reducing
    values there would sync the host (and break capture). → (mask [R, T, n_keys], full): with
    ``full`` every row sees every key, and the attention runs without a mask (a decode step of
    one request)."""

    def __init__(self) -> None:
        self.entry: tuple[torch.Tensor, torch.Tensor, int, torch.Tensor, bool] | None = None

    def __call__(self, lo: torch.Tensor, hi: torch.Tensor, n_keys: int
                 ) -> tuple[torch.Tensor, bool]:
        if lo.device.type != "cpu":
            return _visible(range_mask(lo, hi, n_keys)), False
        entry = self.entry                   # one read: threads replace whole entries
        if entry is not None and entry[2] == n_keys and _same(lo, entry[0]) \
                and _same(hi, entry[1]):
            return entry[3], entry[4]
        mask = _visible(range_mask(lo, hi, n_keys))
        full = torch.equal(mask, torch.ones_like(mask))    # host memory: no sync
        self.entry = (lo.clone(), hi.clone(), n_keys, mask, full)
        return mask, full


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)


visible_mask = _LastMask()


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lo: torch.Tensor,
              hi: torch.Tensor, scale: float) -> torch.Tensor:
    """q [R, T, nh, hd] over cache rows k, v [R, L, n_kv, hd] (a cache's first L rows, not
    copied); row (r, j) attends keys lo[r, j] <= p < hi[r, j] (int64 [R, T], hi <= L, and
    lo < hi: every row sees at least one key). → [R, T, nh, hd] in q's dtype.
    A step's few rows (T ≤ ``GROUPED_ROWS``) over a long context (each request's keys at
    least ``GROUPED_MIN_BYTES``) run ``grouped_attention``; the rest SDPA."""
    if lo.shape != q.shape[:2] or hi.shape != q.shape[:2]:
        raise InvalidInputError(f"attention: lo {tuple(lo.shape)} and hi {tuple(hi.shape)} must "
                                f"be [R, T] = {tuple(q.shape[:2])}")
    _check(q, k, v, "attention")
    if q.shape[1] <= GROUPED_ROWS and k[0].numel() * k.element_size() >= GROUPED_MIN_BYTES:
        return grouped_attention(q, k, v, lo, hi, scale)
    mask, full = visible_mask(lo, hi, k.shape[1])
    return _attend_visible(q, k, v, None if full else mask, scale)


# ``attention`` runs ``grouped_attention`` for up to GROUPED_ROWS query rows per request whose
# keys take GROUPED_MIN_BYTES or more: there the grouped form reads faster than SDPA with GQA;
# below it the two tie or SDPA is ahead (docs/benchmarks/real-scale.md, "Grouped attention").
GROUPED_ROWS = 32
GROUPED_MIN_BYTES = 1 << 20


def grouped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lo: torch.Tensor,
                      hi: torch.Tensor, scale: float) -> torch.Tensor:
    """``attention`` for a step's few query rows: the nh / n_kv query heads of a KV head and the
    T rows stacked as T·g query rows of one head, so that one multi-head SDPA call (no GQA
    expansion) reads each KV head's [L, hd] keys and values once, in place (a head-major cache:
    each head's rows contiguous). This is transformers' ``pack_gqa`` for decode, generalised
    to T rows and per-row key ranges. Decode attention is a matrix–vector product per head,
    which SDPA's GQA form reads more slowly (see ``GROUPED_MIN_BYTES``); the packed form also
    beats two batched matrix products with a softmax between them, which is what this op was
    (docs/benchmarks/real-scale.md)."""
    _check(q, k, v, "attention")
    r, t, nh, hd = q.shape
    n_keys, n_kv = k.shape[1], k.shape[2]
    g = nh // n_kv
    qg = q.reshape(r, t, n_kv, g, hd).permute(0, 2, 1, 3, 4).reshape(r, n_kv, t * g, hd)
    mask, full = visible_mask(lo, hi, n_keys)                           # [R, T, L]
    mask = None if full else \
        mask.unsqueeze(2).expand(r, t, g, n_keys).reshape(r, 1, t * g, n_keys)
    out = F.scaled_dot_product_attention(qg, k.transpose(1, 2), v.transpose(1, 2),
                                         attn_mask=mask, scale=scale)   # [R, n_kv, T·g, hd]
    return out.view(r, n_kv, t, g, hd).permute(0, 2, 1, 3, 4).reshape(r, t, nh, hd)


def write_rows(buf: torch.Tensor, new: torch.Tensor, pos: torch.Tensor) -> None:
    """buf [R, max_len, ...] receives new [R, T, ...] at positions pos [R, T] (each < max_len;
    no device→host sync)."""
    req = torch.arange(buf.shape[0], device=buf.device).view(-1, 1)
    buf.index_put_((req, pos), new.to(buf.dtype))
