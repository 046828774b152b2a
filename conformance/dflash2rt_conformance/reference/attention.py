"""Attention over cache rows with a key range per query row, as a float64 loop.

    out[r, j, h] = Σ_{lo[r, j] <= p < hi[r, j]} softmax_p(scale · q[r, j, h] · k[r, p, h // G]) ·
                   v[r, p, h // G],          G = nh / n_kv (query head h reads KV head h // G)
"""

from __future__ import annotations

import numpy as np


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, lo: np.ndarray, hi: np.ndarray,
              scale: float) -> np.ndarray:
    """q [R, T, nh, hd], k / v [R, L, n_kv, hd], lo / hi [R, T] (lo < hi <= L) → [R, T, nh, hd]
    (float64)."""
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    r_, t_, nh, _ = q.shape
    group = nh // k.shape[2]
    out = np.zeros(q.shape)
    for r in range(r_):
        for j in range(t_):
            a, b = int(lo[r, j]), int(hi[r, j])
            for h in range(nh):
                s = k[r, a:b, h // group] @ q[r, j, h] * scale      # [b - a]
                w = np.exp(s - s.max())
                out[r, j, h] = (w / w.sum()) @ v[r, a:b, h // group]
    return out
