"""An attention layer's prologue in one launch: the kernel form of ``ops.fused.attention_prologue``.

Program (row, head) of the projections: a query head → its (normed) rotated row into the
queries [R, T, nh, hd]; a KV head → its (normed) rotated key and its value written into the
cache at the row's position. The same operations in the same order and dtype as the reference
(the per-head RMSNorm as ``kernels.norm``, then ``x·cos + rotate_half(x)·sin`` rounded where
torch rounds, and no fused multiply-add: ``enable_fp_fusion=False``), so the rotation and the
writes are the reference's bits for the same normed rows.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..errors import InvalidInputError
from .launch import launch
from .norm import DTYPES


@triton.jit
def _rotated(base, w_ptr, d, rot, live, cos, sin, sign, HD, eps,
             NORM: tl.constexpr, HALF: tl.constexpr):
    """One head's row at ``base``: normed (NORM) with weight ``w_ptr``, then rotated."""
    raw = tl.load(base + d, mask=live, other=0.0)
    x = raw.to(tl.float32)
    xr = tl.load(base + rot, mask=live, other=0.0).to(tl.float32)      # the rotation's partner
    if NORM:
        scale = tl.math.rsqrt(tl.sum(x * x, 0) / HD + eps)
        w = tl.load(w_ptr + d, mask=live, other=0.0).to(tl.float32)
        wr = tl.load(w_ptr + rot, mask=live, other=0.0).to(tl.float32)
        if HALF:
            x = (w * (x * scale).to(raw.dtype).to(tl.float32)).to(raw.dtype).to(tl.float32)
            xr = (wr * (xr * scale).to(raw.dtype).to(tl.float32)).to(raw.dtype).to(tl.float32)
        else:
            x = (x * scale) * w
            xr = (xr * scale) * wr
    if HALF:
        a = (x * cos).to(raw.dtype).to(tl.float32)
        b = ((sign * xr) * sin).to(raw.dtype).to(tl.float32)
        return (a + b).to(raw.dtype)
    return (x * cos + (sign * xr) * sin).to(raw.dtype)


# The row count, and the strides it scales, change with the block: one binary for every block.
@triton.jit(do_not_specialize=["T", "sq_r", "sk_r", "sv_r", "sc_r"])
def _prologue_kernel(q_ptr, k_ptr, v_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, pos_ptr, qo_ptr,
                     ck_ptr, cv_ptr, T, NH, HD, q_eps, k_eps,
                     sq_r, sq_t, sk_r, sk_t, sv_r, sv_t, sc_r, sc_t, sck_r, sck_l, sck_h,
                     scv_r, scv_l, scv_h,
                     Q_NORM: tl.constexpr, K_NORM: tl.constexpr, HALF: tl.constexpr,
                     BLOCK_D: tl.constexpr):
    rt = tl.program_id(0).to(tl.int64)               # one program per (row, head)
    head = tl.program_id(1).to(tl.int64)
    r = rt // T
    t = rt % T
    d = tl.arange(0, BLOCK_D)
    live = d < HD
    half = HD // 2
    rot = tl.where(d < half, d + half, d - half)
    sign = tl.where(d < half, -1.0, 1.0)
    cos = tl.load(cos_ptr + r * sc_r + t * sc_t + d, mask=live, other=0.0).to(tl.float32)
    sin = tl.load(sin_ptr + r * sc_r + t * sc_t + d, mask=live, other=0.0).to(tl.float32)
    if head < NH:
        out = _rotated(q_ptr + r * sq_r + t * sq_t + head * HD, qw_ptr, d, rot, live, cos, sin,
                       sign, HD, q_eps, Q_NORM, HALF)
        tl.store(qo_ptr + (rt * NH + head) * HD + d, out, mask=live)
    else:
        h = head - NH
        out = _rotated(k_ptr + r * sk_r + t * sk_t + h * HD, kw_ptr, d, rot, live, cos, sin,
                       sign, HD, k_eps, K_NORM, HALF)
        p = tl.load(pos_ptr + rt)
        tl.store(ck_ptr + r * sck_r + p * sck_l + h * sck_h + d, out, mask=live)
        v = tl.load(v_ptr + r * sv_r + t * sv_t + h * HD + d, mask=live, other=0.0)
        tl.store(cv_ptr + r * scv_r + p * scv_l + h * scv_h + d, v, mask=live)


def _rows(x: torch.Tensor, heads: int, hd: int) -> torch.Tensor:
    """A projection [R, T, heads, hd] with each row's heads contiguous (a view where it is)."""
    if x.stride(3) != 1 or x.stride(2) != hd:
        x = x.contiguous()
    return x


def attention_prologue(q, k, v, q_norm, k_norm, cos, sin, cache_k, cache_v, pos):
    """Kernel version of ``dflash2rt.ops.fused.attention_prologue`` (same contract)."""
    r, t, nh, hd = q.shape
    n_kv = k.shape[2]
    if k.shape != (r, t, n_kv, hd) or v.shape != k.shape or cos.shape != (r, t, hd) \
            or sin.shape != cos.shape or pos.shape != (r, t) or hd % 2 \
            or cache_k.shape[0] != r or cache_k.shape[2:] != (n_kv, hd) \
            or cache_v.shape != cache_k.shape:
        raise InvalidInputError(f"attention prologue kernel: q {tuple(q.shape)}, k "
                                f"{tuple(k.shape)}, v {tuple(v.shape)}, cos {tuple(cos.shape)}, "
                                f"pos {tuple(pos.shape)}, cache {tuple(cache_k.shape)}")
    dt = q.dtype
    if dt not in DTYPES or any(x.dtype != dt for x in (k, v, cos, sin, cache_k, cache_v)) \
            or any(n is not None and n[0].dtype != dt for n in (q_norm, k_norm)):
        raise InvalidInputError(f"attention prologue kernel: every tensor of one of "
                                f"{[str(x) for x in DTYPES]}, got q {dt}, k {k.dtype}, cache "
                                f"{cache_k.dtype}")
    out = torch.empty(r, t, nh, hd, dtype=dt, device=q.device)
    if r * t == 0:
        return out
    q, k, v = _rows(q, nh, hd), _rows(k, n_kv, hd), _rows(v, n_kv, hd)
    q_at, out_at = (q, out) if nh else (k, k)   # no query heads: nothing read or written there
    if cos.stride() != sin.stride() or cos.stride(-1) != 1:     # the models' are views of one
        cos, sin = cos.contiguous(), sin.contiguous()            # gather: read where they are
    if cache_k.stride(3) != 1 or cache_v.stride(3) != 1:
        raise InvalidInputError("attention prologue kernel: cache rows must be contiguous")
    (qw, q_eps), (kw, k_eps) = (n if n is not None else (q_at, 0.0) for n in (q_norm, k_norm))
    launch(_prologue_kernel, (r * t, nh + n_kv), q_at, k, v, qw.contiguous(), kw.contiguous(),
           cos, sin, pos.to(torch.int64).contiguous(), out_at, cache_k, cache_v, t, nh, hd,
           float(q_eps), float(k_eps), q_at.stride(0), q_at.stride(1), k.stride(0), k.stride(1),
           v.stride(0), v.stride(1), cos.stride(0), cos.stride(1), *cache_k.stride()[:3],
           *cache_v.stride()[:3], Q_NORM=q_norm is not None, K_NORM=k_norm is not None,
           HALF=dt != torch.float32, BLOCK_D=triton.next_power_of_2(hd),
           enable_fp_fusion=False)
    return out
