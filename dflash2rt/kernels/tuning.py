"""Launch parameters per vendor (the plugins own the numbers, the kernels read them), and the
Triton facts a vendor declares: its target backend, its tuning per warp size, its compile
targets."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Mapping

KERNELS = ("triton kernels: conv (fused taps + block mask), selector lattice walk, verify (both "
           "with the watermark's keyed draws), attention (per-request key ranges over the static "
           "cache), the step's Philox noise, RMSNorm, the attention prologue (q / k norm, rope, "
           "K/V write)")


@dataclass(frozen=True)
class Tuning:
    """``block_h``: channels per conv program; ``block_v``: vocabulary chunk of the verify scan;
    ``num_warps``: warps (NVIDIA: 32 lanes, AMD: 64-lane wavefronts on CDNA, 32 on RDNA,
    Intel: sub-groups); ``attn_block_m``: query rows (query positions × heads of a GQA group)
    per attention program; ``attn_block_n``: keys per attention tile (both capped by the head
    dim in the launcher, and at least 16 for ``tl.dot``)."""

    block_h: int = 128
    block_v: int = 1024
    num_warps: int = 4
    attn_block_m: int = 64
    attn_block_n: int = 64


DEFAULT = Tuning()


@dataclass(frozen=True)
class TritonFacts:
    """What a vendor's Triton is. ``backend``: the target backend Triton must report on its
    devices ("cuda", "hip", "xpu"); ``distribution``: the package that brings it; ``tuning``:
    launch parameters by the device's warp size (``props.warp_size``), the first entry being the
    default; ``compile_targets``: name → (arch, warp size) that ``compile_check`` compiles for
    without a device (empty when the PyPI triton cannot target the vendor)."""

    backend: str
    distribution: str
    tuning: Mapping[int, Tuning]
    compile_targets: Mapping[str, tuple[int | str, int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.tuning:
            raise ValueError("TritonFacts.tuning needs at least one warp size")

    def tuning_for(self, warp_size: int | None) -> Tuning:
        """The tuning for ``warp_size``; the default (first) one when it is unknown."""
        return self.tuning.get(warp_size or 0, next(iter(self.tuning.values())))


INTERPRET_REASON = ("TRITON_INTERPRET=1 is set in this process, so Triton would run the kernels "
                    "in its host interpreter; unset it to use the device kernels")


def interpreting() -> bool:
    """True when Triton's interpreter replaces its compiler in this process: TRITON_INTERPRET
    read as Triton reads it (1, true, on, yes or y in any case; anything else is off)."""
    return os.environ.get("TRITON_INTERPRET", "").lower() in ("1", "true", "on", "yes", "y")
