"""Philox-4x32-10 in NumPy uint64 arithmetic, with dflash2rt's key / counter layout.

Key = seed (64 bit: lo, hi word); counter = (position lo, position hi, request, 0); the four
output words of that one block are the four streams WALK, ACCEPT, RESIDUAL, BONUS (0..3).
Uniforms are ``(2k + 1) · 2^-24`` with ``k = bits >> 9`` (never 0 or 1, exact in float32).
"""

from __future__ import annotations

import numpy as np

M32 = np.uint64(0xFFFFFFFF)
MUL0, MUL1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
W0, W1 = np.uint64(0x9E3779B9), np.uint64(0xBB67AE85)
ROUNDS = 10
WALK, ACCEPT, RESIDUAL, BONUS = 0, 1, 2, 3          # stream = output word of the block


def philox4x32(counter, key):
    """Four uint32 words (as uint64 arrays) after 10 rounds; a·m < 2^64 is exact in uint64."""
    c0, c1, c2, c3 = (np.asarray(c, dtype=np.uint64) for c in counter)
    k0, k1 = (np.asarray(k, dtype=np.uint64) for k in key)
    for _ in range(ROUNDS):
        p0, p1 = c0 * MUL0, c2 * MUL1
        hi0, lo0 = p0 >> np.uint64(32), p0 & M32
        hi1, lo1 = p1 >> np.uint64(32), p1 & M32
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0, k1 = (k0 + W0) & M32, (k1 + W1) & M32
    return c0, c1, c2, c3


def _u64(x) -> np.ndarray:
    """Python ints / int64 arrays → uint64 holding the same two's-complement bits."""
    return np.asarray(x, dtype=np.int64).astype(np.uint64)


def words(seed, request, position) -> tuple[np.ndarray, ...]:
    """The block's four 32-bit words for each broadcast (seed, request, position)."""
    seed, request, position = np.broadcast_arrays(_u64(seed), _u64(request), _u64(position))
    counter = (position & M32, (position >> np.uint64(32)) & M32, request & M32,
               np.zeros(position.shape, np.uint64))
    return philox4x32(counter, (seed & M32, (seed >> np.uint64(32)) & M32))


def random_bits(seed, request, position, stream: int) -> np.ndarray:
    return words(seed, request, position)[stream]


def bits_to_uniform(bits: np.ndarray) -> np.ndarray:
    k = (np.asarray(bits, dtype=np.uint64) >> np.uint64(9)).astype(np.float64)
    return (2.0 * k + 1.0) * 2.0 ** -24


def uniforms(seed, request, position, stream: int) -> np.ndarray:
    """float64 uniforms in (0, 1), each exactly representable in float32."""
    return bits_to_uniform(random_bits(seed, request, position, stream))


def block_noise(seed, request, anchor_pos, gamma: int) -> dict[str, np.ndarray]:
    """walk / accept / residual [R, γ] at positions n+1..n+γ, bonus [R] at n+1+γ."""
    seed, request, anchor_pos = (np.asarray(x, dtype=np.int64).reshape(-1)
                                 for x in (seed, request, anchor_pos))
    pos = anchor_pos[:, None] + 1 + np.arange(gamma)[None, :]
    s, q = seed[:, None], request[:, None]
    return {"walk": uniforms(s, q, pos, WALK), "accept": uniforms(s, q, pos, ACCEPT),
            "residual": uniforms(s, q, pos, RESIDUAL),
            "bonus": uniforms(seed, request, anchor_pos + 1 + gamma, BONUS)}
