"""Batch state: device tensors the steps read and write, and the host mirror of lengths."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from ..constraints.device import ConstraintBatch
from ..models.kv_cache import KVCache
from ..ops.batch import SamplingBatch
from ..ops.procs import ProcBatch
from ..watermark.generate import WatermarkBatch


@dataclass
class BatchState:
    """R live requests in cache slots [0, R) of caches allocated for ``capacity`` slots (static
    storage, so graphs can capture it). Device: committed lengths ``lens`` (= anchor position),
    anchor tokens, RNG keys, sampling parameters. Host: ``host_lens`` (mirror of ``lens``,
    updated from the one sync per step) and ``rows`` (each slot's index in the request list).
    ``procs``: the logit processors' device state (token counts, bias, penalties) and logprobs
    requests, None when no request of the batch uses any (``ops.procs``). ``wm``: the
    watermark's device state (``watermark.generate``), None for an unwatermarked run.
    ``constraint``: the requests' constraint tables and states (``constraints.device``), None
    when none has one."""

    target_storage: KVCache        # every slot's cache; ``target_cache`` is slots [0, R)
    draft_storage: KVCache | None
    lens: torch.Tensor          # [R] int64
    anchor: torch.Tensor        # [R] int64, last emitted token, its KV not yet computed
    seed: torch.Tensor          # [R] int64
    key: torch.Tensor           # [R] int64
    sampling: SamplingBatch
    host_lens: list[int]
    rows: list[int]
    procs: ProcBatch | None = None
    wm: WatermarkBatch | None = None
    constraint: ConstraintBatch | None = None

    @property
    def size(self) -> int:
        return len(self.rows)

    @property
    def target_cache(self) -> KVCache:
        return self.target_storage.rows(self.size)

    @property
    def draft_cache(self) -> KVCache | None:
        return self.draft_storage.rows(self.size) if self.draft_storage is not None else None

    def keep(self, idx: list[int]) -> "BatchState":
        """The batch reduced to rows ``idx``, compacted into slots [0, len(idx)) in place
        (host-known indices: no device→host sync; cache storage never moves)."""
        t = torch.tensor(idx, dtype=torch.int64, device=self.lens.device)
        upto = max((self.host_lens[i] for i in idx), default=0)    # rows past it are scratch
        self.target_storage.compact_(idx, upto)
        if self.draft_storage is not None:
            self.draft_storage.compact_(idx, upto)
        return BatchState(self.target_storage, self.draft_storage, self.lens[t], self.anchor[t],
                          self.seed[t], self.key[t], self.sampling.take(idx),
                          [self.host_lens[i] for i in idx], [self.rows[i] for i in idx],
                          None if self.procs is None else self.procs.take(idx),
                          None if self.wm is None else self.wm.take(idx),
                          None if self.constraint is None else self.constraint.take(idx))

    @property
    def eager_only(self) -> bool:
        """Whether the batch needs what captured graphs do not take as inputs (logit
        processors, min-p, logprobs, constraints): its steps then run eagerly, and that is
        reported. A watermark's state is a graph input (``WatermarkBatch.inputs``)."""
        return self.procs is not None or self.sampling.min_p is not None \
            or self.constraint is not None


def new_state(requests: Sequence, target: KVCache, draft: KVCache | None,
              dev: torch.device, vocab: int | None = None,
              wm: WatermarkBatch | None = None) -> BatchState:
    """A batch of ``requests`` (engine Requests) in slots [0, R) of the given caches, before
    prefill: lengths and anchors 0. ``vocab``: the target's vocabulary size, which the logit
    processors' state needs (None: requests that use them are refused); ``wm``: the batch's
    watermark state (``WatermarkBatch.build``), None: unwatermarked."""
    r, ps = len(requests), [q.params for q in requests]
    i64 = lambda xs: torch.tensor(xs, dtype=torch.int64, device=dev)  # noqa: E731
    return BatchState(
        target, draft, i64([0] * r), i64([0] * r),
        i64([p.seed for p in ps]), i64([q.key for q in requests]),
        SamplingBatch.build([p.temperature for p in ps], [p.top_k for p in ps],
                            [p.top_p for p in ps], dev, [p.min_p for p in ps]),
        [0] * r, list(range(r)), _procs(requests, vocab, dev), wm,
        None if vocab is None else
        ConstraintBatch.build([q.params.constraint for q in requests], vocab, dev))


def _procs(requests: Sequence, vocab: int | None, dev: torch.device) -> ProcBatch | None:
    if vocab is None:
        if any(q.params.processed for q in requests):
            raise ValueError("new_state needs the vocabulary size for logit processors")
        return None
    return ProcBatch.build([q.params for q in requests], [q.prompt_ids for q in requests],
                           vocab, dev)
