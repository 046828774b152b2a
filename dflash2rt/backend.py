"""The typed backend contract the hot path calls, and its device-generic torch implementation."""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch

from .ops import conv, selector, verify
from .ops.batch import BlockNoise, SamplingBatch


@dataclass(frozen=True)
class Probe:
    """What a backend found at run time on this machine.

    ``reason`` says why the backend is unavailable (never empty then); for an available backend it
    may add a note. ``kernels``, ``dtypes`` and ``graphs`` say what the backend would use here.
    """

    available: bool
    reason: str = ""
    device: str = ""
    kernels: str = ""
    dtypes: tuple[str, ...] = ()
    graphs: str = ""
    details: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.available and not self.reason.strip():
            raise ValueError("an unavailable backend must say why (Probe.reason)")


@dataclass(frozen=True)
class BackendSpec:
    """One backend a plugin offers: a run-time probe and a factory for the typed Backend.

    ``priority``: higher is preferred by ``auto`` (the CPU backend is lowest). ``opt_in`` backends
    (e.g. a CPU interpreter lane for GPU kernels) are only used when asked for by name.
    """

    name: str
    priority: int
    probe: Callable[[], Probe]
    create: Callable[[Probe], "Backend"]
    summary: str = ""
    opt_in: bool = False


class Backend(abc.ABC):
    """The DFlash2 ops on one device. Engines call these methods directly (no pluggy dispatch)."""

    name: str
    device: torch.device
    dtypes: tuple[torch.dtype, ...]
    graph_adapter: Any = None            # a dflash2rt.graphs GraphAdapter, or None for eager

    def __init__(self) -> None:
        self.fallbacks: list[str] = []   # every alternative path taken, reported in run stats

    def report_fallback(self, what: str) -> None:
        if what not in self.fallbacks:
            self.fallbacks.append(what)

    @abc.abstractmethod
    def conv_prepare(self, x: torch.Tensor, base: torch.Tensor, delta: torch.Tensor,
                     block_size: int) -> torch.Tensor:
        """Input side of the DFlash2 conv: x [N, H], base [Tk, H], delta [N, Tk, G] → [N, H]."""

    @abc.abstractmethod
    def conv_finish(self, h: torch.Tensor, a: torch.Tensor, base: torch.Tensor,
                    delta: torch.Tensor, block_size: int) -> torch.Tensor:
        """Output side: h + conv(a, base, delta) → [N, H]."""

    @abc.abstractmethod
    def select(self, logits: torch.Tensor, proj: torch.Tensor, anchor: torch.Tensor,
               pred_codebook: torch.Tensor, succ_codebook: torch.Tensor,
               params: selector.SelectorParams, sampling: SamplingBatch,
               u_walk: torch.Tensor) -> selector.SelectorOut:
        """Candidate selector: top-K, lattice, walk (see ``dflash2rt.ops.selector``)."""

    @abc.abstractmethod
    def verify(self, logits: torch.Tensor, draft: torch.Tensor, candidates: torch.Tensor,
               q: torch.Tensor, sampling: SamplingBatch, noise: BlockNoise,
               check: bool = True) -> verify.VerifyOut:
        """Lossless verification (see ``dflash2rt.ops.verify``)."""

    def noise(self, seed: torch.Tensor, request: torch.Tensor, anchor_pos: torch.Tensor,
              gamma: int) -> BlockNoise:
        """All uniforms of one step, from the counter-based generator (identical on every device)."""
        return BlockNoise.draw(seed, request, anchor_pos, gamma)


class TorchOpsBackend(Backend):
    """The reference semantics: device-generic torch ops, eager, on ``device``."""

    def __init__(self, name: str, device: torch.device | str,
                 dtypes: tuple[torch.dtype, ...]) -> None:
        super().__init__()
        self.name = name
        self.device = torch.device(device)
        self.dtypes = dtypes

    def conv_prepare(self, x, base, delta, block_size):
        return conv.conv_prepare(x, base, delta, block_size)

    def conv_finish(self, h, a, base, delta, block_size):
        return conv.conv_finish(h, a, base, delta, block_size)

    def select(self, logits, proj, anchor, pred_codebook, succ_codebook, params, sampling, u_walk):
        return selector.select(logits, proj, anchor, pred_codebook, succ_codebook, params,
                               sampling, u_walk)

    def verify(self, logits, draft, candidates, q, sampling, noise, check=True):
        return verify.verify(logits, draft, candidates, q, sampling, noise, check)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} on {self.device}>"
