"""Counter-based random numbers: Philox-4x32-10 keyed by (seed, request, position, stream).

Every random number dflash2rt uses is a pure function of its key, so the same seed gives the same
uniforms on every device, in every batch composition and order. Key = the 64-bit seed; counter =
(position lo, position hi, request, 0); the block's four output words are the four streams. On
CPU tensors the arithmetic is exact uint64 NumPy; elsewhere int64 tensors with 16-bit limbs for
the 32x32-bit products, which is exact on every torch device (both paths are tested equal).

Uniforms are ``(2k + 1) * 2**-24`` for a 23-bit ``k``: exactly representable in float32, never 0
or 1, and ``u * q`` with float32 ``q`` is exact in float64 (24 + 24 < 53 bits); devices without
float64 decide ``u * q < p`` exactly in int64 instead (``exact32.accept``).
"""

from __future__ import annotations

import enum

import numpy as np
import torch

_M32 = 0xFFFFFFFF
_MUL0, _MUL1 = 0xD2511F53, 0xCD9E8D57   # Philox-4x32 multipliers (Salmon et al., 2011)
_W0, _W1 = 0x9E3779B9, 0xBB67AE85       # Weyl key increments
ROUNDS = 10


class Stream(enum.IntEnum):
    """Independent streams = the four output words of one Philox block per (seed, request,
    position); draft randomness never shares a word with verification."""

    WALK = 0        # selector walk, one uniform per draft slot
    ACCEPT = 1      # acceptance coin u in u*q < p
    RESIDUAL = 2    # residual sample after the first rejection
    BONUS = 3       # bonus sample after a fully accepted block (and the token after prefill)


def _mulhilo(a: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(hi, lo) 32-bit halves of a * m for 32-bit a (int64 tensor) and a 32-bit constant m."""
    m_lo, m_hi = m & 0xFFFF, m >> 16
    p_lo = a * m_lo                       # < 2**48
    p_hi = a * m_hi                       # < 2**48
    lo = (p_lo + ((p_hi & 0xFFFF) << 16)) & _M32
    hi = (p_hi + (p_lo >> 16)) >> 16      # floor(a*m / 2**32), all terms < 2**49
    return hi & _M32, lo


def philox4x32(counter: tuple[torch.Tensor, ...], key: tuple[torch.Tensor, torch.Tensor]
               ) -> tuple[torch.Tensor, ...]:
    """Philox-4x32-10 on int64 tensors holding uint32 values; returns four uint32 words."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for _ in range(ROUNDS):
        hi0, lo0 = _mulhilo(c0, _MUL0)
        hi1, lo1 = _mulhilo(c2, _MUL1)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0 = (k0 + _W0) & _M32
        k1 = (k1 + _W1) & _M32
    return c0, c1, c2, c3


def _split(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x = x.to(torch.int64)
    return x & _M32, (x >> 32) & _M32


def philox_np(counter: tuple[np.ndarray, ...], key: tuple[np.ndarray, np.ndarray]
              ) -> tuple[np.ndarray, ...]:
    """Philox-4x32-10 in exact uint64 NumPy arithmetic (the fast path for CPU tensors)."""
    c0, c1, c2, c3 = (np.asarray(c, dtype=np.uint64) for c in counter)
    k0, k1 = (np.asarray(k, dtype=np.uint64) for k in key)
    m32 = np.uint64(_M32)
    for _ in range(ROUNDS):
        p0, p1 = c0 * np.uint64(_MUL0), c2 * np.uint64(_MUL1)   # < 2**64, exact
        c0, c1, c2, c3 = (p1 >> np.uint64(32)) ^ c1 ^ k0, p1 & m32, \
            (p0 >> np.uint64(32)) ^ c3 ^ k1, p0 & m32
        k0, k1 = (k0 + np.uint64(_W0)) & m32, (k1 + np.uint64(_W1)) & m32
    return c0, c1, c2, c3


def philox_words(seed: torch.Tensor, request: torch.Tensor, position: torch.Tensor
                 ) -> tuple[torch.Tensor, ...]:
    """The four 32-bit words (int64 tensors) of the Philox block keyed by seed (64 bit) at
    counter (position lo, position hi, request, 0), for each broadcast element."""
    seed, request, position = (torch.as_tensor(t) for t in (seed, request, position))
    device = position.device
    seed, request, position = torch.broadcast_tensors(
        seed.to(device, torch.int64), request.to(device, torch.int64), position.to(torch.int64))
    k0, k1 = _split(seed)
    p0, p1 = _split(position)
    c2 = request & _M32
    if device.type == "cpu":
        words = philox_np((p0.numpy(), p1.numpy(), c2.numpy(), np.zeros(p0.shape, np.uint64)),
                          (k0.numpy(), k1.numpy()))
        return tuple(torch.from_numpy(np.asarray(w, dtype=np.int64)) for w in words)
    return philox4x32((p0, p1, c2, torch.zeros_like(p0)), (k0, k1))


def random_bits(seed: torch.Tensor, request: torch.Tensor, position: torch.Tensor,
                stream: int) -> torch.Tensor:
    """32 random bits (int64 in [0, 2**32)) of ``stream`` for each broadcast key element."""
    return philox_words(seed, request, position)[int(stream)]


def bits_to_uniform(bits: torch.Tensor) -> torch.Tensor:
    """uint32 bits → float32 uniforms (2k + 1)·2⁻²⁴, k = bits >> 9: never 0, never 1, exact.

    2k + 1 < 2²⁴ is an exact float32 integer and the scaling a power of two, so no float64 is
    needed (devices without float64 get the same values bit for bit)."""
    k = bits >> 9
    return (2 * k + 1).to(torch.float32) * 2.0 ** -24


def uniforms(seed: torch.Tensor, request: torch.Tensor, position: torch.Tensor,
             stream: int) -> torch.Tensor:
    """float32 uniforms in (0, 1) of ``stream`` for each broadcast key element."""
    return uniform_words(seed, request, position)[int(stream)]


def uniform_words(seed: torch.Tensor, request: torch.Tensor, position: torch.Tensor
                  ) -> torch.Tensor:
    """The four streams' float32 uniforms, [4, *broadcast shape]: ``bits_to_uniform`` of each
    word of ``philox_words``, the same values bit for bit. CPU tensors take one NumPy pass
    (a decode step's noise in a few torch calls rather than ~70 small ones)."""
    seed, request, position = (torch.as_tensor(t) for t in (seed, request, position))
    if position.device.type != "cpu" or seed.device.type != "cpu" \
            or request.device.type != "cpu":
        return torch.stack([bits_to_uniform(w) for w in philox_words(seed, request, position)])
    s, r, p = (np.asarray(t.to(torch.int64).numpy()).astype(np.uint64)    # two's complement
               for t in (seed, request, position))
    s, r, p = np.broadcast_arrays(s, r, p)
    m32, sh = np.uint64(_M32), np.uint64(32)
    words = philox_np((p & m32, (p >> sh) & m32, r & m32, np.zeros(p.shape, np.uint64)),
                      (s & m32, (s >> sh) & m32))
    k = np.stack(words) >> np.uint64(9)                                   # 23-bit k
    u = (k * np.uint64(2) + np.uint64(1)).astype(np.float32) * np.float32(2.0 ** -24)
    return torch.from_numpy(u)
