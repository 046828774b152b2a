"""Skips for what a backend cannot do by design, which the verdict does not count against a
level (as a dtype it does not declare): the watermark's float64 arithmetic on a device without
float64, and tensor parallelism where it is not qualified (gloo ranks run on the CPU lanes)."""

from __future__ import annotations

import pytest

NO_FP64_SKIP = "has no float64 (the watermark raises there)"
TP_ELSEWHERE_SKIP = "tensor parallelism is qualified on the cpu backends"


def skip_tp_elsewhere(why: str) -> None:
    """Skip a tensor-parallel test on a backend where it is not qualified (not a CPU device,
    or the Triton interpreter), with the message the verdict knows."""
    pytest.skip(f"{why}: {TP_ELSEWHERE_SKIP}")


def skip_without_fp64(backend) -> None:
    """Skip the calling test on a backend without float64, with the message the verdict knows."""
    if not backend.has_fp64:
        pytest.skip(f"backend {backend.name} {NO_FP64_SKIP}")
