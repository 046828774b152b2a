"""The bucketed graph runner: static buffers per batch-size bucket, eager warm-up before
capture, replay by copying live rows into ``[:R]`` and inert padding into ``[R:]`` (per-run
constants only when they change, and nothing where the buffer already is the source).

A step body reads only its static inputs and writes only its static outputs (and, through
them, nothing that belongs to a live request: padded rows get inert values, and outputs are
returned as ``[:R]`` views). Its side effects (KV commits) are idempotent for the same inputs.

Proof of replay, twice per bucket: right after a capture the runner replays the graph once over
the same static inputs and compares its discrete outputs (integer and bool tensors: tokens,
accept lengths, flags, lens, anchors) bit for bit with the last eager warm-up run's (that
checked replay is the step's result); and the first replay on the next, fresh inputs is
compared with an eager run of the body on them (a capture that baked an input value in passes
the first check, never this one; the eager run's commits rewrite what the replay committed,
as the same inputs give the same values). A bucket whose capture fails, or whose checked
replay differs (HIP capture has not always reported its errors), runs eagerly from then on,
and that is reported through the ``report`` given to ``run`` (the current run's fallbacks:
runners outlive runs) every time it is used. ``stats()`` counts, per bucket, replays and eager
runs, and each bucket's capture wall time (``capture_ms``: warm-up, capture and checked replay;
``warmup_ms``: its eager warm-up, where anything not compiled ahead would compile).

Memory: every runner of an engine captures into one ``SharedPool`` (their steps run one after
another, never at once), so the graphs' intermediates share memory instead of each runner
holding its largest bucket's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch

from ..errors import InvalidInputError
from .adapter import Graph, GraphAdapter, GraphCaptureError, warm_up_on

Tensors = dict[str, torch.Tensor]


@dataclass
class Bucket:
    size: int
    inputs: Tensors = field(repr=False)     # static buffers (a watermark's key words among them)
    outputs: Tensors = field(default_factory=dict, repr=False)
    graph: Graph | None = None
    eager: str = ""              # why capture failed or replay differed: the body runs eagerly
    verified: bool = False       # the post-capture replay equalled the eager warm-up
    fresh: bool | None = None    # the first replay on fresh inputs equalled eager (None: not yet)
    staged: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)  # constants'
    rows: int = 0                # the live rows of the last staging
    replays: int = 0             # replays whose outputs were used (the checked one included)
    eager_runs: int = 0          # runs of the body in place of a replay (not the warm-up)
    capture_s: float = 0.0       # wall time of its warm-up + capture + checked replay
    warmup_s: float = 0.0        # of which the eager warm-up (lazy init, any JIT compile)


class _Capture:
    """What a bucket's graph captures: the body over its static inputs, whose outputs become
    ``bucket.outputs`` (a device graph's replays write into those same tensors)."""

    def __init__(self, body: Callable[[Tensors], Tensors], bucket: Bucket) -> None:
        self.body, self.bucket = body, bucket

    def __call__(self) -> None:
        self.bucket.outputs = self.body(self.bucket.inputs)


def bucket_for(rows: int, buckets: tuple[int, ...]) -> int | None:
    """Smallest of ``buckets`` holding ``rows``; None when the batch exceeds every one."""
    return next((b for b in buckets if b >= rows), None)


class SharedPool:
    """The graph memory pool the runners of one engine capture into (steps run one at a time).
    A capture that fails can leave its pool recording: ``renew`` gives later captures a new one."""

    def __init__(self, adapter: GraphAdapter) -> None:
        self.adapter, self.handle, self.renewed = adapter, adapter.new_pool(), 0

    def renew(self) -> None:
        self.handle = self.adapter.new_pool()
        self.renewed += 1


class GraphRunner:
    """``make_inputs(size)`` allocates a bucket's static inputs; ``body(inputs) -> outputs`` is
    the step to capture; ``pad`` gives each input's inert value for padded rows; ``pool``: the
    engine's ``SharedPool`` (None: a pool of this runner's own)."""

    def __init__(self, adapter: GraphAdapter, buckets: tuple[int, ...],
                 make_inputs: Callable[[int], Tensors], body: Callable[[Tensors], Tensors],
                 pad: Mapping[str, Any], warmup: int = 2, name: str = "",
                 pool: SharedPool | None = None, constants: frozenset[str] = frozenset()
                 ) -> None:
        if not buckets or list(buckets) != sorted(set(buckets)) or buckets[0] < 1:
            raise InvalidInputError(f"buckets must be increasing positive sizes, got {buckets}")
        self.adapter, self.buckets = adapter, tuple(buckets)
        self.make_inputs, self.body, self.pad = make_inputs, body, dict(pad)
        self.warmup, self.name = max(1, warmup), name
        self.constants = constants      # inputs never written in place (per-run constants)
        self.pool = pool if pool is not None else SharedPool(adapter)
        self.state: dict[int, Bucket] = {}
        self.capture_s = 0.0          # warm-up + capture wall time, over all buckets

    def run(self, live: Tensors, report: Callable[[str], None]) -> Tensors:
        """The step's outputs for the live rows (``[:R]`` views of the bucket's outputs);
        ``report(why)`` names every eager run in place of a replay."""
        if not live:
            raise InvalidInputError(f"graph runner {self.name!r}: a step needs its live input "
                                    "tensors, got none")
        rows = next(iter(live.values())).shape[0]
        size = bucket_for(rows, self.buckets)
        if size is None:
            report(f"batch of {rows} exceeds the largest graph bucket ({self.buckets[-1]}): "
                   "ran eagerly")
            return self.body(live)
        b = self.state.get(size) or self._new_bucket(size)
        self._stage(b, live, rows)
        checked = b.graph is None and not b.eager
        if checked:
            self._capture(b)        # warm-up, capture, one checked replay of these inputs
        ran = False                               # the body already ran on these inputs
        if not b.eager and not checked:            # the checked replay is this step's result
            b.graph.replay()
            if b.fresh is None:
                ran = self._check_fresh(b)
        if b.eager:
            report(b.eager)                       # in the stats of every run that uses it
            if not ran:
                b.outputs = self.body(b.inputs)
            b.eager_runs += 1
        else:
            b.replays += 1
        return {name: out[:rows] for name, out in b.outputs.items()}

    def _stage(self, b: Bucket, live: Tensors, rows: int) -> None:
        """Each live input into its static buffer's rows [:rows], inert padding into the rest;
        nothing for an input whose source already is those rows (a buffer the step before
        wrote: the draft graph's outputs that the verify graph reads; its padded rows then
        hold what that body computed for its own inert padded rows), nor for a per-run
        constant (``constants``) staged from this very tensor at this row count."""
        same_rows = rows == b.rows
        b.rows = rows
        for name, buf in b.inputs.items():
            src, dst = live[name], buf[:rows]
            if same_memory(src, dst):
                continue
            if name in self.constants:
                if same_rows and b.staged.get(name) is src:
                    continue
                b.staged[name] = src
            dst.copy_(src)
            if rows < b.size:
                buf[rows:].fill_(self.pad[name])

    def _check_fresh(self, b: Bucket) -> bool:
        """The first replay on inputs other than the capture's against an eager run of the
        body on them; a difference turns the bucket eager, with the eager outputs as this
        step's (→ True)."""
        got = discrete(b.outputs)
        eager = self.body(b.inputs)
        diff = first_difference(discrete(eager), got)
        b.fresh = not diff
        if diff:
            b.graph, b.outputs = None, eager
            b.eager = (f"graph replay of {self._label(b.size)} differed from eager on fresh "
                       f"inputs: {diff}; running it eagerly")
        return bool(diff)

    def _new_bucket(self, size: int) -> Bucket:
        b = Bucket(size, self.make_inputs(size))
        self.state[size] = b
        return b

    def _capture(self, b: Bucket) -> None:
        start = time.perf_counter()
        try:
            self._warm_and_capture(b)
        finally:
            b.capture_s = time.perf_counter() - start
            self.capture_s += b.capture_s

    def _label(self, size: int) -> str:
        return f"bucket {size}" + (f" ({self.name})" if self.name else "")

    def _warm_and_capture(self, b: Bucket) -> None:
        start = time.perf_counter()
        with warm_up_on(self.adapter):        # on the stream the capture will use
            for _ in range(self.warmup):      # lazy init and autotuning happen before capture
                eager = self.body(b.inputs)
        want = discrete(eager)                # the eager result for these static inputs
        b.warmup_s = time.perf_counter() - start

        try:
            b.graph = self.adapter.capture(_Capture(self.body, b), self.pool.handle)
        except Exception as exc:  # noqa: BLE001 - any refusal is reported; the bucket runs eagerly
            why = str(exc) if isinstance(exc, GraphCaptureError) else (
                f"{getattr(self.adapter, 'name', 'graph')} capture raised "
                f"{type(exc).__name__}: {exc}")
            b.eager = f"{self._label(b.size)}: {why}; running it eagerly"
            self.pool.renew()                     # a failed capture can leave its pool recording
            return
        # Same static inputs as the warm-up, whose commits are idempotent: the replay must
        # reproduce the warm-up's discrete outputs exactly.
        try:
            b.graph.replay()
            diff = first_difference(want, b.outputs)
        except Exception as exc:  # noqa: BLE001 - a replay that raises is a differing replay
            diff = f"replay raised {type(exc).__name__}: {exc}"
        if diff:                 # the eager run that follows rewrites what the replay committed
            b.graph, b.outputs = None, {}
            b.eager = (f"graph replay of {self._label(b.size)} differed from eager: {diff}; "
                       "running it eagerly")
        else:
            b.verified = True

    def stats(self) -> dict[int, dict[str, Any]]:
        """Per bucket made so far: captured (it holds a graph that passed the post-capture check),
        verified, replays and eager runs so far, why it runs eagerly (refused: the capture
        refusal or the replay difference; None when it replays), and its capture's wall
        milliseconds (``capture_ms``: warm-up + capture + checked replay, ``warmup_ms`` the
        warm-up's part; 0 before its capture)."""
        return {size: {"captured": b.graph is not None, "verified": b.verified,
                       "fresh": b.fresh, "replays": b.replays, "eager": b.eager_runs,
                       "refused": b.eager or None, "capture_ms": 1e3 * b.capture_s,
                       "warmup_ms": 1e3 * b.warmup_s}
                for size, b in sorted(self.state.items())}

    def close(self) -> None:
        """Release every captured graph now (not whenever the cyclic GC gets to it, which could
        be in the middle of another capture)."""
        for b in self.state.values():
            b.graph = None
            b.outputs = {}
        self.state.clear()


def same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether a and b are the same elements of one storage (the storage itself compared, not
    its address: shape-only tensors all have address 0)."""
    return a.untyped_storage()._cdata == b.untyped_storage()._cdata \
        and a.storage_offset() == b.storage_offset() and a.shape == b.shape \
        and a.stride() == b.stride() and a.dtype == b.dtype


def discrete(outputs: Mapping[str, torch.Tensor]) -> Tensors:
    """Copies of the integer and bool outputs (tokens, lengths, flags): those must match bit
    for bit between a replay and the eager run of the same inputs."""
    return {n: t.detach().clone() for n, t in outputs.items()
            if not (t.is_floating_point() or t.is_complex())}


def first_difference(want: Tensors, got: Mapping[str, torch.Tensor]) -> str:
    """'' when every tensor of ``want`` is in ``got`` with equal shape, dtype and values; else
    what differs first (name, count, first index, both values)."""
    for n, w in want.items():
        g = got.get(n)
        if g is None:
            return f"{n} missing from the replay's outputs"
        if g.shape != w.shape or g.dtype != w.dtype:
            return f"{n}: eager {w.dtype} {tuple(w.shape)}, replay {g.dtype} {tuple(g.shape)}"
        ne = (g != w).nonzero()
        if len(ne):
            i = tuple(ne[0].tolist())
            return (f"{n}: {len(ne)} of {w.numel()} values differ, first at {list(i)}: "
                    f"eager {w[i].item()}, replay {g[i].item()}")
    return ""
