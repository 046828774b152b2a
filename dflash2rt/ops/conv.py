"""DFlash2 grouped dynamic depthwise convolution over the rows of flattened draft blocks.

    conv(x, base, δ)[i, c] = Σ_{t<Tk} (base[t, c] + δ[i, t, c // group_size]) · x[i - t, c]

``i`` counts rows within one block of ``block_size`` rows; a tap with ``i - t < 0`` reads zero, so
blocks of many requests flattened into one [N, H] tensor never see each other. δ of row i comes
from row i (``kernel_projection`` of the normed sublayer input).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..errors import InvalidInputError


def check_conv_args(x: torch.Tensor, base: torch.Tensor, delta: torch.Tensor,
                    block_size: int) -> tuple[int, int]:
    """Validate shapes; return (taps, group_size)."""
    if x.dim() != 2:
        raise InvalidInputError(f"conv input must be [N, H], got shape {tuple(x.shape)}")
    n, h = x.shape
    if block_size < 1 or n % block_size:
        raise InvalidInputError(f"conv rows N={n} must be a multiple of block_size={block_size}")
    if base.dim() != 2 or base.shape[1] != h:
        raise InvalidInputError(f"conv base must be [Tk, H={h}], got {tuple(base.shape)}")
    taps = base.shape[0]
    if taps < 1:
        raise InvalidInputError("conv base needs at least one tap")
    if delta.dim() != 3 or delta.shape[0] != n or delta.shape[1] != taps:
        raise InvalidInputError(
            f"conv delta must be [N={n}, Tk={taps}, G], got {tuple(delta.shape)}")
    groups = delta.shape[2]
    if groups < 1 or h % groups:
        raise InvalidInputError(f"conv groups G={groups} must divide hidden size H={h}")
    return taps, h // groups


def grouped_dynamic_conv(x: torch.Tensor, base: torch.Tensor, delta: torch.Tensor,
                         block_size: int) -> torch.Tensor:
    """x [N, H], base [Tk, H], delta [N, Tk, G] → [N, H] in x's dtype.

    Row i of a block sums tap t times row i − t of the same block (zero before the block
    starts): all taps at once, as a product with a sliding window over the zero-padded block."""
    taps, group_size = check_conv_args(x, base, delta, block_size)
    n, h = x.shape
    r = n // block_size
    w = base.to(x.dtype) + delta.to(x.dtype).repeat_interleave(group_size, dim=2)   # [N, Tk, H]
    padded = F.pad(x.view(r, block_size, h), (0, 0, taps - 1, 0))        # [R, B + Tk − 1, H]
    window = padded.unfold(1, block_size, 1).flip(1)                      # [R, Tk, H, B]: tap t
    shifted = window.permute(0, 3, 1, 2)                                  # [R, B, Tk, H]
    return (w.view(r, block_size, taps, h) * shifted).sum(2).view(n, h)


def conv_prepare(x: torch.Tensor, base_in: torch.Tensor, delta_in: torch.Tensor,
                 block_size: int) -> torch.Tensor:
    """Input side: x' = conv(norm(h), base[0], δ[:, 0]) fed to the sublayer."""
    return grouped_dynamic_conv(x, base_in, delta_in, block_size)


def conv_finish(h: torch.Tensor, a: torch.Tensor, base_out: torch.Tensor,
                delta_out: torch.Tensor, block_size: int) -> torch.Tensor:
    """Output side: the residual update h + conv(sublayer(x'), base[1], δ[:, 1])."""
    return h + grouped_dynamic_conv(a, base_out, delta_out, block_size)
