"""RMSNorm in one launch: the kernel form of ``ops.fused.rms_norm`` for float32 and half types.

Program i normalizes row i of x [N, H]: the mean of squares in float32 over tiles of
``BLOCK_H`` channels, ``x · rsqrt(mean + eps)``, then the weight, in the reference's order (half
types: the normalized row cast to x's dtype before the weight, whose product rounds once to
that dtype, as torch's half multiply does).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..errors import InvalidInputError
from .launch import launch

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
NORM_TILE = 1024          # channels per tile: a row wider than this loops


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, out_ptr, H, eps, HALF: tl.constexpr,
                     BLOCK_H: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    base = row * H
    acc = tl.zeros([BLOCK_H], dtype=tl.float32)
    for c0 in range(0, H, BLOCK_H):
        cols = c0 + tl.arange(0, BLOCK_H)
        x = tl.load(x_ptr + base + cols, mask=cols < H, other=0.0).to(tl.float32)
        acc += x * x
    scale = tl.math.rsqrt(tl.sum(acc, 0) / H + eps)
    for c0 in range(0, H, BLOCK_H):
        cols = c0 + tl.arange(0, BLOCK_H)
        live = cols < H
        x = tl.load(x_ptr + base + cols, mask=live, other=0.0)
        w = tl.load(w_ptr + cols, mask=live, other=0.0)
        h = x.to(tl.float32) * scale                         # [BLOCK_H] float32
        if HALF:
            y = w.to(tl.float32) * h.to(x.dtype).to(tl.float32)
        else:
            y = h * w
        tl.store(out_ptr + base + cols, y.to(out_ptr.dtype.element_ty), mask=live)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Kernel version of ``dflash2rt.ops.fused.rms_norm``: x [..., H], weight [H] of x's dtype
    (float32, float16 or bfloat16) → [..., H]."""
    h = x.shape[-1]
    if weight.shape != (h,) or x.dtype not in DTYPES or weight.dtype != x.dtype:
        raise InvalidInputError(f"rms_norm kernel: x [..., H] and weight [H] of one of "
                                f"{[str(d) for d in DTYPES]}, got x {tuple(x.shape)} {x.dtype}, "
                                f"weight {tuple(weight.shape)} {weight.dtype}")
    x = x.contiguous()
    out = torch.empty_like(x)
    rows = x.numel() // h if h else 0
    if rows == 0:
        return out
    block = min(triton.next_power_of_2(h), NORM_TILE)
    launch(_rms_norm_kernel, (rows,), x, weight.contiguous(), out, h, float(eps),
           HALF=x.dtype != torch.float32, BLOCK_H=block)
    return out
