"""A decode step of one mode, eager or replayed from graphs.

A ``Mode`` runs one step of one mode (a speculative block, or a target-only step) for a batch:
eagerly, each body of ``bodies.StepBodies`` on the live rows, or with a graph adapter through
one bucketed GraphRunner per body and sampling mode over the Runner's static caches (draft +
conv + selector + walk in one graph, verify + accept + commit in another; target-only forward
+ sample + commit in one). Per-request parameters are static tensors (select, not branch);
padded rows are inert: greedy, length 0, and they commit nothing (``live`` False). Also the
graph counters' per-run arithmetic (``graph_delta``, ``merge_graph_stats``).
"""

from __future__ import annotations

import functools
import time
from typing import Any, Callable

import torch

from ..graphs.adapter import GraphAdapter
from ..graphs.runner import GraphRunner, SharedPool
from . import stages
from .bodies import NOISE, StepBodies, StepOut, Tensors, live_inputs
from .extensions import EAGER_PROCS, RowExtension
from .state import BatchState

BUCKETS = (1, 2, 4, 8, 16, 32)
_PARAMS = {"anchor": (torch.int64, 0), "lens": (torch.int64, 0), "seed": (torch.int64, 0),
           "key": (torch.int64, 0), "temperature": (torch.float32, 0.0),
           "top_k": (torch.int64, 0), "top_p": (torch.float32, 1.0), "greedy": (torch.bool, True),
           "live": (torch.bool, False)}
# Inputs fixed for a whole run and never written in place: staged only when they change.
CONSTANTS = frozenset(("seed", "key", "temperature", "top_k", "top_p", "greedy", "live"))
# The draft body's outputs (with the positions, lengths and anchors it read), which the verify
# graph reads in place (``static_inputs``).
DRAFTED = ("draft", "cand", "q", "draft_bad", "lattice_bad", *NOISE, "pos", "lens", "anchor")
GraphStats = dict[str, dict[int, dict[str, Any]]]     # graph name → bucket → counters
Report = Callable[[str], None]
# A hook every body run goes through: (kind, block, clock, run) → run()'s result; kind is
# "draft", "verify" or "target-only", clock the time dict the step's eager bodies add to.
BodyTimer = Callable[[str, int, dict, Callable[[], Tensors]], Tensors]
# A captured graph's row extensions: per graphed extension its class and ``graph_key()``.
GraphExts = tuple[tuple[type[RowExtension], Any], ...]


