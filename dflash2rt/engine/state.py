"""Batch state: device tensors the steps read and write, the batch's row extensions, and the host
mirror of lengths."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from ..constraints.device import ConstraintBatch
from ..models.kv_cache import KVCache
from ..ops.batch import SamplingBatch
from ..ops.procs import ProcBatch
from ..watermark.generate import WatermarkBatch
from . import extensions
from .extensions import RowExtension


@dataclass
class BatchState:
    """R live requests in cache slots [0, R) of caches allocated for ``capacity`` slots (static
    storage, so graphs can capture it). Device: committed lengths ``lens`` (= anchor position),
    anchor tokens, RNG keys, sampling parameters. Host: ``host_lens`` (mirror of ``lens``,
    updated from the one sync per step) and ``rows`` (each slot's index in the request list).
    ``extensions``: the batch's active row extensions in hook order (``extensions.py``: logit
    processors, the watermark, constraints; empty: plain decoding). ``procs``, ``wm`` and
    ``constraint`` read a feature's own state for what is not a step hook (logprobs, generic
    constraint hooks' host masks), None when the batch does not use it."""

    target_storage: KVCache        # every slot's cache; ``target_cache`` is slots [0, R)
    draft_storage: KVCache | None
    lens: torch.Tensor          # [R] int64
    anchor: torch.Tensor        # [R] int64, last emitted token, its KV not yet computed
    seed: torch.Tensor          # [R] int64
    key: torch.Tensor           # [R] int64
    sampling: SamplingBatch
    host_lens: list[int]
    rows: list[int]
    extensions: tuple[RowExtension, ...] = ()
    _live: torch.Tensor | None = field(default=None, repr=False, compare=False)

    @property
    def live(self) -> torch.Tensor:
        """[R] bool, all True: every row is live (a step body's ``live`` input), made once."""
        if self._live is None:
            self._live = torch.ones(self.size, dtype=torch.bool, device=self.lens.device)
        return self._live

    def _extension(self, kind: type) -> Any:
        return next((e for e in self.extensions if isinstance(e, kind)), None)

    def _state_of(self, kind: type) -> Any:
        ext = self._extension(kind)
        return None if ext is None else ext.batch

    @property
    def procs(self) -> ProcBatch | None:
        """The logit processors' state and logprobs requests (``ops.procs``), or None."""
        return self._state_of(extensions.Procs)

    @property
    def wm(self) -> WatermarkBatch | None:
        """The watermark's state (``watermark.generate``), or None."""
        return self._state_of(extensions.Watermark)

    @property
    def constraint(self) -> ConstraintBatch | None:
        """The constraints' tables and states (``constraints.device``), or None."""
        return self._state_of(extensions.Constraint)

    @property
    def candidates(self) -> extensions.Candidates | None:
        """The rows' own candidate counts (``candidates.py``), or None: every row takes the
        draft's trained count."""
        return self._extension(extensions.Candidates)

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
                          tuple(e.take(idx) for e in self.extensions))

    def retain(self, alive: list[int]) -> "BatchState":
        """The batch with only rows ``alive`` (ascending): itself when every row stays, else
        ``keep`` in the order that copies the fewest cache slots (``fewest_moves``)."""
        return self if len(alive) == self.size else self.keep(fewest_moves(alive))

    @property
    def eager_only(self) -> bool:
        """Whether the batch needs what captured graphs do not take as inputs (min-p, or an
        extension that is not ``graphed``: logit processors, logprobs, constraints): its steps
        then run eagerly, and that is reported. A watermark's state is a graph input."""
        return self.sampling.min_p is not None or any(not e.graphed for e in self.extensions)


def fewest_moves(alive: Sequence[int]) -> list[int]:
    """An order of the rows ``alive`` (ascending slot indices) for ``BatchState.keep`` that
    moves the fewest cache slots: a kept row in slots [0, n) stays where it is, and the kept
    rows past n fill the freed slots below n. A row's place in the batch carries nothing (its
    state is its own: prompt, parameters, seed, key), so only the copies change: one slot per
    freed one instead of every slot after the first freed."""
    n = len(alive)
    tail = iter([i for i in alive if i >= n])
    kept = set(alive)
    return [j if j in kept else next(tail) for j in range(n)]


def new_state(requests: Sequence, target: KVCache, draft: KVCache | None,
              dev: torch.device, vocab: int | None = None,
              wm: WatermarkBatch | None = None) -> BatchState:
    """A batch of ``requests`` (engine Requests) in slots [0, R) of the given caches, before
    prefill: lengths and anchors 0, the row extensions its requests use (``extensions.build``).
    ``vocab``: the target's vocabulary size, which the logit processors' and constraints' state
    needs (None: requests that use them are refused); ``wm``: the batch's watermark state
    (``WatermarkBatch.build``), None: unwatermarked."""
    r, ps = len(requests), [q.params for q in requests]
    sampling, (seed, key) = SamplingBatch.build_with(        # one host→device copy
        [p.temperature for p in ps], [p.top_k for p in ps], [p.top_p for p in ps], dev,
        [p.min_p for p in ps], also=[torch.tensor([p.seed for p in ps], dtype=torch.int64),
                                     torch.tensor([q.key for q in requests], dtype=torch.int64)])
    zeros = lambda: torch.zeros(r, dtype=torch.int64, device=dev)  # noqa: E731
    return BatchState(target, draft, zeros(), zeros(), seed, key, sampling, [0] * r,
                      list(range(r)), extensions.build(requests, vocab, dev, wm))
