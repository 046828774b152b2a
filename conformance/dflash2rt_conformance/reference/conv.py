"""The DFlash2 grouped dynamic depthwise convolution, both sides, as a float64 loop.

    conv(x, base, δ)[i, c] = Σ_{t<Tk} (base[t, c] + δ[i, t, c // group_size]) · x[i - t, c]

``i`` is the row within its block; taps reaching before the block start read zero.
"""

from __future__ import annotations

import numpy as np


def conv(x: np.ndarray, base: np.ndarray, delta: np.ndarray, block_size: int) -> np.ndarray:
    """x [N, H], base [Tk, H], delta [N, Tk, G] → [N, H] (float64)."""
    n, h = x.shape
    taps, groups = base.shape[0], delta.shape[2]
    gs = h // groups
    x, base, delta = (np.asarray(a, dtype=np.float64) for a in (x, base, delta))
    out = np.zeros((n, h))
    for row in range(n):
        i = row % block_size
        for t in range(min(taps, i + 1)):
            w = base[t] + np.repeat(delta[row, t], gs)          # [H]
            out[row] += w * x[row - t]
    return out


def conv_prepare(x, base_in, delta_in, block_size):
    """Input side: the sublayer's input x' = conv(norm(h), base[0], δ[:, 0])."""
    return conv(x, base_in, delta_in, block_size)


def conv_finish(h, a, base_out, delta_out, block_size):
    """Output side: h + conv(a, base[1], δ[:, 1])."""
    return np.asarray(h, dtype=np.float64) + conv(a, base_out, delta_out, block_size)
