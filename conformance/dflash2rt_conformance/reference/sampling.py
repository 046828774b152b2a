"""Logit processing in float64: temperature → top-k (ties kept) → top-p → min-p, inverse-CDF
sampling (bias and penalties come first, on the raw logits: ``procs``)."""

from __future__ import annotations

import numpy as np

from .procs import apply_min_p


def bad_rows(logits: np.ndarray) -> np.ndarray:
    """[..., V] → bool [...]: NaN or +inf anywhere, or no finite entry (−inf is a mask)."""
    return (np.isnan(logits) | np.isposinf(logits)).any(-1) | ~np.isfinite(logits).any(-1)


def softmax(x: np.ndarray) -> np.ndarray:
    """Softmax over the last axis; −inf entries get exactly 0."""
    m = np.max(x, axis=-1, keepdims=True)
    e = np.exp(x - m)
    return e / e.sum(-1, keepdims=True)


def probs_row(logits: np.ndarray, temperature: float, top_k: int, top_p: float,
              min_p: float = 0.0) -> np.ndarray:
    """One row [V] → probabilities [V]. temperature 0 is computed at 1 (the caller uses argmax)."""
    v = logits.shape[-1]
    x = logits.astype(np.float64) / (temperature if temperature > 0 else 1.0)
    order = np.lexsort((np.arange(v), -x))              # descending value, lower id first on ties
    srt = x[order]
    k = v if top_k <= 0 else min(int(top_k), v)
    keep = srt >= srt[k - 1]                            # top-k, ties with the k-th value kept
    srt = np.where(keep, srt, -np.inf)
    if top_p < 1.0:
        p = softmax(srt)
        before = np.cumsum(p) - p                       # mass strictly ahead of each token
        keep_p = before < top_p
        keep_p[0] = True
        srt = np.where(keep_p, srt, -np.inf)
    out = np.full(v, -np.inf)
    out[order] = srt
    return apply_min_p(softmax(out), min_p)


def target_probs(logits: np.ndarray, temperature, top_k, top_p, min_p=None) -> np.ndarray:
    """logits [R, T, V]; per-request temperature / top_k / top_p (/ min_p) [R] → float64
    [R, T, V]."""
    r, t, _ = logits.shape
    mp = np.zeros(r) if min_p is None else min_p
    return np.stack([np.stack([probs_row(logits[i, j], float(temperature[i]), int(top_k[i]),
                                         float(top_p[i]), float(mp[i])) for j in range(t)])
                     for i in range(r)])


def inverse_cdf(weights: np.ndarray, u: float) -> int:
    """First index whose cumulative weight exceeds u·total, clamped to the last positive weight.

    float64 weights, or an object array of Fractions for exact arithmetic. A row that is not a
    law (a NaN, ±inf or negative weight, or zero total) returns -1: nothing is emitted from it."""
    w = np.asarray(weights)
    cdf = np.cumsum(w)
    total = cdf[-1]
    if not (total > 0) or total == np.inf or _any_negative(w):       # NaN fails total > 0
        return -1
    idx = int(np.sum(cdf <= u * total))
    positive = np.nonzero(w > 0)[0]
    last = int(positive[-1]) if positive.size else 0
    return min(idx, last)


def _any_negative(w: np.ndarray) -> bool:
    """(A Python loop is faster on the lattice levels' few tokens, and works on Fractions.)"""
    return bool((w < 0).any()) if w.dtype != object and w.size > 64 else any(x < 0 for x in w)


def argmax_lowest(x: np.ndarray) -> int:
    """Index of the maximum, the lowest one on ties (NaN-free input)."""
    return int(np.flatnonzero(x == np.max(x))[0])
