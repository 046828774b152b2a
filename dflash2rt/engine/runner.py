"""The Runner: a decode engine's caches and step execution.

An Engine holds one Runner. ``start`` gives a run its batch state over the run's caches (the
kept static caches when the backend captures graphs, else caches made for the run);
``prefill`` and ``step`` run the step bodies (bodies.py, over the functions of stages.py)
through the run's ``Mode`` of each block size (mode.py: eager, or replayed from graphs) and
make each step's one device→host transfer; ``trial`` runs a step whose results are discarded
(adaptive calibration, the cost bench). ``timer``: an optional hook every body run goes
through (the profiler's synced timing).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from ..backend import Backend
from ..errors import InvalidInputError
from ..graphs.runner import GraphRunner, SharedPool, bucket_for
from ..models.kv_cache import KVCache
from ..models.pair import ModelPair
from ..ops.procs import unpack_logprobs
from ..watermark import DEFAULT_CONTEXT_WIDTH, WatermarkKey
from ..watermark.generate import WatermarkBatch, capacity_for
from . import stages
from .bodies import StepBodies, StepOut, Tensors, pack_flags, raise_flags
from .memory import make_caches
from .mode import (BUCKETS, BodyTimer, GraphStats, Mode, Report, graph_delta,
                   merge_graph_stats)
from .request import Request
from .state import BatchState, new_state

LEN_STEP = 256      # cache lengths round up to this, so later generate() calls fit the graphs
Check = Callable[[list], None]


@dataclass
class Step:
    """One decode step as the host sees it, right after its one device→host transfer."""

    rows: list[int]            # the batch's request indices the step ran on
    block: int                 # its block size (1: a target-only step)
    width: int                 # B: the tokens per row in ``host`` (1 for target-only)
    host: list[list[int]]      # per row: accepted, flags, the B tokens (then packed logprobs)
    t0: float                  # perf_counter at the step's start (after any catch-up)
    host_t0: float             # where the step's host time starts (graphs: after the sync)
    device_s: float            # graphs: launch + the wait at the sync (else 0)
    capture_s: float           # graph warm-up and capture inside the step
    catch_up_s: float = 0.0    # deferred draft context projected before the step
    deferred: int = 0          # the positions that catch-up projected

    @property
    def accepted(self) -> list[int]:
        return [h[0] for h in self.host]

    def tokens(self, i: int) -> list[int]:
        """Row i's committed tokens."""
        return self.host[i][2:3 + self.host[i][0]]

    def logprobs(self, i: int, st: BatchState) -> list | None:
        """Row i's committed tokens' log-probabilities, or None when the batch asks none."""
        if st.procs is None or st.procs.logprobs is None:
            return None
        h, b = self.host[i], self.width
        return unpack_logprobs(h[2 + b:], b, st.procs.logprobs, st.procs.wants[i])[:h[0] + 1]


