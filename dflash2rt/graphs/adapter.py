"""The graph adapter: one vendor-neutral capture idiom over a torch device module.

``torch.cuda`` serves CUDA and ROCm builds (a hipGraph on ROCm; HIP refuses capture on the
default stream, so capture always runs on a side stream), ``torch.xpu`` serves XPU (torch ≥ 2.11,
``XPUGraph``; its ``torch.xpu.graph`` synchronises and empties the cache per capture, as
``torch.cuda.graph`` does). The idiom: ONE capture stream per adapter, eager warm-up on that same
stream (``warm_up_on``), every capture into the pool the runner shares across buckets. Which
device module and graph class a vendor uses is data in its plugin. Every failure to capture
raises ``GraphCaptureError``, so the runner can fall back to eager and report it.
"""

from __future__ import annotations

import contextlib
import gc
from typing import Any, Callable, ContextManager, Iterator, Protocol

import torch

from ..errors import DFlash2Error


class GraphCaptureError(DFlash2Error):
    """Capture failed; the runner falls back to eager for that bucket and reports why."""


class Graph(Protocol):
    def replay(self) -> None: ...


class GraphAdapter(Protocol):
    """Captures a function over static buffers into a replayable graph. Optional:
    ``capture_stream()``, a context manager that runs the eager warm-up where capture runs."""

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


def warm_up_on(adapter: GraphAdapter) -> ContextManager[None]:
    """The runner wraps its eager warm-up in this: the adapter's capture stream when it has one
    (lazy init and allocator state then match the capture), else nothing."""
    stream_ctx = getattr(adapter, "capture_stream", None)
    return stream_ctx() if stream_ctx is not None else contextlib.nullcontext()


class TorchGraphAdapter:
    """Graphs through the torch device ``module`` (``torch.cuda`` on CUDA and ROCm builds,
    ``torch.xpu``) and its graph class ``graph_class`` (``"CUDAGraph"``, ``"XPUGraph"``):
    ``module.graph(g, pool=, stream=)``, ``module.Stream``, ``module.stream``,
    ``module.current_stream`` and ``module.graph_pool_handle``."""

    def __init__(self, module: Any, device: torch.device | str, graph_class: str,
                 name: str) -> None:
        self.module, self.device, self.name = module, torch.device(device), name
        self.graph_class = getattr(module, graph_class, None)
        if self.graph_class is None or not hasattr(module, "graph"):
            raise GraphCaptureError(f"torch {torch.__version__} has no "
                                    f"{getattr(module, '__name__', module)}.{graph_class}")
        self._stream: Any = None          # made on first use: constructing touches no device

    @property
    def stream(self) -> Any:
        """The one side stream every warm-up and capture of this adapter runs on."""
        if self._stream is None:
            self._stream = self.module.Stream(device=self.device)
        return self._stream

    def new_pool(self) -> Any:
        return self.module.graph_pool_handle()

    @contextlib.contextmanager
    def capture_stream(self) -> Iterator[None]:
        """Run the body on the capture stream, ordered after and before the current stream."""
        current = self.module.current_stream(self.device)
        self.stream.wait_stream(current)
        try:
            with self.module.stream(self.stream):
                yield
        finally:
            current.wait_stream(self.stream)

    def capture(self, fn: Callable[[], None], pool: Any) -> Graph:
        graph = self.graph_class()
        try:
            with no_gc(), self.capture_stream(), \
                    self.module.graph(graph, pool=pool, stream=self.stream):
                fn()
        except Exception as exc:  # noqa: BLE001 - reported by the runner
            raise GraphCaptureError(f"{self.name} capture failed: {type(exc).__name__}: {exc}")
        return graph
