"""The engine: batches requests, runs prefill and the decode loop, streams tokens, keeps stats.

A decode step (``Engine._step``): the mode's bodies (step.py, over the functions of steps.py)
run eagerly or replayed from graphs by a Stepper (graphed.py) and return a StepOut; the engine
commits its lengths and anchor, makes the step's one device→host transfer, and does the host
work. What falls back during a run goes to that run's Fallbacks and ends in its RunStats.
"""

from __future__ import annotations

import time
from typing import Callable, Sequence

import torch

from ..backend import Backend, Fallbacks
from ..errors import InvalidInputError
from ..graphs.runner import bucket_for
from ..models.kv_cache import KVCache
from ..models.pair import ModelPair
from ..ops.batch import SamplingBatch
from . import steps
from .graphed import BUCKETS, LEN_STEP, Stepper, graph_delta
from .memory import make_caches
from .output import Collector
from .request import Request, RequestOutput, block_size_or_default
from .state import BatchState
from .step import StepBodies, pack_flags, raise_flags
from .stats import RunStats

OnTokens = Callable[[int, list[int]], None]


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
        if pair.dtype not in backend.dtypes:
            raise InvalidInputError(
                f"backend {backend.name!r} does not run {pair.dtype} models (it supports "
                f"{', '.join(str(d).replace('torch.', '') for d in backend.dtypes)}); "
                "load the models in one of those dtypes")
        if pair.device.type != backend.device.type:
            raise InvalidInputError(f"models are on {pair.device} but backend {backend.name!r} "
                                    f"runs on {backend.device}; load the models there")
        # Every run's first fallbacks: the backend's standing ones, then the model pass's.
        self._standing_fallbacks = Fallbacks(backend.standing_fallbacks)
        backend.prepare_models([m for m in (pair.target, pair.draft) if m is not None],
                               self._standing_fallbacks)

    def _max_len(self, requests: Sequence[Request], block: int) -> int:
        """Cache rows a batch needs: prompt + new tokens + one block in flight."""
        max_len = max(len(q.prompt_ids) + q.params.max_new_tokens for q in requests) + block + 1
        a = self.pair.target.cfg
        if max_len > a.max_position_embeddings + block + 1:
            raise InvalidInputError(f"prompt + max_new_tokens ({max_len - block - 1}) exceeds the "
                                    f"target's max_position_embeddings={a.max_position_embeddings}")
        return max_len

    def _graphed_stepper(self, spec: bool, block: int, capacity: int, max_len: int) -> Stepper:
        """The kept graphed step of this mode, over the engine's one set of static caches (every
        mode's graphs share them: calls run one at a time; the draft cache is made whenever there
        is a draft, so target-only first costs no re-capture later). A batch that does not fit
        (slots, rows rounded up to LEN_STEP) releases every graph, then grows the caches: graphs
        hold their pointers."""
        kept = self._static
        if kept is None or capacity > kept[0].batch_size or max_len > kept[0].max_len:
            if kept is not None:
                capacity, max_len = max(capacity, kept[0].batch_size), max(max_len, kept[0].max_len)
            self.close()
            self._static = kept = make_caches(self.pair, self.backend.device, capacity,
                                               -(-max_len // LEN_STEP) * LEN_STEP,
                                               self.pair.draft is not None)
        key = ("spec", block) if spec else ("target-only",)
        if key not in self._graphed:
            caches = kept if spec else (kept[0], None)
            self._graphed[key] = Stepper(
                StepBodies(self.pair, self.backend, *caches, block if spec else None),
                self.backend.graph_adapter)
        return self._graphed[key]

    def close(self) -> None:
        """Release the captured graphs and the static caches now (they are kept across
        generate() calls so that later calls replay instead of capturing again)."""
        for g in self._graphed.values():
            g.close()
        self._graphed.clear()
        self._static = None

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _new_state(self, requests: Sequence[Request], target: KVCache,
                   draft: KVCache | None) -> BatchState:
        dev, r = self.backend.device, len(requests)
        ps = [q.params for q in requests]
        i64 = lambda xs: torch.tensor(xs, dtype=torch.int64, device=dev)  # noqa: E731
        return BatchState(
            target, draft, i64([0] * r), i64([0] * r),
            i64([p.seed for p in ps]), i64([q.key for q in requests]),
            SamplingBatch.build([p.temperature for p in ps], [p.top_k for p in ps],
                                [p.top_p for p in ps], dev),
            [0] * r, list(range(r)))

    def generate(self, requests: Sequence[Request], spec: bool = True,
                 block_size: int | None = None, on_tokens: OnTokens | None = None
                 ) -> tuple[list[RequestOutput], RunStats]:
        """Decode every request to completion; ``on_tokens(i, ids)`` streams new tokens."""
        pair = self.pair
        if not requests:
            raise InvalidInputError("no requests: give at least one prompt")
        if spec and pair.draft is None:
            raise InvalidInputError("speculative decoding needs a draft model (or use spec=False)")
        block = block_size_or_default(
            block_size, pair.draft.cfg.block_size if pair.draft is not None else 1)
        if spec and block < 2:
            raise InvalidInputError(f"block_size must be >= 2 for speculative decoding, got {block}")
        for q in requests:
            q.validate(pair.target.cfg.vocab_size)
        stats = RunStats("spec" if spec else "target-only", self.backend.name,
                         str(self.backend.device), block if spec else 1, requests=len(requests))
        fallbacks = Fallbacks(self._standing_fallbacks.reported)    # this run's recorder
        out = Collector(requests, pair.tokenizer, pair.eos_token_ids, on_tokens)
        start = time.perf_counter()
        with torch.inference_mode(), self.backend.run_context():
            stepper, st = self._start(requests, spec, block)
            captured, graphs0 = stepper.capture_s, stepper.graph_stats()
            try:
                first = steps.prefill(pair, st, [q.prompt_ids for q in requests])
                host = torch.stack([first.token, pack_flags(first.bad)], 1).tolist()  # prefill's
                raise_flags([h[1] for h in host], st.rows)
                for i, (tok, _) in enumerate(host):
                    out.add(st.rows[i], [tok])
                    st.host_lens[i] = len(requests[i].prompt_ids)   # mirrors st.lens = n
                stats.time["prefill"] = time.perf_counter() - start
                st = self._drop_finished(st, out)
                while st.size:
                    st = self._step(stepper, st, stats, out, fallbacks)
            except BaseException:
                self.close()              # release graphs now, outside any capture
                raise
            finally:
                stats.capture_s = stepper.capture_s - captured
                stats.graphs = graph_delta(graphs0, stepper.graph_stats())
                stats.fallbacks = list(fallbacks.reported)
        stats.wall_s = time.perf_counter() - start
        stats.generated = sum(len(o.token_ids) for o in out.outputs)
        return out.finish(), stats

    def _start(self, requests: Sequence[Request], spec: bool, block: int
               ) -> tuple[Stepper, BatchState]:
        """The run's stepper and batch state: over the kept static caches when the backend
        captures graphs, else eager over caches made for this run."""
        max_len, n = self._max_len(requests, block), len(requests)
        if self.backend.graph_adapter is not None:
            stepper = self._graphed_stepper(spec, block, bucket_for(n, BUCKETS) or n, max_len)
            return stepper, self._new_state(requests, *self._static)
        caches = make_caches(self.pair, self.backend.device, n, max_len, spec)
        st = self._new_state(requests, *caches)
        bodies = StepBodies(self.pair, self.backend, st.target_storage, st.draft_storage,
                            block if spec else None)
        return Stepper(bodies, None), st

    def _step(self, stepper: Stepper, st: BatchState, stats: RunStats, out: Collector,
              fallbacks: Fallbacks) -> BatchState:
        """One decode step: the step's bodies (step.py), the one device→host transfer, then the
        host work: raise on bad flags, emit accepted tokens, mirror lengths, drop finished."""
        t0 = time.perf_counter()
        res = stepper.step(st, fallbacks.report, stats.time)   # eager bodies time themselves
        st.lens.copy_(res.lens)
        st.anchor.copy_(res.anchor)
        t1 = time.perf_counter()
        host = res.for_host().tolist()       # the step's one device→host sync: [R, 2 + B]
        stats.syncs += 1
        if stepper.adapter is not None:      # launch + the wait for the graphs at the sync
            t1 = time.perf_counter()
            stats.time["graphs"] += t1 - t0
        raise_flags([h[1] for h in host], st.rows)
        stats.steps += 1
        stats.record_accepts([h[0] for h in host])
        for i, h in enumerate(host):
            out.add(st.rows[i], h[2:3 + h[0]])
            st.host_lens[i] += h[0] + 1
        st = self._drop_finished(st, out)
        stats.time["host"] += time.perf_counter() - t1
        return st

    @staticmethod
    def _drop_finished(st: BatchState, out: Collector) -> BatchState:
        alive = [i for i, row in enumerate(st.rows) if not out.done(row)]
        return st if len(alive) == st.size else st.keep(alive)
