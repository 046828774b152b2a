"""Skips for what a backend cannot do by design, which the verdict does not count against a
level (as a dtype it does not declare): the watermark's float64 arithmetic on a device without
float64."""

from __future__ import annotations

import pytest

NO_FP64_SKIP = "has no float64 (the watermark raises there)"


def skip_without_fp64(backend) -> None:
    """Skip the calling test on a backend without float64, with the message the verdict knows."""
    if not backend.has_fp64:
        pytest.skip(f"backend {backend.name} {NO_FP64_SKIP}")
