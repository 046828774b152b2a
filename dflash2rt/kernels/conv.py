"""Grouped dynamic depthwise conv kernel: fused tap application with block masking."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..ops.conv import check_conv_args
from .launch import launch
from .tuning import DEFAULT, Tuning


@triton.jit(do_not_specialize=["BLOCK_SIZE"])      # one binary for every block size
def _conv_kernel(x_ptr, base_ptr, delta_ptr, res_ptr, out_ptr, H, G, GS, BLOCK_SIZE,
                 TAPS: tl.constexpr, RESIDUAL: tl.constexpr, BLOCK_H: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)         # one program per (row, channel block)
    cols = tl.program_id(1).to(tl.int64) * BLOCK_H + tl.arange(0, BLOCK_H)
    live = cols < H
    in_block = tl.full([BLOCK_H], 0, tl.int32) + row % BLOCK_SIZE
    acc = tl.zeros([BLOCK_H], dtype=tl.float32)
    for t in tl.static_range(TAPS):
        w = tl.load(base_ptr + t * H + cols, mask=live, other=0.0).to(tl.float32)
        d = tl.load(delta_ptr + (row * TAPS + t) * G + cols // GS, mask=live, other=0.0)
        ok = live & (in_block >= t)             # taps before the block start read zero
        x = tl.load(x_ptr + (row - t) * H + cols, mask=ok, other=0.0).to(tl.float32)
        acc += (w + d.to(tl.float32)) * x
    if RESIDUAL:
        acc += tl.load(res_ptr + row * H + cols, mask=live, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * H + cols, acc.to(out_ptr.dtype.element_ty), mask=live)


def _launch(x: torch.Tensor, base: torch.Tensor, delta: torch.Tensor, block_size: int,
            residual: torch.Tensor | None, tuning: Tuning) -> torch.Tensor:
    taps, group_size = check_conv_args(x, base, delta, block_size)
    n, h = x.shape
    x, base, delta = x.contiguous(), base.contiguous(), delta.contiguous()
    out = torch.empty_like(x)
    res = residual.contiguous() if residual is not None else x
    grid = (n, triton.cdiv(h, tuning.block_h))
    launch(_conv_kernel, grid, x, base, delta, res, out, h, delta.shape[2], group_size,
           block_size, TAPS=taps, RESIDUAL=residual is not None, BLOCK_H=tuning.block_h,
           num_warps=tuning.num_warps)
    return out


def conv_prepare(x, base, delta, block_size, tuning: Tuning = DEFAULT):
    """Kernel version of ``dflash2rt.ops.conv.conv_prepare`` (accumulates in float32)."""
    return _launch(x, base, delta, block_size, None, tuning)


def conv_finish(h, a, base, delta, block_size, tuning: Tuning = DEFAULT):
    """Kernel version of ``dflash2rt.ops.conv.conv_finish``: h + conv(a), fused."""
    return _launch(a, base, delta, block_size, h, tuning)
