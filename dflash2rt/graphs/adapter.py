"""Graph adapters: the one place that knows each vendor's graph API.

CUDA and ROCm use ``torch.cuda.CUDAGraph`` (a hipGraph on ROCm builds; HIP refuses capture on
the default stream, so capture always runs on a side stream). XPU uses ``torch.xpu.XPUGraph``
(torch ≥ 2.11). Every adapter raises ``GraphCaptureError`` when capture fails, so the runner can
fall back to eager and report it.
"""

from __future__ import annotations

import contextlib
import gc
from typing import Any, Callable, Iterator, Protocol

import torch

from ..errors import DFlash2Error


class GraphCaptureError(DFlash2Error):
    """Capture failed; the runner falls back to eager for that bucket and reports why."""


class Graph(Protocol):
    def replay(self) -> None: ...


class GraphAdapter(Protocol):
    """Captures a function over static buffers into a replayable graph."""

    name: str

    def capture(self, fn: Callable[[], None], pool: Any) -> Graph: ...

    def new_pool(self) -> Any: ...


@contextlib.contextmanager
def no_gc() -> Iterator[None]:
    """Keep Python's cyclic GC out of a capture: collecting an unreachable graph object frees its
    device graph (cudaGraphExecDestroy), which is illegal while a stream is capturing and
    invalidates the capture in progress (seen on an H200 with torch 2.11)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class CudaGraphAdapter:
    """torch.cuda.CUDAGraph on CUDA and ROCm builds, captured on a side stream."""

    name = "cuda-graph"

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def new_pool(self) -> Any:
        return torch.cuda.graph_pool_handle()

    def capture(self, fn: Callable[[], None], pool: Any) -> Graph:
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream(device=self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        try:
            with no_gc(), torch.cuda.stream(stream), \
                    torch.cuda.graph(graph, pool=pool, stream=stream):
                fn()
        except Exception as exc:  # noqa: BLE001 - reported by the runner
            raise GraphCaptureError(f"{self.name} capture failed: {type(exc).__name__}: {exc}")
        torch.cuda.current_stream(self.device).wait_stream(stream)
        return graph


class XpuGraphAdapter:
    """torch.xpu.XPUGraph (torch ≥ 2.11); opt-in, gated by a replay == eager self-test."""

    name = "xpu-graph"

    def __init__(self, device: torch.device) -> None:
        if not hasattr(torch.xpu, "XPUGraph"):
            raise GraphCaptureError(f"torch {torch.__version__} has no torch.xpu.XPUGraph "
                                    "(needs torch >= 2.11)")
        self.device = device

    def new_pool(self) -> Any:
        return torch.xpu.graph_pool_handle()

    def capture(self, fn: Callable[[], None], pool: Any) -> Graph:
        graph = torch.xpu.XPUGraph()
        try:
            with no_gc(), torch.xpu.graph(graph, pool=pool):
                fn()
        except Exception as exc:  # noqa: BLE001 - reported by the runner
            raise GraphCaptureError(f"{self.name} capture failed: {type(exc).__name__}: {exc}")
        return graph