class Mode:
    """One decode step of one mode (``bodies.block`` None: target-only) for a BatchState:
    eagerly, each body on the live rows (timed per body into ``clock``), or with a graph
    adapter through GraphRunners kept across generate() calls, what runs eagerly reported to
    the current run's ``report``. A batch that is ``eager_only`` (min-p, or an extension whose
    state graphs do not take: logit processors, logprobs, constraints) runs its bodies eagerly
    over the same caches, reported. A batch with graphed extensions (the watermark) replays
    graphs of its own (their state is static inputs, sized by their ``graph_key``)."""

    def __init__(self, bodies: StepBodies, adapter: GraphAdapter | None,
                 pool: SharedPool | None = None) -> None:
        self.bodies, self.adapter, self.pool = bodies, adapter, pool
        self.block = bodies.block or 1
        self.runners: dict[tuple, GraphRunner] = {}

    def step(self, st: BatchState, report: Report, clock: dict[str, float],
             between: Callable[[Tensors], None] | None = None,
             timer: BodyTimer | None = None) -> StepOut:
        """The step's device results. ``between(drafted)``: host work between a speculative
        step's draft and verify (generic constraint hooks' verify-row masks)."""
        live = live_inputs(st)
        if self.bodies.block is None:
            return StepOut.of(self._timed("target-only", st, live, report, clock, timer))
        drafted = self._timed("draft", st, live, report, clock, timer)
        if between is not None:
            between(drafted)
        return StepOut.of(self._timed("verify", st, {**live, **drafted}, report, clock, timer))

    def _timed(self, kind: str, st: BatchState, inp: Tensors, report: Report,
               clock: dict[str, float], timer: BodyTimer | None) -> Tensors:
        run = functools.partial(self._run, kind, st, inp, report, clock)
        return run() if timer is None else timer(kind, self.block, clock, run)

    def _body(self, kind: str):
        b = self.bodies
        return {"draft": b.draft, "verify": b.verify, "target-only": b.target_only}[kind]

    def _run(self, kind: str, st: BatchState, inp: Tensors, report: Report,
             clock: dict[str, float]) -> Tensors:
        sampled, impl = st.sampling.any_sampled, self.bodies.backend.implementation
        for ext in st.extensions:               # what the extensions run outside the backend's ops
            for what in ext.reports(kind, impl):
                report(what)
        if self.adapter is not None and not st.eager_only:
            exts = tuple((type(e), e.graph_key()) for e in st.extensions)
            return self._runner(kind, sampled, exts).run(inp, report)
        if self.adapter is not None:
            report(EAGER_PROCS)
        start = time.perf_counter()
        out = self._body(kind)(inp, sampled, max(st.host_lens), host=st)   # host facts too
        name = "draft" if kind == "draft" else "verify"
        clock[name] = clock.get(name, 0.0) + time.perf_counter() - start
        return out

    def _runner(self, kind: str, sampled: bool, exts: GraphExts) -> GraphRunner:
        """The runner of one body and sampling mode; ``exts``: the batch's graphed extensions
        (class, graph key), whose static inputs the key sizes."""
        key = (kind, sampled, exts)
        if key not in self.runners:
            self.runners[key] = GraphRunner(
                self.adapter, BUCKETS,
                functools.partial(self.static_inputs, kind, exts, drafted=sampled),
                self.graph_body(kind, sampled, exts), self._pads(kind, exts),
                name=f"{kind} {'sampled' if sampled else 'greedy'}"
                     + "".join(f" {cls.graph_label}" for cls, _ in exts), pool=self.pool,
                constants=CONSTANTS)
        return self.runners[key]

    def graph_body(self, kind: str, sampled: bool, exts: GraphExts
                   ) -> Callable[[Tensors], Tensors]:
        """The body a graph of ``kind`` captures: it reads only its static inputs."""
        return functools.partial(self._body(kind), sampled=sampled, ctx_len=None,
                                 graphed=tuple(cls for cls, _ in exts))

    def static_inputs(self, kind: str, exts: GraphExts, size: int,
                      drafted: bool | None = None) -> Tensors:
        """A bucket's static inputs: every row's parameters, for verify the draft's outputs,
        and each graphed extension's (the watermark's key words, window, record and count).
        ``drafted`` (verify; the sampling mode): where that mode's draft graph has captured
        this bucket, verify's draft inputs *are* its outputs, read in place (no copies)."""
        dev = self.bodies.storage[0].device
        out = {n: torch.full((size,), v, dtype=d, device=dev) for n, (d, v) in _PARAMS.items()}
        for cls, ext_key in exts:
            out.update(cls.static_inputs(ext_key, size, dev))
        if kind == "verify":
            g, k = self.bodies.block - 1, stages.selector_params(self.bodies.pair).top_k
            out.update(draft=torch.zeros(size, g, dtype=torch.int64, device=dev),
                       cand=torch.zeros(size, g, k, dtype=torch.int64, device=dev),
                       q=torch.zeros(size, g, k, device=dev),
                       draft_bad=torch.zeros(size, dtype=torch.bool, device=dev),
                       lattice_bad=torch.zeros(size, dtype=torch.bool, device=dev),
                       bonus=torch.full((size,), 0.5, device=dev),
                       pos=torch.zeros(size, g + 1, dtype=torch.int64, device=dev),
                       **{n: torch.full((size, g), 0.5, device=dev) for n in NOISE[:3]})
            draft = self.runners.get(("draft", drafted, exts))
            bucket = None if draft is None else draft.state.get(size)
            if bucket is not None and bucket.graph is not None:
                out.update({n: bucket.outputs[n] for n in DRAFTED})
        return out

    @staticmethod
    def _pads(kind: str, exts: GraphExts = ()) -> dict[str, Any]:
        """Each static input's inert value for padded rows."""
        pads = {n: v for n, (_, v) in _PARAMS.items()}
        for cls, _ in exts:
            pads.update(cls.pads())
        if kind == "verify":
            pads.update(draft=0, cand=0, q=0.0, draft_bad=False, lattice_bad=False, pos=0,
                        **{n: 0.5 for n in NOISE})
        return pads

    def close(self) -> None:
        """Release the graphs and their static buffers."""
        for r in self.runners.values():
            r.close()
        self.runners.clear()

    @property
    def capture_s(self) -> float:
        """Seconds spent warming up and capturing graphs so far (inside decode steps)."""
        return sum(r.capture_s for r in self.runners.values())

    def graph_stats(self) -> GraphStats:
        """Per graph ("draft greedy", "verify sampled", "target-only greedy", ...) and bucket
        since capture: captured, verified, replays, eager runs, refusal (GraphRunner.stats)."""
        return {r.name: r.stats() for r in self.runners.values()}


def graph_delta(before: GraphStats, after: GraphStats) -> GraphStats:
    """One run's part of ``graph_stats()`` (taken before and after it, same runners): the
    buckets the run used, with the run's replays and eager runs and each bucket's state."""
    out: GraphStats = {}
    for name, buckets in after.items():
        for size, s in buckets.items():
            was = before.get(name, {}).get(size, {})
            d = {**s, "replays": s["replays"] - was.get("replays", 0),
                 "eager": s["eager"] - was.get("eager", 0)}
            if d["replays"] or d["eager"]:
                out.setdefault(name, {})[size] = d
    return out


def merge_graph_stats(parts) -> GraphStats:
    """Graph stats keep their names across block sizes ("verify greedy"): per bucket, replays
    and eager runs are summed, captured / verified hold for every part, refused is the first
    refusal, and capture_ms / warmup_ms are the largest of the parts' (the longest stall; the
    calibration steps' replays are counted too)."""
    out: GraphStats = {}
    for part in parts:
        for name, buckets in part.items():
            for size, d in buckets.items():
                was = out.setdefault(name, {}).get(size)
                out[name][size] = d if was is None else {
                    "captured": was["captured"] and d["captured"],
                    "verified": was["verified"] and d["verified"],
                    "fresh": d["fresh"] if was["fresh"] is None else (
                        was["fresh"] if d["fresh"] is None else was["fresh"] and d["fresh"]),
                    "replays": was["replays"] + d["replays"],
                    "eager": was["eager"] + d["eager"], "refused": was["refused"] or d["refused"],
                    **{ms: max(was.get(ms, 0.0), d.get(ms, 0.0))
                       for ms in ("capture_ms", "warmup_ms")}}
    return out
