"""The engine: batches requests, runs prefill and the decode loop, streams tokens, keeps stats.

A decode step (decode.py): the mode's bodies (step.py, over the functions of steps.py) run
eagerly or replayed from graphs by a Stepper (graphed.py) and return a StepOut; the engine
commits its lengths and anchor, makes the step's one device→host transfer, and does the host
work. Speculative decoding is adaptive by default (``block_size=None``): ``Engine.schedule``
(schedule.py) picks each step's block size, 1 (a target-only step) included, from past
outcomes and its cost table; ``block_size=N`` decodes with a fixed block. What falls back
during a run goes to that run's Fallbacks and ends in its RunStats.
"""

from __future__ import annotations

import time
from typing import Callable, Hashable, Sequence

import torch

from ..backend import Backend, Fallbacks, same_device
from ..errors import InvalidInputError
from ..graphs.runner import SharedPool, bucket_for
from ..models.kv_cache import KVCache
from ..models.memory import memory_note
from ..models.pair import ModelPair
from ..ops.procs import unpack_logprobs
from . import steps
from .cost_table import cost_noise
from .decode import Steppers, calibrate, decode_step, drop_finished, host_masks
from .graphed import BUCKETS, LEN_STEP, Stepper
from .memory import make_caches
from .output import Collector
from .request import Request, RequestOutput, block_size_or_default
from .schedule import AdaptiveSchedule, bucket_of, shared_schedule
from .state import BatchState, new_state
from .step import StepBodies, pack_flags, raise_flags
from .stats import RunStats
from ..watermark import DEFAULT_CONTEXT_WIDTH, WatermarkKey
from ..watermark.generate import WatermarkBatch, capacity_for
from ..watermark.sampler import require_fp64

OnTokens = Callable[[int, list[int]], None]


def _law(requests: Sequence[Request]) -> Hashable:
    """What a batch's acceptance depends on besides the pair: its requests' shared
    (temperature, top_p, top_k), else "mixed" (the schedule's acceptance pool key)."""
    laws = {(q.params.temperature, q.params.top_p, q.params.top_k) for q in requests}
    return laws.pop() if len(laws) == 1 else "mixed"


