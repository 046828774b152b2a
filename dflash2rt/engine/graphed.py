"""Running one mode's step bodies (step.py): eagerly, each body on the live rows, or replayed
from graphs, one bucketed GraphRunner per body and sampling mode over the engine's static caches
(draft + conv + selector + walk in one graph, verify + accept + commit in another; target-only
forward + sample + commit in one, so both modes compare like for like).

Per-request temperatures and greedy flags are static tensors (select, not branch); one graph set
serves greedy-only batches and one serves batches with sampled requests. Padded rows are inert:
greedy, length 0, and they commit nothing (``live`` False) into their own unused slots.
"""

from __future__ import annotations

import functools
import time
from typing import Any, Callable

import torch

from ..backend import TORCH_OPS
from ..graphs.adapter import GraphAdapter
from ..graphs.runner import GraphRunner, SharedPool
from ..watermark import generate as wm_generate
from . import steps
from .state import BatchState
from .step import NOISE, StepBodies, StepOut, Tensors, live_inputs

BUCKETS = (1, 2, 4, 8, 16, 32)
LEN_STEP = 256      # cache lengths round up to this, so later generate() calls fit the graphs
_PARAMS = {"anchor": (torch.int64, 0), "lens": (torch.int64, 0), "seed": (torch.int64, 0),
           "key": (torch.int64, 0), "temperature": (torch.float32, 0.0),
           "top_k": (torch.int64, 0), "top_p": (torch.float32, 1.0), "greedy": (torch.bool, True),
           "live": (torch.bool, False)}
GraphStats = dict[str, dict[int, dict[str, Any]]]     # graph name → bucket → counters
EAGER_PROCS = ("steps of batches with logit processors, min-p, logprobs or constraints run "
               "eagerly (graphs do not take their state as inputs)")
CONSTRAINT_WALK_OPS = ("constrained steps walk the selector with torch ops (the walk's "
                       "constraint mask has no kernel)")
WATERMARK_OPS = ("watermarked steps select and verify with torch ops (this backend's kernels do "
                 "not run the keyed draws)")


class Stepper:
    """One decode step of one mode (``bodies.block`` None: target-only) for a BatchState.
    Without a graph adapter it is a runner that just calls each body on the live rows (reading
    the cache rows the batch holds, timed per body); with one, runners are kept across
    generate() calls and what runs eagerly is reported to the ``report`` of the current run.
    A batch that is ``eager_only`` (logit processors, min-p, logprobs: state the graphs do not
    take as inputs) runs its bodies eagerly over the same caches, and that is reported. A
    watermarked batch replays graphs of its own (its key words and state are static inputs,
    sized by the window width and record capacity)."""

    def __init__(self, bodies: StepBodies, adapter: GraphAdapter | None,
                 pool: SharedPool | None = None) -> None:
        self.bodies, self.adapter, self.pool = bodies, adapter, pool
        self.runners: dict[tuple[str, bool], GraphRunner] = {}

    def step(self, st: BatchState, report: Callable[[str], None],
             clock: dict[str, float],
             between: Callable[[Tensors], None] | None = None) -> StepOut:
        """The step's device results; eager bodies add their seconds to ``clock``.
        ``between(drafted)``: host work between a speculative step's draft and verify (the
        verify-row masks of generic constraint hooks)."""
        live = live_inputs(st)
        if self.bodies.block is None:
            return StepOut.of(self._run("target-only", st, live, report, clock))
        drafted = self._run("draft", st, live, report, clock)
        if between is not None:
            between(drafted)
        return StepOut.of(self._run("verify", st, {**live, **drafted}, report, clock))

    def _body(self, kind: str):
        b = self.bodies
        return {"draft": b.draft, "verify": b.verify, "target-only": b.target_only}[kind]

    def _run(self, kind: str, st: BatchState, inp: Tensors, report: Callable[[str], None],
             clock: dict[str, float]) -> Tensors:
        sampled = st.sampling.any_sampled
        if st.wm is not None and kind != "target-only":      # select_marked / verify_marked
            impl = self.bodies.backend.implementation
            if impl.get("watermark", TORCH_OPS) == TORCH_OPS \
                    and any(impl.get(op) != TORCH_OPS for op in ("select", "verify")):
                report(WATERMARK_OPS)
        if self.adapter is not None and not st.eager_only:
            marked = None if st.wm is None else st.wm.shape
            return self._runner(kind, sampled, marked).run(inp, report)
        if st.constraint is not None and kind == "draft" \
                and self.bodies.backend.implementation.get("select") != TORCH_OPS:
            report(CONSTRAINT_WALK_OPS)
        if self.adapter is not None:
            if st.procs is not None or st.sampling.min_p is not None \
                    or st.constraint is not None:
                report(EAGER_PROCS)
        start = time.perf_counter()
        out = self._body(kind)(inp, sampled, max(st.host_lens), host=st)   # host facts too
        clock["draft" if kind == "draft" else "verify"] += time.perf_counter() - start
        return out

    def _runner(self, kind: str, sampled: bool, marked: tuple[int, int] | None) -> GraphRunner:
        """The runner of one body and sampling mode; ``marked``: a watermarked batch's
        (window width, record capacity), which size its state's static inputs."""
        key = (kind, sampled, marked)
        if key not in self.runners:
            self.runners[key] = GraphRunner(
                self.adapter, BUCKETS, functools.partial(self._static_inputs, kind, marked),
                functools.partial(self._body(kind), sampled=sampled, ctx_len=None),
                self._pads(kind, marked),
                name=f"{kind} {'sampled' if sampled else 'greedy'}"
                     + (" watermarked" if marked else ""), pool=self.pool)
        return self.runners[key]

    def _static_inputs(self, kind: str, marked: tuple[int, int] | None, size: int) -> Tensors:
        """A bucket's static inputs: every row's parameters, for verify the draft's outputs,
        and for a watermarked batch its key words, window, record and count."""
        dev = self.bodies.storage[0].device
        out = {n: torch.full((size,), v, dtype=d, device=dev) for n, (d, v) in _PARAMS.items()}
        if marked is not None:
            width, capacity = marked
            out.update({n: torch.full(shape, wm_generate.PADS[n], dtype=torch.int64, device=dev)
                        for n, shape in zip(wm_generate.INPUTS, ((size, 9), (size, width),
                                                                 (size, capacity), (size,)))})
        if kind == "verify":
            g, k = self.bodies.block - 1, steps.selector_params(self.bodies.pair).top_k
            out.update(draft=torch.zeros(size, g, dtype=torch.int64, device=dev),
                       cand=torch.zeros(size, g, k, dtype=torch.int64, device=dev),
                       q=torch.zeros(size, g, k, device=dev),
                       draft_bad=torch.zeros(size, dtype=torch.bool, device=dev),
                       lattice_bad=torch.zeros(size, dtype=torch.bool, device=dev),
                       bonus=torch.full((size,), 0.5, device=dev),
                       **{n: torch.full((size, g), 0.5, device=dev) for n in NOISE[:3]})
        return out

    @staticmethod
    def _pads(kind: str, marked: tuple[int, int] | None = None) -> dict[str, Any]:
        """Each static input's inert value for padded rows."""
        pads = {n: v for n, (_, v) in _PARAMS.items()}
        if marked is not None:
            pads.update(wm_generate.PADS)
        if kind == "verify":
            pads.update(draft=0, cand=0, q=0.0, draft_bad=False, lattice_bad=False,
                        **{n: 0.5 for n in NOISE})
        return pads

    def close(self) -> None:
        """Release the graphs and their static buffers (Engine.close, also before the engine
        grows its caches)."""
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
