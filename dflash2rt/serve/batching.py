"""Continuous batching on the engine's primitives: requests join a decoding batch between steps.

The server's caches are allocated once (``allocate``: ``Runner.start`` over a template batch
of the largest shape the server admits), so every step body and captured graph binds the same
storage. A batch of R live requests occupies slots [0, R) of that storage, as in
``Engine.generate``; requests that leave are dropped with ``BatchState.keep``, which compacts
the rest in place. Requests that join are prefilled as a cohort of their own in the next free
slots [R, R + k) (``cohort``: a ``BatchState`` over a view of those slots, through
``Runner.prefill``), then ``merge`` makes one batch of both: the device rows concatenated, the
sampling parameters staged again, and the row extensions (logit processors, logprobs,
constraints) built again for every row and advanced by each row's committed tokens
(``stages.commit``, the same hook a step commits through), so their state is what it would be
had the rows always shared a batch. Per-row device state depends only on the row's own prompt,
parameters, seed and key, so a request's tokens do not depend on what else is in the batch.
"""

from __future__ import annotations

from typing import Sequence

import torch

from ..engine import stages
from ..engine.engine import Engine
from ..engine.extensions import build as build_extensions
from ..engine.request import Request, SamplingParams
from ..engine.state import BatchState, new_state
from ..errors import InvalidInputError
from ..models.kv_cache import KVCache
from ..ops.batch import SamplingBatch
from ..ops.staging import to_device

Caches = tuple[KVCache, KVCache | None]


def allocate(engine: Engine, spec: bool, room: int, slots: int, max_model_len: int,
             report, clock: dict[str, float]) -> Caches:
    """The server's one set of caches: ``slots`` requests of up to ``max_model_len`` tokens
    (prompt + output) with room for a block of ``room`` in flight, allocated through
    ``Runner.start`` (the kept static caches on graph backends), which also begins the
    runner's run that every later step belongs to. ``report``: where fallbacks go;
    ``clock``: the time dict eager bodies add their seconds to."""
    if max_model_len < 2:
        raise InvalidInputError(f"max_model_len must be >= 2, got {max_model_len}")
    template = [Request((0,), SamplingParams(max_new_tokens=max_model_len - 1))] * slots
    st = engine.runner.start(template, spec, room, None, report, clock, None)
    return st.target_storage, st.draft_storage


def _slots(cache: KVCache | None, start: int, stop: int) -> KVCache | None:
    """A view of slots [start, stop) of ``cache``: writes through it land in the storage."""
    if cache is None:
        return None
    return KVCache(tuple(b[start:stop] for b in cache.k), tuple(b[start:stop] for b in cache.v),
                   tuple(b[start:stop] for b in cache.side))


def cohort(caches: Caches, start: int, requests: Sequence[Request], rows: Sequence[int],
           device: torch.device, vocab: int) -> BatchState:
    """A batch of joining ``requests`` in slots [start, start + k) of ``caches``, before its
    prefill; ``rows``: their ids (``BatchState.rows``)."""
    k = len(requests)
    if start + k > caches[0].batch_size:
        raise InvalidInputError(f"{start + k} rows do not fit the server's "
                                f"{caches[0].batch_size} cache slots")
    st = new_state(requests, _slots(caches[0], start, start + k),
                   _slots(caches[1], start, start + k), device, vocab)
    st.rows[:] = rows
    return st


def merge(caches: Caches, parts: Sequence[BatchState], requests: Sequence[Request],
          committed: Sequence[Sequence[int]], vocab: int) -> BatchState:
    """One batch of ``parts`` that lie in consecutive slots from 0 (a live batch over the
    whole storage, then a cohort over the slots after it), in that order: ``requests`` and
    ``committed`` (each row's tokens committed so far: the first token and every step's) are
    per row of the result, in the same order."""
    parts = [p for p in parts if p.size]
    lens = torch.cat([p.lens for p in parts])
    anchor = torch.cat([p.anchor for p in parts])
    seed = torch.cat([p.seed for p in parts])
    key = torch.cat([p.key for p in parts])
    dev = lens.device
    ps = [q.params for q in requests]
    if len(ps) != lens.shape[0] or len(committed) != len(ps):
        raise InvalidInputError(f"merge: {lens.shape[0]} rows, {len(ps)} requests and "
                                f"{len(committed)} committed token lists")
    sampling = SamplingBatch.build([p.temperature for p in ps], [p.top_k for p in ps],
                                   [p.top_p for p in ps], dev, [p.min_p for p in ps])
    exts = build_extensions(requests, vocab, dev)
    st = BatchState(caches[0], caches[1], lens, anchor, seed, key, sampling,
                    [h for p in parts for h in p.host_lens], [r for p in parts for r in p.rows],
                    exts)
    if exts:
        width = max(len(c) for c in committed)
        tokens = torch.full((len(ps), width), -1, dtype=torch.int64)
        for i, c in enumerate(committed):
            tokens[i, :len(c)] = torch.tensor(list(c), dtype=torch.int64)
        tokens, count = to_device(dev, tokens, torch.tensor([len(c) for c in committed]))
        stages.commit(st, tokens, count)
    return st
