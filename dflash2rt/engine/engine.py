"""The engine: batches requests, runs prefill and the decode loop, streams tokens, keeps stats."""

from __future__ import annotations

import time
from typing import Callable, Sequence

import torch

from ..backend import Backend
from ..errors import InvalidInputError, NonFiniteLogitsError, ResourceError
from ..models.pair import ModelPair
from ..ops.batch import BlockNoise, SamplingBatch
from ..graphs.runner import bucket_for
from ..registry import Registry
from . import steps
from ..models.kv_cache import KVCache
from .graphed import BUCKETS, LEN_STEP, GraphedSpecSteps, GraphedTargetSteps, graph_delta
from .output import Collector
from .memory import cache_bytes, check_fits
from .request import Request, RequestOutput, block_size_or_default
from .state import BatchState
from .stats import RunStats

OnTokens = Callable[[int, list[int]], None]
# Flag bits in the one per-step host transfer, and the source each names in its error.
BAD_TARGET, BAD_Q, BAD_DRAFT, BAD_LATTICE = 1, 2, 4, 8
_SOURCES = ((BAD_TARGET, "target logits"), (BAD_DRAFT, "draft logits"),
            (BAD_LATTICE, "candidate selector scores"))


class Engine:
    """Speculative (or target-only) decoding of a batch of requests on one backend."""

    def __init__(self, pair: ModelPair, backend: Backend | str | None = None) -> None:
        if backend is None or isinstance(backend, str):
            selection = Registry.discover().select(backend)
            backend = selection.backend
        self.pair, self.backend = pair, backend
        self._graphed: dict[tuple, GraphedSpecSteps | GraphedTargetSteps] = {}
        self._static: tuple[KVCache, KVCache | None] | None = None   # caches the graphs use
        if pair.dtype not in backend.dtypes:
            raise InvalidInputError(
                f"backend {backend.name!r} does not run {pair.dtype} models (it supports "
                f"{', '.join(str(d).replace('torch.', '') for d in backend.dtypes)}); "
                "load the models in one of those dtypes")
        if pair.device.type != backend.device.type:
            raise InvalidInputError(f"models are on {pair.device} but backend {backend.name!r} "
                                    f"runs on {backend.device}; load the models there")
        backend.prepare_models([m for m in (pair.target, pair.draft) if m is not None])

    def _to_host(self, t: torch.Tensor, stats: RunStats) -> list:
        """The step's single device→host synchronisation."""
        stats.syncs += 1
        return t.tolist()

    def _max_len(self, requests: Sequence[Request], block: int) -> int:
        """Cache rows a batch needs: prompt + new tokens + one block in flight."""
        max_len = max(len(q.prompt_ids) + q.params.max_new_tokens for q in requests) + block + 1
        a = self.pair.target.cfg
        if max_len > a.max_position_embeddings + block + 1:
            raise InvalidInputError(f"prompt + max_new_tokens ({max_len - block - 1}) exceeds the "
                                    f"target's max_position_embeddings={a.max_position_embeddings}")
        return max_len

    def _caches(self, capacity: int, max_len: int, spec: bool) -> tuple[KVCache, KVCache | None]:
        """Target (and draft) caches of ``capacity`` slots × ``max_len`` rows, after checking
        that they fit in the device's free memory (ResourceError, nothing allocated, if not)."""
        pair, dev, a = self.pair, self.backend.device, self.pair.target.cfg
        need = cache_bytes(a.num_hidden_layers, capacity, max_len, a.num_key_value_heads,
                           a.head_dim, pair.dtype)
        if spec:
            d = pair.draft.cfg.arch
            need += cache_bytes(d.num_hidden_layers, capacity, max_len, d.num_key_value_heads,
                                d.head_dim, pair.dtype)
        check_fits(need, dev, f"the KV cache ({capacity} requests x {max_len} rows)",
                   "max_new_tokens, the prompt length, the number of prompts or block_size")
        try:
            target = KVCache.empty(a.num_hidden_layers, capacity, max_len,
                                   a.num_key_value_heads, a.head_dim, pair.dtype, dev)
            return target, \
                pair.draft.empty_cache(capacity, max_len, pair.dtype, dev) if spec else None
        except (RuntimeError, MemoryError) as exc:     # where free memory could not be read
            if not isinstance(exc, (torch.OutOfMemoryError, MemoryError)) \
                    and "allocate" not in str(exc):
                raise
            raise ResourceError(f"the KV cache ({capacity} requests x {max_len} rows, "
                                f"{need / 1e9:.2f} GB) could not be allocated on {dev}: {exc}; "
                                "lower max_new_tokens or the number of prompts") from exc

    def _graphed_steps(self, spec: bool, block: int, capacity: int, max_len: int
                       ) -> GraphedSpecSteps | GraphedTargetSteps:
        """The kept graphed steps of this mode, over the engine's one set of static caches (every
        mode's graphs share them: calls run one at a time; the draft cache is made whenever there
        is a draft, so target-only first costs no re-capture later). A batch that does not fit
        (slots, rows rounded up to LEN_STEP) releases every graph, then grows the caches: graphs
        hold their pointers."""
        kept = self._static
        if kept is None or capacity > kept[0].batch_size or max_len > kept[0].max_len:
            if kept is not None:
                capacity, max_len = max(capacity, kept[0].batch_size), max(max_len, kept[0].max_len)
            self.close()
            self._static = kept = self._caches(capacity, -(-max_len // LEN_STEP) * LEN_STEP,
                                               self.pair.draft is not None)
        key = ("spec", block) if spec else ("target-only",)
        if key not in self._graphed:
            be = self.backend
            self._graphed[key] = \
                GraphedSpecSteps(self.pair, be, *kept, block, be.report_fallback) if spec \
                else GraphedTargetSteps(self.pair, be, kept[0], None, be.report_fallback)
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
        out = Collector(requests, pair.tokenizer, pair.eos_token_ids, on_tokens)
        start = time.perf_counter()
        with torch.inference_mode():
            max_len, graphed = self._max_len(requests, block), None
            if self.backend.graph_adapter is not None:
                n = len(requests)
                graphed = self._graphed_steps(spec, block, bucket_for(n, BUCKETS) or n, max_len)
                st = self._new_state(requests, *self._static)
            else:
                st = self._new_state(requests, *self._caches(len(requests), max_len, spec))
            captured = graphed.capture_s if graphed is not None else 0.0
            graphs0 = graphed.graph_stats() if graphed is not None else {}
            self.backend.begin_run()
            try:
                first = steps.prefill(pair, st, [q.prompt_ids for q in requests])
                host = self._to_host(torch.stack([first.token, first.bad.long() * BAD_TARGET], 1),
                                     stats)
                stats.syncs -= 1                      # prefill's transfer is not a decode step's
                self._raise_flags([h[1] for h in host], st.rows)
                for i, (tok, _) in enumerate(host):
                    out.add(st.rows[i], [tok])
                    st.host_lens[i] = len(requests[i].prompt_ids)   # mirrors st.lens = n
                stats.time["prefill"] = time.perf_counter() - start
                st = self._drop_finished(st, out)
                while st.size:
                    st = self._spec_step(st, block, stats, out, graphed) if spec else \
                        self._target_step(st, stats, out, graphed)
            except BaseException:
                self.close()              # release graphs now, outside any capture
                raise
            finally:
                if graphed is not None:
                    stats.capture_s = graphed.capture_s - captured
                    stats.graphs = graph_delta(graphs0, graphed.graph_stats())
                stats.fallbacks = self.backend.end_run()
        stats.wall_s = time.perf_counter() - start
        stats.generated = sum(len(o.token_ids) for o in out.outputs)
        return out.finish(), stats

    def _spec_step(self, st: BatchState, block: int, stats: RunStats, out: Collector,
                   graphed: GraphedSpecSteps | None) -> BatchState:
        t0 = time.perf_counter()
        if graphed is None:
            acc, tokens, flags, t1, t2 = self._eager_spec(st, block)
            t3 = time.perf_counter()
            phases = {"draft": t1 - t0, "select": t2 - t1, "verify": t3 - t2}
        else:
            v = graphed.step(st)
            acc, tokens = v["acc"], v["tokens"]
            flags = v["bad"].long() * BAD_TARGET + v["bad_q"].long() * BAD_Q \
                + v["draft_bad"].long() * BAD_DRAFT + v["lattice_bad"].long() * BAD_LATTICE
        host = self._to_host(torch.cat([acc.view(-1, 1), flags.view(-1, 1), tokens], 1), stats)
        if graphed is not None:                    # the sync waited for both graphs
            t3 = time.perf_counter()
            phases = {"graphs": t3 - t0}
        self._raise_flags([h[1] for h in host], st.rows)
        stats.steps += 1
        stats.record_accepts([h[0] for h in host])
        for i, h in enumerate(host):
            out.add(st.rows[i], h[2:3 + h[0]])
            st.host_lens[i] += h[0] + 1
        st = self._drop_finished(st, out)
        phases["host"] = time.perf_counter() - t3
        for k, dt in phases.items():
            stats.time[k] += dt
        return st

    def _eager_spec(self, st: BatchState, block: int):
        """draft → select → verify → accept → commit, eagerly; returns device results."""
        pair, be, t0 = self.pair, self.backend, time.perf_counter()
        pos = steps.block_positions(st, block)                             # [R, B]
        ctx = max(st.host_lens)
        h_e = steps.draft_block(pair, st, be, pos, ctx)                    # [R, γ, H]
        t1 = time.perf_counter()
        noise = be.noise(st.seed, st.key, st.lens, block - 1) if st.sampling.any_sampled \
            else BlockNoise.unused(st.size, block - 1, be.device)
        sel = steps.select_block(pair, st, be, h_e, noise)
        t2 = time.perf_counter()
        tgt, ver = steps.verify_block(pair, st, be, sel, noise, pos, ctx)
        acc = ver.accept_len
        steps.commit(pair, st, tgt, pos, acc + 1, ver.tokens.gather(1, acc.view(-1, 1))[:, 0])
        flags = ver.bad.long() * BAD_TARGET + ver.bad_q.long() * BAD_Q \
            + sel.bad.long() * BAD_DRAFT + sel.bad_lattice.long() * BAD_LATTICE
        return acc, ver.tokens, flags, t1, t2

    def _target_step(self, st: BatchState, stats: RunStats, out: Collector,
                     graphed: GraphedTargetSteps | None) -> BatchState:
        t0 = time.perf_counter()
        if graphed is None:
            token, bad = steps.target_only_step(self.pair, st, max(st.host_lens))
        else:
            v = graphed.step(st)
            token, bad = v["token"], v["bad"]
        t1 = time.perf_counter()
        host = self._to_host(torch.stack([token, bad.long() * BAD_TARGET], 1), stats)
        if graphed is not None:                    # the sync waited for the graph
            t1 = time.perf_counter()
        self._raise_flags([h[1] for h in host], st.rows)
        stats.steps += 1
        stats.record_accepts([0] * len(host))
        for i, (tok, _) in enumerate(host):
            out.add(st.rows[i], [tok])
            st.host_lens[i] += 1
        st = self._drop_finished(st, out)
        stats.time["verify" if graphed is None else "graphs"] += t1 - t0
        stats.time["host"] += time.perf_counter() - t1
        return st

    @staticmethod
    def _raise_flags(flags: list[int], rows: list[int]) -> None:
        """Raise for the first bad source of the step (rows are request indices). Nothing of
        the step was returned; the engine stays usable for the next generate()."""
        for bit, what in _SOURCES:
            bad = [rows[i] for i, f in enumerate(flags) if f & bit]
            if bad:
                raise NonFiniteLogitsError(
                    f"{what} of request(s) {bad} are not a finite law (NaN/+inf, or no finite "
                    "entry); check the model weights and dtype (the step was abandoned, no "
                    "token returned)")
        bad = [rows[i] for i, f in enumerate(flags) if f & BAD_Q]
        if bad:
            raise InvalidInputError(f"request(s) {bad}: a draft token has q = 0 (or q is not "
                                    "finite) under the law it was drawn from (selector bug)")

    @staticmethod
    def _drop_finished(st: BatchState, out: Collector) -> BatchState:
        alive = [i for i, row in enumerate(st.rows) if not out.done(row)]
        return st if len(alive) == st.size else st.keep(alive)