class Engine:
    """Speculative (or target-only) decoding of a batch of requests on one backend."""

    def __init__(self, pair: ModelPair, backend: Backend) -> None:
        if not isinstance(backend, Backend):
            raise InvalidInputError(
                f"Engine needs a Backend, got {backend!r}: get one by name with "
                "dflash2rt.get_backend(name)")
        self.pair, self.backend = pair, backend
        self._graphed: dict[tuple, Stepper] = {}
        self._static: tuple[KVCache, KVCache | None] | None = None   # caches the graphs use
        self._pool: SharedPool | None = None    # the one graph memory pool of every stepper
        # The adaptive schedule: on the first adaptive run, one over the process's cost table
        # for this pair and device; assign one (e.g. a fixed table) to change it (schedule.py).
        self.schedule: AdaptiveSchedule | None = None
        # Called with each step's host rows (prefill's, then every decode step's) once the
        # step has committed them: a tensor-parallel run's cross-rank check (distributed/).
        self.step_check: Callable[[list], None] | None = None
        if pair.dtype not in backend.dtypes:
            raise InvalidInputError(
                f"backend {backend.name!r} does not run {pair.dtype} models (it supports "
                f"{', '.join(str(d).replace('torch.', '') for d in backend.dtypes)}); "
                "load the models in one of those dtypes")
        if not same_device(pair.device, backend.device):
            raise InvalidInputError(f"models are on {pair.device} but backend {backend.name!r} "
                                    f"runs on {backend.device}; load the models there")
        # Every run's first fallbacks: the backend's standing ones, then the model pass's.
        self._standing_fallbacks = Fallbacks(backend.standing_fallbacks)
        self.model_pass = backend.prepare_models(
            [m for m in (pair.target, pair.draft) if m is not None], self._standing_fallbacks)

    def _max_len(self, requests: Sequence[Request], block: int) -> int:
        """Cache rows a batch needs: prompt + new tokens + one block in flight."""
        max_len = max(len(q.prompt_ids) + q.params.max_new_tokens for q in requests) + block + 1
        a = self.pair.target.cfg
        if max_len > a.max_position_embeddings + block + 1:
            raise InvalidInputError(f"prompt + max_new_tokens ({max_len - block - 1}) exceeds the "
                                    f"target's max_position_embeddings={a.max_position_embeddings}")
        return max_len

    def _ensure_static(self, capacity: int, max_len: int) -> None:
        """The engine's one set of static caches (every mode's graphs share them: calls run one
        at a time; the draft cache is made whenever there is a draft, so target-only first costs
        no re-capture later). A batch that does not fit (slots, rows rounded up to LEN_STEP)
        releases every graph, then grows the caches: graphs hold their pointers."""
        kept = self._static
        if kept is None or capacity > kept[0].batch_size or max_len > kept[0].max_len:
            if kept is not None:
                capacity, max_len = max(capacity, kept[0].batch_size), max(max_len, kept[0].max_len)
            self.close()
            self._static = make_caches(self.pair, self.backend.device, capacity,
                                       -(-max_len // LEN_STEP) * LEN_STEP,
                                       self.pair.draft is not None)

    def _graphed_stepper(self, key: tuple) -> Stepper:
        """The kept graphed step of a mode: ("spec", b) (b = 1: a target-only step that keeps
        the draft's context hidden for a later catch-up, for adaptive runs) or ("target-only",)."""
        if key not in self._graphed:
            block = key[1] if len(key) > 1 else 1
            caches = self._static if key[0] == "spec" else (self._static[0], None)
            if self._pool is None:
                self._pool = SharedPool(self.backend.graph_adapter)
            self._graphed[key] = Stepper(
                StepBodies(self.pair, self.backend, *caches, block if block > 1 else None),
                self.backend.graph_adapter, self._pool)
        return self._graphed[key]

    def close(self) -> None:
        """Release the captured graphs and the static caches now (they are kept across
        generate() calls so that later calls replay instead of capturing again)."""
        for g in self._graphed.values():
            g.close()
        self._graphed.clear()
        self._static = None
        self._pool = None

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _new_state(self, requests: Sequence[Request], target: KVCache,
                   draft: KVCache | None, watermark: WatermarkKey | None = None,
                   block: int = 1) -> BatchState:
        wm = None if watermark is None else WatermarkBatch.build(
            watermark, [q.prompt_ids for q in requests],
            capacity_for(max(q.params.max_new_tokens for q in requests) + block + 1),
            DEFAULT_CONTEXT_WIDTH, self.backend.device)
        return new_state(requests, target, draft, self.backend.device,
                         self.pair.target.cfg.vocab_size, wm)

    def generate(self, requests: Sequence[Request], spec: bool = True,
                 block_size: int | None = None, on_tokens: OnTokens | None = None,
                 watermark: WatermarkKey | None = None
                 ) -> tuple[list[RequestOutput], RunStats]:
        """Decode every request to completion; ``on_tokens(i, ids)`` streams new tokens.
        ``spec`` with ``block_size=None``: adaptive speculation (each step's block size from
        ``self.schedule``); an int >= 2: that fixed block. ``watermark``: a WatermarkKey that
        marks every sampled request's tokens (``dflash2rt.watermark.generate``; greedy requests
        are unchanged and unmarked); the key stays out of stats and outputs."""
        pair = self.pair
        if watermark is not None:
            if not isinstance(watermark, WatermarkKey):
                raise InvalidInputError(f"watermark must be a WatermarkKey (load one with "
                                        f"WatermarkKey.from_file), got {type(watermark).__name__}")
            require_fp64(self.backend.has_fp64)
        if not requests:
            raise InvalidInputError("no requests: give at least one prompt")
        if spec and pair.draft is None:
            raise InvalidInputError("speculative decoding needs a draft model (or use spec=False)")
        sched = self._schedule() if spec and block_size is None else None
        block = max(sched.candidates) if sched else block_size_or_default(
            block_size, pair.draft.cfg.block_size if pair.draft is not None else 1)
        if spec and sched is None and block < 2:
            raise InvalidInputError(
                f"block_size must be >= 2 for speculative decoding (None: adaptive), got {block}")
        for q in requests:
            q.validate(pair.target.cfg.vocab_size)
        if sched is not None:                # this call's schedule state (begin), then its plan
            sched.begin("sampled" if any(q.params.temperature > 0 for q in requests)
                        else "greedy", _law(requests))     # as SamplingBatch.any_sampled
        plan = "" if sched is None else sched.plan(
            len(requests), [q.params.max_new_tokens for q in requests])
        decided = sched                      # the schedule whose table this call decided with
        if plan:                             # the whole call target-only (schedule.plan)
            spec, sched, block = False, None, 1
        stats = RunStats("spec" if spec else "target-only", self.backend.name,
                         str(self.backend.device), block if spec else 1, requests=len(requests),
                         adaptive=sched is not None or bool(plan), call_plan=plan,
                         model_pass=self.model_pass,
                         watermarked=watermark is not None)
        noise = cost_noise() if decided is not None and not decided.fixed else None
        stats.cost_noise = "" if noise is None else noise.describe()
        fallbacks = Fallbacks(self._standing_fallbacks.reported)    # this run's recorder
        out = Collector(requests, pair.tokenizer, pair.eos_token_ids, on_tokens,
                        pair.target.cfg.vocab_size)
        start = time.perf_counter()
        with torch.inference_mode(), self.backend.run_context():
            steppers, st = self._start(requests, spec, block, watermark)
            note = memory_note(self.backend.device)     # free memory estimated, or unchecked
            if note:
                fallbacks.report(note)
            try:
                host_masks(st, out, stats)                 # generic hooks: the first token's
                first = steps.prefill(pair, st, self.backend, [q.prompt_ids for q in requests])
                host = torch.cat([torch.stack([first.token, pack_flags(first.bad)], 1)]
                                 + ([first.logprobs] if first.logprobs is not None else []),
                                 1).tolist()                               # prefill's sync
                if self.step_check is not None:
                    self.step_check(host)
                raise_flags([h[1] for h in host], st.rows)
                for i, h in enumerate(host):
                    out.add(st.rows[i], [h[0]], None if first.logprobs is None else
                            unpack_logprobs(h[2:], 1, st.procs.logprobs, st.procs.wants[i]))
                    st.host_lens[i] = len(requests[i].prompt_ids)   # mirrors st.lens = n
                stats.time["prefill"] = time.perf_counter() - start
                st = drop_finished(st, out)
                host_masks(st, out, stats)
                pending = 0          # target-only steps since the last spec step (adaptive)
                while st.size:
                    if sched is None:
                        st = decode_step(steppers[block], block if spec else 1, st, stats, out,
                                         fallbacks, self.step_check)[0]
                        continue
                    calibrate(steppers, st, sched, stats, fallbacks, out, noise)  # new buckets
                    rows, b = st.rows, sched.choose(st.rows, out.remaining(st.rows))
                    # (chosen before the step's noise, from the past only)
                    caught = 0.0
                    if b > 1 and pending:
                        t0 = time.perf_counter()
                        steps.catch_up_draft(pair, st, pending)        # deferred draft context
                        caught = time.perf_counter() - t0
                        stats.time["catch_up"] += caught
                        stats.draft_deferred += pending
                    st, accepted, seconds = decode_step(steppers[b], b, st, stats, out, fallbacks,
                                                        self.step_check)
                    pending = pending + 1 if b == 1 else 0
                    # the schedule learns what switching back to speculation costs, too
                    seconds += caught
                    sched.observe(rows, b, accepted, seconds if noise is None
                                  else noise.step(seconds, b, bucket_of(len(rows)), sched.mode))
                if decided is not None:     # the next call's table follows this call
                    wall = time.perf_counter() - start - stats.calibration_s
                    decided.end(sum(len(o.token_ids) for o in out.outputs),
                                wall if noise is None else noise.call(wall))
            except BaseException:
                self.close()              # release graphs now, outside any capture
                raise
            finally:
                stats.capture_s = steppers.capture_s()
                stats.graphs = steppers.graphs()
                stats.fallbacks = list(fallbacks.reported)
                if decided is not None:
                    for (b, k), c in decided.costs.items():
                        stats.costs.setdefault(b, {})[k] = c
        stats.wall_s = time.perf_counter() - start
        stats.generated = sum(len(o.token_ids) for o in out.outputs)
        return out.finish(), stats

    def _schedule(self) -> AdaptiveSchedule:
        if self.schedule is None:
            self.schedule = shared_schedule(self.pair, self.backend.device)
        return self.schedule

    def _start(self, requests: Sequence[Request], spec: bool, block: int,
               watermark: WatermarkKey | None = None) -> tuple[Steppers, BatchState]:
        """The run's steppers (per block size: 1 is a target-only step) and batch state: over
        the kept static caches when the backend captures graphs, else eager over caches made for
        this run. Caches have room for ``block`` (adaptive: the largest candidate)."""
        max_len, n = self._max_len(requests, block), len(requests)
        if self.backend.graph_adapter is not None:
            self._ensure_static(bucket_for(n, BUCKETS) or n, max_len)
            key = (lambda b: ("spec", b)) if spec else (lambda b: ("target-only",))
            return (Steppers(lambda b: self._graphed_stepper(key(b))),
                    self._new_state(requests, *self._static, watermark, block))
        st = self._new_state(requests, *make_caches(self.pair, self.backend.device, n, max_len,
                                                    spec), watermark, block)
        return Steppers(lambda b: Stepper(StepBodies(
            self.pair, self.backend, st.target_storage, st.draft_storage,
            b if spec and b > 1 else None), None)), st
