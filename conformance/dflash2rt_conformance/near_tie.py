"""Greedy outputs compared up to near-ties, for L4.

Two greedy decodings of one prompt (speculative vs target-only, tensor-parallel vs unsharded)
may part only where the target's decision is within the dtype's noise: at their first differing
token, the float64 reference's logits after the shared prefix must put the two tokens within
``decision_noise`` of each other. Any other difference, and any difference in length without
a differing token, is a failure."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np

from .reference.model import target_forward
from .tolerances import decision_noise


@dataclass(frozen=True)
class NearTie:
    """A first differing token that the float64 reference explains as a near-tie."""

    position: int            # generated position of the first difference
    got: int
    want: int
    margin: float            # |logit(got) - logit(want)| of the float64 reference
    noise: float             # the dtype's decision noise at the row's logit scale

    def as_dict(self) -> dict:
        return asdict(self)


def first_difference(got: Sequence[int], want: Sequence[int]) -> int | None:
    """The first position where the two token sequences differ (None: a common prefix)."""
    return next((k for k in range(min(len(got), len(want))) if got[k] != want[k]), None)


def greedy_near_tie(w, cfg, prompt: Sequence[int], got: Sequence[int], want: Sequence[int],
                    dtype: str, case: str) -> tuple[int, NearTie | None]:
    """Compare two greedy decodings of ``prompt`` against the float64 reference (``w``,
    ``cfg``: ``models.target_reference``). Returns (tokens equal before the first difference,
    the near-tie there or None when they are equal). Raises AssertionError, naming ``case``,
    when the lengths differ without a differing token or the difference is not a near-tie."""
    k = first_difference(got, want)
    if k is None:
        assert len(got) == len(want), f"[{case}] lengths {len(got)} ≠ {len(want)}"
        return len(got), None
    row = target_forward(w, cfg, list(prompt) + list(got[:k]))[0][-1]
    margin = float(abs(row[got[k]] - row[want[k]]))
    noise = decision_noise(dtype, float(np.abs(row).max()))
    assert margin <= noise, \
        f"[{case}] token {got[k]} ≠ {want[k]} at generated position {k}; float64 logit " \
        f"margin {margin:.3g} is above the {dtype} noise {noise:.3g}, so this is not a near-tie"
    return k, NearTie(k, int(got[k]), int(want[k]), margin, noise)
