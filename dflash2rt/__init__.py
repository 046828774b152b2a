"""dflash2rt: DFlash2 speculative decoding, verified losslessly, on CPU, CUDA, ROCm and XPU.

Importing this package does no work: ``run``, ``LLM``, ``SamplingParams`` and the registry load
on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["run", "LLM", "SamplingParams", "get_backend", "list_backends", "WatermarkKey",
           "__version__"]

if TYPE_CHECKING:
    from .api import run
    from .backend import Backend
    from .engine.request import SamplingParams
    from .llm import LLM
    from .registry import BackendStatus
    from .watermark import WatermarkKey


def __getattr__(name: str) -> Any:
    if name == "run":
        from .api import run

        return run
    if name == "LLM":
        from .llm import LLM

        return LLM
    if name == "SamplingParams":
        from .engine.request import SamplingParams

        return SamplingParams
    if name == "WatermarkKey":
        from .watermark import WatermarkKey

        return WatermarkKey
    raise AttributeError(f"module 'dflash2rt' has no attribute {name!r}")


def get_backend(name: str | None = None) -> "Backend":
    """The named backend, else $DFLASH2RT_BACKEND, else the best available one (``auto``)."""
    from .registry import Registry

    return Registry.discover().select(name).backend


def list_backends() -> "list[BackendStatus]":
    """Every installed backend with its availability and reason (what ``dflash2rt backends`` shows)."""
    from .registry import Registry

    return Registry.discover().statuses()
