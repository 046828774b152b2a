"""Logit processors in float64 (vLLM's definitions and order): logit bias, repetition penalty
over prompt + output tokens, frequency / presence penalties over output tokens; min-p after
top-p. ``invert`` builds raw logits that these processors turn into given processed logits,
so that lattice tables stay lattice-exact *after* processing (levels L2 / L3)."""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np


def process_row(logits: np.ndarray, prompt: Sequence[int], output: Sequence[int], rep: float,
                freq: float, pres: float, bias: Mapping[int, float] | None = None) -> np.ndarray:
    """Raw logits [V] → processed logits [V] after ``output`` tokens (the prompt not included)."""
    x = np.array(logits, dtype=np.float64)
    for t, b in (bias or {}).items():
        x[t] += b
    counts, seen = _counts(output, x.shape[0])
    prompt_mask = np.zeros(x.shape[0], bool)
    prompt_mask[list(prompt)] = True
    r = np.where(prompt_mask | seen, rep, 1.0)
    x = np.where(x > 0, x / r, x * r)
    return x - freq * counts - pres * seen


def invert(processed: np.ndarray, prompt: Sequence[int], output: Sequence[int], rep: float,
           freq: float, pres: float, bias: Mapping[int, float] | None = None) -> np.ndarray:
    """Raw logits whose ``process_row`` is ``processed`` (−inf stays −inf)."""
    y = np.array(processed, dtype=np.float64)
    counts, seen = _counts(output, y.shape[0])
    prompt_mask = np.zeros(y.shape[0], bool)
    prompt_mask[list(prompt)] = True
    z = y + freq * counts + pres * seen
    r = np.where(prompt_mask | seen, rep, 1.0)
    x = np.where(z > 0, z * r, z / r)
    for t, b in (bias or {}).items():
        x[t] -= b
    return x


def apply_min_p(p: np.ndarray, min_p: float) -> np.ndarray:
    """Probabilities [V] → tokens with p ≥ min_p · max p kept, renormalized (0: unchanged)."""
    if min_p <= 0:
        return p
    kept = np.where(p >= min_p * p.max(), p, 0.0)
    return kept / kept.sum()


def _counts(output: Sequence[int], v: int) -> tuple[np.ndarray, np.ndarray]:
    counts = np.zeros(v)
    for t in output:
        counts[int(t)] += 1
    return counts, counts > 0