class Runner:
    """Caches and step execution of one Engine (module docstring). Graphs and static caches
    are kept across runs (``close`` releases them); a run's modes, the part of capture time
    and graph counters it used, and its deferred draft context are the current run's."""

    def __init__(self, pair: ModelPair, backend: Backend) -> None:
        self.pair, self.backend = pair, backend
        self.timer: BodyTimer | None = None          # profiling: wraps every body run
        self.static: tuple[KVCache, KVCache | None] | None = None   # the graphs' caches
        self._pool: SharedPool | None = None      # the one graph memory pool of every mode
        self._graphed: dict[tuple, Mode] = {}
        self._start_run(None, True, lambda m: None, {}, None)

    # ---- a run -------------------------------------------------------------------------------
    def start(self, requests: Sequence[Request], spec: bool, room: int,
              watermark: WatermarkKey | None, report: Report, clock: dict[str, float],
              check: Check | None = None) -> BatchState:
        """A run's batch state, its caches with room for ``room`` (the largest block a step may
        take): the kept static caches when the backend captures graphs, else caches made for
        this run. ``report``: the run's fallbacks; ``clock``: the time dict eager bodies add
        their seconds to; ``check``: called with every step's host rows (Engine.step_check)."""
        max_len, n = self.max_len(requests, room), len(requests)
        if self.backend.graph_adapter is not None:
            self._ensure_static(bucket_for(n, BUCKETS) or n, max_len)
            caches = self.static
        else:
            caches = make_caches(self.pair, self.backend.device, n, max_len, spec)
        wm = None if watermark is None else WatermarkBatch.build(
            watermark, [q.prompt_ids for q in requests],
            capacity_for(max(q.params.max_new_tokens for q in requests) + room + 1),
            DEFAULT_CONTEXT_WIDTH, self.backend.device)
        st = new_state(requests, *caches, self.backend.device, self.pair.target.cfg.vocab_size,
                       wm)
        for model in (self.pair.target, self.pair.draft):   # the rope tables the caches need,
            if model is not None:                             # made outside any graph capture
                model.rope_table(self.backend.device, self.pair.dtype, caches[0].max_len)
        self._start_run(st, spec, report, clock, check)
        return st

    def _start_run(self, st: BatchState | None, spec: bool, report: Report,
                   clock: dict[str, float], check: Check | None) -> None:
        self._first, self._spec, self._report, self._clock = st, spec, report, clock
        self._check, self._pending = check, 0    # target-only steps since the last spec step
        self._used: dict[int, tuple[Mode, float, GraphStats]] = {}
        self._scratch: dict[str, float] = dict.fromkeys(("draft", "verify"), 0.0)

    def max_len(self, requests: Sequence[Request], block: int) -> int:
        """Cache rows a batch needs: prompt + new tokens + one block in flight."""
        max_len = max(len(q.prompt_ids) + q.params.max_new_tokens for q in requests) + block + 1
        a = self.pair.target.cfg
        if max_len > a.max_position_embeddings + block + 1:
            raise InvalidInputError(f"prompt + max_new_tokens ({max_len - block - 1}) exceeds the "
                                    f"target's max_position_embeddings={a.max_position_embeddings}")
        return max_len

    def prefill(self, st: BatchState, prompts: list[tuple[int, ...]]) -> list[list[int]]:
        """Prefill (stages.prefill) and its one device→host transfer: per row [token, flags,
        packed logprobs...]; raises on bad flags; mirrors the lengths on the host."""
        first = stages.prefill(self.pair, st, self.backend, prompts)
        host = torch.cat([torch.stack([first.token, pack_flags(first.bad)], 1)]
                         + ([first.logprobs] if first.logprobs is not None else []),
                         1).tolist()                                       # prefill's sync
        if self._check is not None:
            self._check(host)
        raise_flags([h[1] for h in host], st.rows)
        st.host_lens[:] = [len(p) for p in prompts]                        # mirrors st.lens = n
        return host

    def step(self, st: BatchState, block: int,
             between: Callable[[Tensors], None] | None = None) -> Step:
        """One decode step of ``block`` (1: target-only): a speculative step after target-only
        steps of a speculative run first projects their deferred draft context; the bodies;
        lengths, anchors and the device states committed; the step's one device→host
        transfer; bad flags raised. The host work (tokens out, lengths) is the caller's."""
        deferred, caught = self.settle(st) if block > 1 else (0, 0.0)   # deferred context
        if self._spec:
            self._pending = self._pending + 1 if block == 1 else 0
        mode, t0 = self._mode(block), time.perf_counter()
        cap0 = mode.capture_s
        res = mode.step(st, self._report, self._clock, between, self.timer)
        _commit(st, res)
        t1 = time.perf_counter()
        host = res.for_host().tolist()       # the step's one device→host sync: [R, 2 + B]
        if self._check is not None:
            self._check(host)
        device_s = 0.0
        if mode.adapter is not None:         # launch + the wait for the graphs at the sync
            t1 = time.perf_counter()
            device_s = t1 - t0
        raise_flags([h[1] for h in host], st.rows)
        return Step(list(st.rows), block, res.tokens.shape[1], host, t0, t1, device_s, mode.capture_s - cap0,
                    caught, deferred)

    def settle(self, st: BatchState | None) -> tuple[int, float]:
        """Project now the draft context that target-only steps deferred, for every row of
        ``st`` (a speculative ``step`` does it first; a server before rows that have none
        deferred join the batch) → (positions projected, seconds). None or an empty batch:
        nothing deferred is kept."""
        pending, self._pending = self._pending, 0
        if not pending or st is None or not st.size:
            return 0, 0.0
        t0 = time.perf_counter()
        stages.catch_up_draft(self.pair, st, pending)
        return pending, time.perf_counter() - t0

    def trial(self, st: BatchState, block: int,
              between: Callable[[Tensors], None] | None = None,
              clock: dict[str, float] | None = None) -> float:
        """A step whose results are discarded (nothing of ``st`` changes; cache rows past the
        committed lengths are scratch), run to its sync → seconds, capture excluded.
        ``clock``: where eager bodies add their seconds (default: a scratch dict)."""
        mode, t0 = self._mode(block), time.perf_counter()
        cap0 = mode.capture_s
        mode.step(st, self._report, self._scratch if clock is None else clock, between,
                  self.timer).for_host().tolist()
        return time.perf_counter() - t0 - (mode.capture_s - cap0)

    def _mode(self, block: int) -> Mode:
        """The run's mode of ``block``, made on first use (its capture seconds and graph
        counters taken then, so the run reports its own part)."""
        if block not in self._used:
            m = self._graphed_mode(block) if self.backend.graph_adapter is not None else \
                Mode(StepBodies(self.pair, self.backend, self._first.target_storage,
                                self._first.draft_storage,
                                block if self._spec and block > 1 else None), None)
            self._used[block] = (m, m.capture_s, m.graph_stats())
        return self._used[block][0]

    @property
    def blocks_used(self) -> list[int]:
        """The block sizes the current run has stepped (eager bodies bind its caches then)."""
        return sorted(self._used)

    def capture_s(self) -> float:
        """Seconds of graph warm-up and capture in the current run."""
        return sum(m.capture_s - c0 for m, c0, _ in self._used.values())

    def graphs(self) -> GraphStats:
        """The current run's graph counters (``merge_graph_stats`` of its modes' parts)."""
        return merge_graph_stats(graph_delta(g0, m.graph_stats())
                                 for _, (m, _, g0) in sorted(self._used.items()))

    # ---- kept across runs --------------------------------------------------------------------
    def _ensure_static(self, capacity: int, max_len: int) -> None:
        """The one set of static caches (every mode's graphs share them: runs go one at a time;
        the draft cache is made whenever there is a draft, so target-only first costs no
        re-capture later). A batch that does not fit (slots, rows rounded up to LEN_STEP)
        releases every graph, then grows the caches: graphs hold their pointers."""
        kept = self.static
        if kept is None or capacity > kept[0].batch_size or max_len > kept[0].max_len:
            if kept is not None:
                capacity, max_len = max(capacity, kept[0].batch_size), max(max_len, kept[0].max_len)
            self.close()
            self.static = make_caches(self.pair, self.backend.device, capacity,
                                      -(-max_len // LEN_STEP) * LEN_STEP,
                                      self.pair.draft is not None)

    def _graphed_mode(self, block: int) -> Mode:
        """The kept graphed mode: ("spec", b) (b = 1: a target-only step that keeps the
        draft's context hidden for a later catch-up, for adaptive runs) or ("target-only",)."""
        key = ("spec", block) if self._spec else ("target-only",)
        if key not in self._graphed:
            caches = self.static if self._spec else (self.static[0], None)
            if self._pool is None:
                self._pool = SharedPool(self.backend.graph_adapter)
            self._graphed[key] = Mode(
                StepBodies(self.pair, self.backend, *caches, block if block > 1 else None),
                self.backend.graph_adapter, self._pool)
        return self._graphed[key]

    def captured(self) -> dict[tuple, dict[tuple, GraphRunner]]:
        """The kept graphed modes, ("spec", b) or ("target-only",), and each one's graph
        runners by (body, sampled, graphed extensions: (class, graph key) each)."""
        return {key: dict(m.runners) for key, m in self._graphed.items()}

    def close(self) -> None:
        """Release the captured graphs and the static caches now."""
        for m in self._graphed.values():
            m.close()
        self._graphed.clear()
        self.static = None
        self._pool = None


def _commit(st: BatchState, res: StepOut) -> None:
    """A step's new lengths and anchors, and the committed tokens into every row extension's
    device state (the logit processors' counts, the watermark's contexts, the constraints')."""
    st.lens.copy_(res.lens)
    st.anchor.copy_(res.anchor)
    stages.commit(st, res.tokens, res.accept_len + 1)
