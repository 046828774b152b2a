"""The bucketed graph runner: static buffers per batch-size bucket, eager warm-up before
capture, replay by copying live rows into ``[:R]`` and inert padding into ``[R:]``.

A step body reads only its static inputs and writes only its static outputs (and, through
them, nothing that belongs to a live request: padded rows get inert values, and outputs are
returned as ``[:R]`` views). A bucket whose capture fails runs eagerly from then on, and the
failure is reported through ``on_fallback`` (the backend's run stats).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch

from ..errors import InvalidInputError
from .adapter import Graph, GraphAdapter, GraphCaptureError

Tensors = dict[str, torch.Tensor]


@dataclass
class Bucket:
    size: int
    inputs: Tensors
    outputs: Tensors = field(default_factory=dict)
    graph: Graph | None = None
    eager: str = ""              # why capture failed: then the body runs eagerly
    replays: int = 0


def bucket_for(rows: int, buckets: tuple[int, ...]) -> int | None:
    """Smallest of ``buckets`` holding ``rows``; None when the batch exceeds every one."""
    return next((b for b in buckets if b >= rows), None)


class GraphRunner:
    """``make_inputs(size)`` allocates a bucket's static inputs; ``body(inputs) -> outputs`` is
    the step to capture; ``pad`` gives each input's inert value for padded rows."""

    def __init__(self, adapter: GraphAdapter, buckets: tuple[int, ...],
                 make_inputs: Callable[[int], Tensors], body: Callable[[Tensors], Tensors],
                 pad: Mapping[str, Any], on_fallback: Callable[[str], None],
                 warmup: int = 2) -> None:
        if not buckets or list(buckets) != sorted(set(buckets)) or buckets[0] < 1:
            raise InvalidInputError(f"buckets must be increasing positive sizes, got {buckets}")
        self.adapter, self.buckets = adapter, tuple(buckets)
        self.make_inputs, self.body, self.pad = make_inputs, body, dict(pad)
        self.on_fallback, self.warmup = on_fallback, warmup
        self.pool = adapter.new_pool()
        self.state: dict[int, Bucket] = {}
        self.capture_s = 0.0          # warm-up + capture wall time, over all buckets

    def bucket_for(self, rows: int) -> int | None:
        """Smallest bucket holding ``rows``; None when the batch exceeds every bucket."""
        return bucket_for(rows, self.buckets)

    def run(self, live: Tensors) -> Tensors:
        rows = next(iter(live.values())).shape[0]
        size = self.bucket_for(rows)
        if size is None:
            self.on_fallback(f"batch of {rows} exceeds the largest graph bucket "
                             f"({self.buckets[-1]}): ran eagerly")
            return self.body(live)
        b = self.state.get(size) or self._new_bucket(size)
        for name, buf in b.inputs.items():
            buf[:rows].copy_(live[name])
            if rows < size:
                buf[rows:].fill_(self.pad[name])
        if b.graph is None and not b.eager:
            self._capture(b)
        if b.eager:
            self.on_fallback(b.eager)             # in the stats of every run that uses it
            b.outputs = self.body(b.inputs)
        else:
            b.graph.replay()
            b.replays += 1
        return {name: out[:rows] for name, out in b.outputs.items()}

    def _new_bucket(self, size: int) -> Bucket:
        b = Bucket(size, self.make_inputs(size))
        self.state[size] = b
        return b

    def _capture(self, b: Bucket) -> None:
        start = time.perf_counter()
        try:
            self._warm_and_capture(b)
        finally:
            self.capture_s += time.perf_counter() - start

    def _warm_and_capture(self, b: Bucket) -> None:
        for _ in range(self.warmup):          # lazy init and autotuning happen before capture
            self.body(b.inputs)

        def fn() -> None:
            b.outputs = self.body(b.inputs)

        try:
            b.graph = self.adapter.capture(fn, self.pool)
        except GraphCaptureError as exc:
            b.eager = f"bucket {b.size}: {exc}; running it eagerly"
            self.pool = self.adapter.new_pool()   # a failed capture can leave its pool recording

    def close(self) -> None:
        """Release every captured graph now (not whenever the cyclic GC gets to it, which could
        be in the middle of another capture)."""
        for b in self.state.values():
            b.graph = None
            b.outputs = {}
        self.state.clear()
