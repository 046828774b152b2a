"""Launch parameters per vendor: the plugins own the numbers, the kernels read them."""

from __future__ import annotations

from dataclasses import dataclass

KERNELS = "triton kernels: conv (fused taps + block mask), selector lattice walk, verify"


@dataclass(frozen=True)
class Tuning:
    """``block_h``: channels per conv program; ``block_v``: vocabulary chunk of the verify scan;
    ``num_warps``: warps (NVIDIA: 32 lanes, AMD: 64-lane wavefronts, Intel: sub-groups)."""

    block_h: int = 128
    block_v: int = 1024
    num_warps: int = 4


DEFAULT = Tuning()
