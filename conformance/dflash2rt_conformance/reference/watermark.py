"""Keyed watermark values and Gumbel-max draws in NumPy (uint64 Philox, float64 arithmetic).

Subkeys come in as (k0, k1, word) uint32 triples. Context hash: Philox-4x32-10 over the window's
words (id + 1, 0 before the start; zero-padded to 4, then to an even count), counter = words
0..3 under key (CONTEXT_KEY[0], CONTEXT_KEY[1] + h), then (s0, s1, w_i, w_i+1) under
(CONTEXT_KEY[0] + i, CONTEXT_KEY[1] + h) for i = 4, 6, ...; the hash is (s0, s1). Value: word
0 of Philox at counter (ctx lo, ctx hi, token, word) under key (k0, k1), as ``(2k + 1)·2⁻²⁴``
with k = bits >> 9. E = -log r by frexp + an 18-term atanh series in a fixed order (the
runtime's order: the same float64 roundings give the same bits). The draw is
argmin E / p (float64), ties to the lower token id (then the lower position), p = 0 never chosen,
-1 for a row that is not a law.
"""

from __future__ import annotations

import numpy as np

from .rng import M32, bits_to_uniform, philox4x32

CONTEXT_KEY = (0x6A09E667, 0x3C6EF372)
COIN_TOKEN = 0xFFFFFFFF
LN2 = 0.6931471805599453
SERIES = tuple(1.0 / (2 * j + 1) for j in range(18))


def _u64(x) -> np.ndarray:
    return np.asarray(x, dtype=np.int64).astype(np.uint64)


def context_hash(window) -> np.ndarray:
    """[..., h] int64 (−1 = before the start) → int64 [...] (the 64 bits, two's complement)."""
    w = np.asarray(window, dtype=np.int64)
    h = w.shape[-1]
    words = [np.where(w[..., i] >= 0, _u64(w[..., i] + 1) & M32, np.uint64(0)) for i in range(h)]
    zero = np.zeros(w.shape[:-1], np.uint64)
    words += [zero] * (max(4, h + h % 2) - h)             # to 4 words, then to an even count

    def key(i):
        return (np.uint64((CONTEXT_KEY[0] + i) & 0xFFFFFFFF),
                np.uint64((CONTEXT_KEY[1] + h) & 0xFFFFFFFF))
    s0, s1, _, _ = philox4x32(tuple(words[:4]), key(0))
    for i in range(4, len(words), 2):
        s0, s1, _, _ = philox4x32((s0, s1, words[i], words[i + 1]), key(i))
    return ((s1 << np.uint64(32)) | s0).astype(np.int64)


def keyed_bits(sub, ctx, token) -> np.ndarray:
    """sub = (k0, k1, word); broadcast ctx (int64 hash) and token ids → uint64 in [0, 2³²)."""
    k0, k1, word = sub
    c, t = np.broadcast_arrays(_u64(ctx), _u64(token))
    counter = (c & M32, c >> np.uint64(32), t & M32, np.full(c.shape, word, np.uint64))
    return philox4x32(counter, (np.uint64(k0), np.uint64(k1)))[0]


def keyed_uniforms(sub, ctx, token) -> np.ndarray:
    return bits_to_uniform(keyed_bits(sub, ctx, token))


def neg_log(u) -> np.ndarray:
    m, e = np.frexp(np.asarray(u, np.float64))
    s = (1.0 - m) / (1.0 + m)
    z = s * s
    acc = np.full_like(z, SERIES[-1])
    for c in reversed(SERIES[:-1]):
        acc = acc * z + c
    return (2.0 * s) * acc - e.astype(np.float64) * LN2


def _is_law(p: np.ndarray) -> bool:
    return bool(np.isfinite(p).all() and not (p < 0).any() and (p > 0).any())


def exp_min(p, ids, e) -> int:
    """One row: the winning position (−1 if p is not a law)."""
    p, ids, e = np.asarray(p, np.float64), np.asarray(ids), np.asarray(e, np.float64)
    if not _is_law(p):
        return -1
    with np.errstate(divide="ignore", invalid="ignore"):
        key = np.where(p > 0, e / np.where(p > 0, p, 1.0), np.inf)
    tied = np.flatnonzero(key == key.min())
    return int(tied[np.argmin(ids[tied])])


def draw_dense(sub, ctx, probs) -> np.ndarray:
    """ctx [R], probs [R, V] → token [R]."""
    probs = np.asarray(probs, np.float64)
    v = probs.shape[-1]
    e = neg_log(keyed_uniforms(sub, np.asarray(ctx).reshape(-1, 1), np.arange(v)[None, :]))
    return np.array([exp_min(p, np.arange(v), row) for p, row in zip(probs, e)], np.int64)


def draw_sparse(sub, ctx, ids, probs) -> np.ndarray:
    """ctx [R], ids / probs [R, K] → position [R]."""
    ids = np.asarray(ids, np.int64)
    e = neg_log(keyed_uniforms(sub, np.asarray(ctx).reshape(-1, 1), ids))
    return np.array([exp_min(p, i, row) for p, i, row in zip(np.asarray(probs), ids, e)],
                    np.int64)


def coin(sub, ctx) -> np.ndarray:
    return keyed_uniforms(sub, ctx, COIN_TOKEN)
