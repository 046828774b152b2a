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
    ``empty`` stores them head-major: the tensors are transposed views, not contiguous.

    ``side``: further per-position buffers [R, max_len, ...] kept beside K/V (moved by ``rows``
    and ``compact_`` with them): the draft keeps its context hidden there, so target-only steps
    defer its K/V projection (``commit_side``, ``read_side``).
    The cache does not know the lengths: callers pass `lens` [R] (int64, on the cache's device).
    """

    k: tuple[torch.Tensor, ...]
    v: tuple[torch.Tensor, ...]
    side: tuple[torch.Tensor, ...] = ()

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
        # Stored head-major, [R, n_kv, max_len, hd] (each head's rows contiguous, as attention
        # reads them: faster decode attention than position-major),
        # seen through [R, max_len, n_kv, hd] views (``k[layer][r, t]`` is position t).
        shape = (batch, n_kv_heads, max_len, head_dim)
        k = tuple(torch.zeros(shape, dtype=dtype, device=device).transpose(1, 2)
                  for _ in range(num_layers))
        v = tuple(torch.zeros(shape, dtype=dtype, device=device).transpose(1, 2)
                  for _ in range(num_layers))
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
        where = _rows_at(lens, counts, t, self.max_len)
        for layer, (k_new, v_new) in enumerate(new_kv):
            for buf, new in ((self.k[layer], k_new), (self.v[layer], v_new)):
                _masked_write(buf, new, where, f"layer {layer} new KV")

    def commit_side(self, i: int, new: torch.Tensor, lens: torch.Tensor, counts: torch.Tensor) -> None:
        """``commit`` for side buffer ``i``: rows [0, counts[r]) of new [R, T, ...] at lens[r] ..."""
        if lens.shape != (self.batch_size,) or counts.shape != lens.shape:
            raise InvalidInputError(f"commit_side: lens {tuple(lens.shape)} and counts "
                                    f"{tuple(counts.shape)} must be [{self.batch_size}]")
        where = _rows_at(lens, counts, new.shape[1], self.max_len)
        _masked_write(self.side[i], new, where, f"side buffer {i}")

    def read_side(self, i: int, positions: torch.Tensor) -> torch.Tensor:
        """Side buffer ``i`` at positions [R, T] (each < max_len) → [R, T, ...]."""
        req = torch.arange(positions.shape[0], device=positions.device)[:, None]
        return self.side[i][req, positions]

    def rows(self, n: int) -> KVCache:
        """A view of slots [0, n): same storage, so commits through it land in this cache."""
        return KVCache(tuple(b[:n] for b in self.k), tuple(b[:n] for b in self.v),
                       tuple(b[:n] for b in self.side))

    def compact_(self, idx: torch.Tensor | Sequence[int], upto: int | None = None) -> None:
        """In place: slots [0, n) receive requests `idx` [n] in order; storage (and graph pointers) stay put.

        Slots [n, R) keep stale data (never read: rows past a request's length are masked). n
        comes from idx's shape (no sync). ``upto``: only positions [0, upto) are moved (the
        caller knows every kept request's length is at most that; later rows are scratch).
        A host list ``idx`` moves only the slots whose request changes (none when the batch
        drops its last rows): at real scale a slot is hundreds of MB of cache.
        """
        n = len(idx) if not isinstance(idx, torch.Tensor) else idx.shape[0]
        if n > self.batch_size:
            raise InvalidInputError(f"compact_: {n} indices for a cache of {self.batch_size} requests")
        upto = self.max_len if upto is None else min(int(upto), self.max_len)
        if isinstance(idx, torch.Tensor):
            dst, src = torch.arange(n, device=idx.device), idx
        else:
            moved = [(j, int(s)) for j, s in enumerate(idx) if int(s) != j]
            if not moved or upto <= 0:
                return
            dst, src = (torch.tensor(x, dtype=torch.int64, device=self.device)
                        for x in zip(*moved))
        for buf in (*self.k, *self.v, *self.side):
            live = buf[:, :upto]
            live.index_copy_(0, dst, live.index_select(0, src))


def _rows_at(lens: torch.Tensor, counts: torch.Tensor, t: int, max_len: int):
    """(req [R, 1], pos [R, T], keep [R, T]) of a masked commit of T rows at ``lens``."""
    steps = torch.arange(t, device=lens.device)  # [T]
    req = torch.arange(lens.shape[0], device=lens.device)[:, None]  # [R, 1]
    return req, (lens[:, None] + steps) % max_len, steps < counts[:, None]


def _masked_write(buf: torch.Tensor, new: torch.Tensor, where, what: str) -> None:
    """Rows t < counts[r] of new [R, T, ...] into buf [R, max_len, ...] at lens[r] + t; the other
    rows write back what is there (no device→host sync). ``where``: ``_rows_at``'s indices."""
    req, pos, keep = where
    if new.shape != (buf.shape[0], pos.shape[1], *buf.shape[2:]):
        raise InvalidInputError(f"commit: {what} has shape {tuple(new.shape)}, expected "
                                f"{(buf.shape[0], pos.shape[1], *buf.shape[2:])}")
    keep = keep.view(*keep.shape, *([1] * (new.dim() - 2)))
    buf.index_put_((req, pos), torch.where(keep, new.to(buf.dtype), buf[req, pos]))
