"""Draw sources: the randomness the selector's walk and verification draw with, an argument of
``select`` and ``verify`` like their logits. The ordinary source is the step's uniforms
(``BlockNoise``: select takes its walk uniforms [R, γ], verify the whole ``BlockNoise``); a
``DrawSource`` makes some of those draws itself, from the same laws (the watermark's keyed
Gumbel-max, ``watermark.generate.KeyedDraws``), and falls back to its ``noise`` elsewhere. A
source whose draws a device cannot make raises from ``walker`` / ``verify_draws`` before any
work is done (the watermark without float64: ``WatermarkUnsupportedError``); no op replaces it
by the ordinary noise.
"""

from __future__ import annotations

import abc
from typing import Protocol, Union

import torch

from .batch import BlockNoise


class WalkDraw(Protocol):
    """Draws the walk's candidate at slot e from the law row it reads (sampled rows)."""

    def pick(self, slot: int, law: torch.Tensor, cand: torch.Tensor, plain: torch.Tensor,
             greedy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """law [R, K] float32, cand [R, K], plain [R] (the unkeyed walk's position), greedy [R]
        → (position in K [R], bool [R]: a sampled row whose law row is not a law)."""


class EmitDraw(Protocol):
    """Draws the emitted token of sampled rows from the law it is emitted from."""

    def emit(self, law: torch.Tensor, slot: torch.Tensor, plain: torch.Tensor) -> torch.Tensor:
        """law [R, V] float64 weights, slot [R] (the emitting row: the first rejected slot, or
        γ for the bonus), plain [R] (the uniform's inverse-CDF draw) → token [R], -1 where the
        row is not a law."""


class DrawSource(abc.ABC):
    """Draws of one block that replace the ordinary uniforms' (``noise``) where it applies.

    ``walker(has_fp64)``: a fresh ``WalkDraw`` for one walk (it follows the path
    it takes); ``verify_draws(draft, has_fp64)``: the acceptance uniforms verification uses and
    an ``EmitDraw`` for the residual / bonus draw, given the block's drafts."""

    noise: BlockNoise

    @abc.abstractmethod
    def walker(self, has_fp64: bool | None = None) -> WalkDraw:
        """The walk's drawer (raises where the device cannot make these draws)."""

    @abc.abstractmethod
    def verify_draws(self, draft: torch.Tensor, has_fp64: bool | None = None
                     ) -> tuple[BlockNoise, EmitDraw]:
        """draft [R, γ] → (the block's uniforms with this source's acceptance coins, the
        residual / bonus drawer); raises where the device cannot make these draws."""


WalkDraws = Union[torch.Tensor, DrawSource]       # select's: u_walk [R, γ], or a source
Draws = Union[BlockNoise, DrawSource]             # verify's: the block's noise, or a source


def walk_draws(draws: WalkDraws, has_fp64: bool | None = None
               ) -> tuple[torch.Tensor, WalkDraw | None]:
    """select's draws → (the walk uniforms [R, γ], the source's walk drawer or None)."""
    if isinstance(draws, DrawSource):
        return draws.noise.walk, draws.walker(has_fp64)
    return draws, None


def verify_draws(draws: Draws, draft: torch.Tensor, has_fp64: bool | None = None
                 ) -> tuple[BlockNoise, EmitDraw | None]:
    """verify's draws → (the uniforms it decides with, the source's emit drawer or None)."""
    if isinstance(draws, DrawSource):
        return draws.verify_draws(draft, has_fp64)
    return draws, None
