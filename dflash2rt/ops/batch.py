"""Per-request sampling parameters and per-block noise, staged as device tensors for the ops."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from .rng import Stream, uniform_words
from .sampling import check_sampling_params, staged_float32
from .staging import to_device


@dataclass(frozen=True)
class SamplingBatch:
    """Sampling parameters of R requests (select, not branch: greedy rows are flagged, not split).

    ``any_sampled``, ``top_k_max`` and ``top_p_rows`` are host-side facts (known when the
    batch is built, no device sync) that let ops skip work no row needs: ``top_k_max`` bounds
    every row's top_k (0: none truncates), ``top_p_rows`` lists the rows whose float32 top_p
    is below 1. None: not known (graph bodies built from static tensors), so every row may
    truncate.
    """

    temperature: torch.Tensor  # [R] float32, 0 = greedy
    top_k: torch.Tensor        # [R] int64, 0 = off
    top_p: torch.Tensor        # [R] float32, 1 = off
    greedy: torch.Tensor       # [R] bool
    any_sampled: bool
    top_k_max: int | None = None
    top_p_rows: tuple[int, ...] | None = None
    min_p: torch.Tensor | None = None   # [R] float32, 0 = off; None: no row has min-p (host)

    @staticmethod
    def build(temperature: Sequence[float], top_k: Sequence[int], top_p: Sequence[float],
              device: torch.device | str = "cpu",
              min_p: Sequence[float] | None = None) -> "SamplingBatch":
        """Validate each request's parameters and stage them on ``device`` (``min_p`` is
        staged only when some row has min_p > 0), in one host→device copy."""
        return SamplingBatch.build_with(temperature, top_k, top_p, device, min_p)[0]

    @staticmethod
    def build_with(temperature: Sequence[float], top_k: Sequence[int], top_p: Sequence[float],
                   device: torch.device | str = "cpu", min_p: Sequence[float] | None = None,
                   also: Sequence[torch.Tensor] = ()
                   ) -> tuple["SamplingBatch", list[torch.Tensor]]:
        """``build``, with the host tensors ``also`` staged on ``device`` in the same copy →
        (the batch, ``also`` on the device)."""
        for t, k, p in zip(temperature, top_k, top_p, strict=True):
            check_sampling_params(t, k, p)
        f32 = lambda xs: torch.tensor(list(xs), dtype=torch.float32)   # noqa: E731
        host = [f32(temperature), torch.tensor(list(top_k), dtype=torch.int64), f32(top_p)]
        if min_p is not None and any(m > 0 for m in min_p):
            if len(min_p) != len(host[0]):
                raise ValueError("min_p needs one value per request")
            host.append(f32(min_p))
        staged = to_device(device, *host, *also)
        temp, top_k_t, top_p_t = staged[:3]
        staged_min_p = staged[3] if len(host) > 3 else None
        return SamplingBatch(
            temperature=temp,
            top_k=top_k_t,
            top_p=top_p_t,
            greedy=temp == 0,
            any_sampled=any(t > 0 for t in temperature),
            top_k_max=max((int(k) for k in top_k), default=0),
            top_p_rows=tuple(i for i, p in enumerate(top_p) if staged_float32(p) < 1.0),
            min_p=staged_min_p,
        ), staged[len(host):]

    def take(self, idx: Sequence[int]) -> "SamplingBatch":
        """The batch of rows ``idx`` (host-known indices: no device→host sync); the host facts
        stay true (``any_sampled`` and ``top_k_max`` as upper bounds)."""
        t = torch.tensor(list(idx), dtype=torch.int64, device=self.temperature.device)
        nucleus = set(self.top_p_rows or ())
        rows = None if self.top_p_rows is None else \
            tuple(new for new, old in enumerate(idx) if old in nucleus)
        return SamplingBatch(self.temperature[t], self.top_k[t], self.top_p[t], self.greedy[t],
                             self.any_sampled, self.top_k_max, rows,
                             None if self.min_p is None else self.min_p[t])

    @staticmethod
    def greedy_batch(r: int, device: torch.device | str = "cpu") -> "SamplingBatch":
        return SamplingBatch.build([0.0] * r, [0] * r, [1.0] * r, device)


@dataclass(frozen=True)
class BlockNoise:
    """Every uniform one decode step consumes, keyed by (seed, request, absolute position, stream).

    Slot e of the block decides the token at absolute position ``anchor_pos + 1 + e``; the bonus
    decides position ``anchor_pos + 1 + γ``. Streams never overlap, so the draft's walk noise is
    independent of the acceptance, residual and bonus noise.
    """

    walk: torch.Tensor      # [R, γ] float32
    accept: torch.Tensor    # [R, γ] float32
    residual: torch.Tensor  # [R, γ] float32
    bonus: torch.Tensor     # [R] float32

    @staticmethod
    def draw(seed: torch.Tensor, request: torch.Tensor, anchor_pos: torch.Tensor,
             gamma: int) -> "BlockNoise":
        """seed, request, anchor_pos: [R] int64 device tensors (anchor_pos = committed length n).

        One Philox block per (request, position) for positions n+1 .. n+1+γ; its four words are
        the four streams.
        """
        pos = anchor_pos.view(-1, 1) + 1 + torch.arange(gamma + 1, device=anchor_pos.device)
        u = uniform_words(seed.view(-1, 1), request.view(-1, 1), pos)      # [4, R, γ+1]
        return BlockNoise(walk=u[Stream.WALK][:, :gamma], accept=u[Stream.ACCEPT][:, :gamma],
                          residual=u[Stream.RESIDUAL][:, :gamma], bonus=u[Stream.BONUS][:, gamma])

    @staticmethod
    def unused(r: int, gamma: int, device: torch.device | str) -> "BlockNoise":
        """Placeholder noise for an all-greedy batch, whose ops never read noise."""
        half = torch.full((r * (gamma + 1),), 0.5, dtype=torch.float32, device=device)
        slots = half[:r * gamma].view(r, gamma)          # contiguous, as the kernels read them
        return BlockNoise(slots, slots, slots, half[r * gamma:])
