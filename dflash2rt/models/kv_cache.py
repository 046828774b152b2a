"""KVCache: static per-layer key/value buffers, written by masked commits without device->host syncs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dflash2rt.errors import InvalidInputError

NewKV = Sequence[tuple[torch.Tensor, torch.Tensor]]  # per layer: k, v [R, T, n_kv, hd]


@dataclass(frozen=True)
class KVCache:
    """Per-layer K and V [R, max_len, n_kv, hd]; row t of request r holds position t (rotated keys).

    The cache does not know the lengths: callers pass `lens` [R] (int64, on the cache's device).
    """

    k: tuple[torch.Tensor, ...]
    v: tuple[torch.Tensor, ...]

    @classmethod
    def empty(
        cls,
        num_layers: int,
        batch: int,
        max_len: int,
        n_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> KVCache:
        """Zero-filled buffers for `batch` requests of up to `max_len` rows."""
        for name, value in (("num_layers", num_layers), ("batch", batch), ("max_len", max_len),
                            ("n_kv_heads", n_kv_heads), ("head_dim", head_dim)):
            if value <= 0:
                raise InvalidInputError(f"KVCache.empty: {name} must be positive, got {value}")
        shape = (batch, max_len, n_kv_heads, head_dim)
        k = tuple(torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers))
        v = tuple(torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers))
        return cls(k, v)

    @property
    def num_layers(self) -> int:
        return len(self.k)

    @property
    def batch_size(self) -> int:
        return self.k[0].shape[0]

    @property
    def max_len(self) -> int:
        return self.k[0].shape[1]

    @property
    def dtype(self) -> torch.dtype:
        return self.k[0].dtype

    @property
    def device(self) -> torch.device:
        return self.k[0].device

    def commit(self, new_kv: NewKV, lens: torch.Tensor, counts: torch.Tensor) -> None:
        """Write rows [0, counts[r]) of request r at positions lens[r] .. lens[r] + counts[r] - 1.

        Rows t >= counts[r] leave the cache bit-identical (rejected rows leave no trace). No device->host
        sync: every request writes all T rows at distinct slots (lens + t) mod max_len, the rejected rows
        writing back the value already there. The caller guarantees lens + counts <= max_len.
        """
        if len(new_kv) != self.num_layers:
            raise InvalidInputError(f"commit: got {len(new_kv)} layers of new KV, cache has {self.num_layers}")
        r, t = new_kv[0][0].shape[:2]
        if lens.shape != (r,) or counts.shape != (r,) or r != self.batch_size:
            raise InvalidInputError(
                f"commit: lens {tuple(lens.shape)} and counts {tuple(counts.shape)} must be [{self.batch_size}] "
                f"and the new KV batch ({r}) must equal the cache batch"
            )
        if t > self.max_len:
            raise InvalidInputError(f"commit: {t} new rows exceed max_len {self.max_len}")
        if lens.dtype != torch.int64 or counts.dtype != torch.int64:
            raise InvalidInputError(f"commit: lens and counts must be int64, got {lens.dtype} and {counts.dtype}")
        steps = torch.arange(t, device=lens.device)  # [T]
        pos = (lens[:, None] + steps) % self.max_len  # [R, T]
        keep = (steps < counts[:, None])[..., None, None]  # [R, T, 1, 1]
        req = torch.arange(r, device=lens.device)[:, None]  # [R, 1]
        for layer, (k_new, v_new) in enumerate(new_kv):
            for buf, new in ((self.k[layer], k_new), (self.v[layer], v_new)):
                if new.shape != (r, t, *buf.shape[2:]):
                    raise InvalidInputError(
                        f"commit: layer {layer} new KV has shape {tuple(new.shape)}, expected "
                        f"{(r, t, *buf.shape[2:])}"
                    )
                rows = torch.where(keep, new.to(buf.dtype), buf[req, pos])  # [R, T, n_kv, hd]
                buf.index_put_((req, pos), rows)

    def rows(self, n: int) -> KVCache:
        """A view of slots [0, n): same storage, so commits through it land in this cache."""
        return KVCache(tuple(b[:n] for b in self.k), tuple(b[:n] for b in self.v))

    def compact_(self, idx: torch.Tensor) -> None:
        """In place: slots [0, n) receive requests `idx` [n] in order; storage (and graph pointers) stay put.

        Slots [n, R) keep stale data (never read: rows past a request's length are masked). n
        comes from idx's shape (no sync).
        """
        n = idx.shape[0]
        if n > self.batch_size:
            raise InvalidInputError(f"compact_: {n} indices for a cache of {self.batch_size} requests")
        for buf in (*self.k, *self.v):
            buf[:n] = buf.index_select(0, idx)
