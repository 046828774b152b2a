"""Batch state: device tensors the steps read and write, and the host mirror of lengths."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..models.kv_cache import KVCache
from ..ops.batch import SamplingBatch


@dataclass
class BatchState:
    """R active requests. Device: caches, committed lengths ``lens`` (= anchor position), anchor
    tokens, RNG keys, sampling parameters. Host: ``host_lens`` (mirror of ``lens``, updated from
    the one sync per step) and ``rows`` (index of each batch row in the caller's request list)."""

    target_cache: KVCache
    draft_cache: KVCache | None
    lens: torch.Tensor          # [R] int64
    anchor: torch.Tensor        # [R] int64, last emitted token, its KV not yet computed
    seed: torch.Tensor          # [R] int64
    key: torch.Tensor           # [R] int64
    sampling: SamplingBatch
    host_lens: list[int]
    rows: list[int]

    @property
    def size(self) -> int:
        return len(self.rows)

    def keep(self, idx: list[int]) -> "BatchState":
        """The batch reduced to rows ``idx`` (host-known: no device→host sync)."""
        t = torch.tensor(idx, dtype=torch.int64, device=self.lens.device)
        s = self.sampling
        sampling = SamplingBatch(s.temperature[t], s.top_k[t], s.top_p[t], s.greedy[t],
                                 s.any_sampled, s.any_filtered)
        return BatchState(
            self.target_cache.select(t),
            self.draft_cache.select(t) if self.draft_cache is not None else None,
            self.lens[t], self.anchor[t], self.seed[t], self.key[t], sampling,
            [self.host_lens[i] for i in idx], [self.rows[i] for i in idx])
