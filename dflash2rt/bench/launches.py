"""Kernel launches per decode step and per prefill, counted on the CPU as a device runs them.

The engine's own ``Runner`` runs (``start`` + ``prefill``, then ``step``) over the meta-device
copy of the pair that compiling ahead uses (``engine.precompile.meta_pair``) and meta caches,
so every branch taken is the one a device takes (no CPU-only shortcut) and nothing computes:

* **Triton**: each kernel launch (``kernels.launch``: collected, not run);
* **torch**: each aten op with a meta tensor among its inputs or outputs that a device runs as
  a kernel: views, aliases and allocations (``empty``) are not; ops on host tensors alone are
  host work and not counted;
* **transfers**: host→device copies (a host tensor made on or moved to the device) and
  device→host reads (``tolist``, ``item``, ``cpu`` ...): each one waits for the device from
  pageable memory. A read returns zeros here (the meta tensor has no values): the counted code
  must not branch on what it read, which the Runner's step and prefill do not.

With ``graphs`` the backend gets a stand-in graph adapter whose replay re-runs the captured body
(counted as **in graphs**) and keeps its outputs in the captured tensors, as a device graph
writes into them, so a step counts what a graphed step launches: the copies into the graphs'
static inputs and the rest of the step outside them, plus the graphs' kernels. The
first steps of a mode capture and check their graphs; the count is a later step's (every later
step counts the same: ``steady``). Counts are deterministic: tests pin them by upper bounds.
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass
from typing import Any, Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from ..backend import Backend
from ..engine.precompile import meta_pair
from ..engine.request import Request, SamplingParams
from ..engine.runner import Runner
from ..kernels.launch import Launches, collecting
from ..models.pair import ModelPair

META = torch.device("meta")
# aten ops that run no device kernel: allocation and metadata (views are found by ``is_view``)
FREE = frozenset({"empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided",
                  "lift_fresh", "lift_fresh_copy", "_unsafe_view", "_reshape_alias",
                  "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "is_same_size",
                  "_has_compatible_shallow_copy_type", "promote_types", "resize_",
                  "set_", "_local_scalar_dense", "record_stream"})
READS = frozenset({"tolist", "item", "cpu", "numpy", "__bool__", "__int__", "__float__",
                   "__index__", "nonzero"})          # device→host: each waits for the device
MADE = frozenset({"tensor", "as_tensor", "asarray"})  # host data → device tensor


@dataclass
class Count:
    """Launches of one counted stretch (a step, a prefill); ``graph_*``: of them, inside graph
    replays."""

    triton: int = 0
    torch: int = 0
    h2d: int = 0
    d2h: int = 0
    graph_triton: int = 0
    graph_torch: int = 0

    @property
    def launches(self) -> int:
        return self.triton + self.torch

    @property
    def syncs(self) -> int:
        return self.h2d + self.d2h

    def row(self) -> dict[str, int]:
        return {**asdict(self), "launches": self.launches, "syncs": self.syncs}


def _on_meta(tree: Any) -> tuple[bool, bool]:
    """(a meta tensor in tree, a host tensor in tree)."""
    devs = {t.device.type for t in tree_leaves(tree) if isinstance(t, torch.Tensor)}
    return "meta" in devs, bool(devs - {"meta"})


class _Ops(TorchDispatchMode):
    """Counts the device kernels and host→device copies of aten ops (module docstring)."""

    def __init__(self, counter: "Counter") -> None:
        super().__init__()
        self.counter = counter

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.counter.paused:
            return out
        meta, host = _on_meta((args, kwargs, out))
        name = func.overloadpacket.__name__
        if meta and not func.is_view and name not in FREE:
            if host:
                self.counter.now.h2d += 1 if _on_meta(out)[0] else 0
            else:
                self.counter.bump("torch")
                self.counter.ops[name] = self.counter.ops.get(name, 0) + 1
        return out


class _Reads(torch.overrides.TorchFunctionMode):
    """Device→host reads of meta tensors counted and answered with zeros; host data made into
    a device tensor counted as a host→device copy."""

    def __init__(self, counter: "Counter") -> None:
        super().__init__()
        self.counter = counter

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in READS and args and isinstance(args[0], torch.Tensor) \
                and args[0].device == META:
            self.counter.now.d2h += 1
            t = args[0]
            if name == "nonzero":
                return torch.zeros(0, t.dim(), dtype=torch.int64, device=META)
            zeros = torch.zeros(t.shape, dtype=t.dtype)
            return zeros if name == "cpu" else zeros.numpy() if name == "numpy" else \
                getattr(zeros, name)()
        if name in MADE and kwargs.get("device") is not None \
                and torch.device(kwargs["device"]).type == "meta":
            self.counter.now.h2d += 1
        return func(*args, **kwargs)


class _Graph:
    def __init__(self, fn, counter: "Counter") -> None:
        self.fn, self.counter = fn, counter

    def replay(self) -> None:
        """The body again, counted as inside graphs; its outputs then copied (not counted)
        into the captured ones, which stay the bucket's, as a device graph's replay writes
        into them."""
        c, bucket = self.counter, getattr(self.fn, "bucket", None)
        kept = None if bucket is None else bucket.outputs
        c.in_graph += 1
        before = c.launches.count
        try:
            self.fn()
        finally:
            c.in_graph -= 1
            c.now.graph_triton += c.launches.count - before
        if kept:
            c.paused += 1
            try:
                for name, t in bucket.outputs.items():
                    kept[name].copy_(t)
            finally:
                c.paused -= 1
            bucket.outputs = kept


class CountingAdapter:
    """A stand-in graph adapter: capture runs the body once, replay runs it again (counted as
    inside graphs)."""

    name = "counting"

    def __init__(self, counter: "Counter") -> None:
        self.counter = counter

    def new_pool(self) -> None:
        return None

    def capture(self, fn, pool) -> _Graph:
        fn()
        return _Graph(fn, self.counter)


class Counter:
    """Counts launches: ``measure(fn)`` → (fn's result, its ``Count``)."""

    def __init__(self) -> None:
        self.now, self.in_graph, self.paused = Count(), 0, 0
        self.launches = Launches()
        self.ops: dict[str, int] = {}         # torch launches of the last stretch by aten op
        self.kernels: dict[str, int] = {}     # its Triton launches by kernel

    def bump(self, kind: str) -> None:
        setattr(self.now, kind, getattr(self.now, kind) + 1)
        if self.in_graph:
            setattr(self.now, f"graph_{kind}", getattr(self.now, f"graph_{kind}") + 1)

    def measure(self, fn) -> tuple[Any, Count]:
        self.now, self.ops = Count(), {}
        with collecting() as got, _Reads(self), _Ops(self):
            self.launches = got
            out = fn()
        self.now.triton, self.kernels = got.count, dict(got.calls)
        return out, self.now


def _mode(mp: ModelPair, backend: Backend, counter: Counter, reqs: list[Request], spec: bool,
          block: int, steps: int) -> tuple[Count, Count, list[Count]]:
    """(the run's start, its prefill, each of ``steps`` steps) of one mode on a fresh Runner."""
    runner = Runner(mp, backend)
    st, start = counter.measure(lambda: runner.start(reqs, spec, block, None,
                                                     lambda why: None, {}))
    _, pre = counter.measure(lambda: runner.prefill(st, [q.prompt_ids for q in reqs]))
    steps_ = [counter.measure(lambda: runner.step(st, block))[1] for _ in range(steps)]
    return start, pre, steps_


def count_launches(pair: ModelPair, backend: Backend, blocks: Iterable[int] = (8,),
                   temperatures: Iterable[float] = (0.0, 1.0), graphs: bool = True,
                   rows: int = 1, prompt_len: int = 64, steps: int = 4) -> dict[str, Any]:
    """Per temperature: a run's start (``Runner.start``: its batch state) and the prefill of
    ``rows`` prompts of ``prompt_len`` tokens, a target-only step and a speculative step at
    each block of ``blocks``, counted on ``backend`` as its device runs them (module
    docstring; ``graphs``: as a graphed step) → {"T=t": {"start": row, "prefill": row,
    "target-only": row, "spec 8": row, ...}} (``Count.row``; a step's row also says whether
    its last two steps counted the same: ``steady``)."""
    mp = meta_pair(pair)
    counter = Counter()
    twin = copy.copy(backend)
    twin.device = META
    twin.graph_adapter = CountingAdapter(counter) if graphs else None
    out: dict[str, Any] = {}
    for t in temperatures:
        per: dict[str, Any] = {}
        reqs = [Request(tuple(range(1, prompt_len + 1)),
                        SamplingParams(max_new_tokens=64, temperature=t, seed=i))
                for i in range(rows)]
        modes = [("target-only", False, 1)] + [(f"spec {b}", True, b) for b in blocks
                                               if mp.draft is not None]
        for label, spec, block in modes:
            with torch.no_grad(), twin.run_context():
                start, pre, counts = _mode(mp, twin, counter, reqs, spec, block, steps)
            if label == "target-only":
                per["start"], per["prefill"] = start.row(), pre.row()
            per[label] = {**counts[-1].row(), "steady": counts[-1] == counts[-2],
                          "kernels": dict(sorted(counter.kernels.items())),
                          "ops": dict(sorted(counter.ops.items(), key=lambda kv: -kv[1]))}
        out[f"T={t:g}"] = per
    return out


def launches_text(res: dict[str, Any]) -> str:
    """``count_launches``'s result as a table: one line per temperature and stretch."""
    lines = [f"{'':4} {'':12} {'launches':>8} {'triton':>7} {'torch':>6} {'in graphs':>9} "
             f"{'h2d':>4} {'d2h':>4}"]
    for t, per in res.items():
        for kind, r in per.items():
            lines.append(f"{t:4} {kind:12} {r['launches']:8d} {r['triton']:7d} {r['torch']:6d} "
                         f"{r['graph_triton'] + r['graph_torch']:9d} {r['h2d']:4d} "
                         f"{r['d2h']:4d}")
    return "\n".join(lines)
