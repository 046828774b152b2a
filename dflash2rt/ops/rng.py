"""Counter-based random numbers: Philox-4x32-10 keyed by (seed, request, position, stream).

Every random number dflash2rt uses is a pure function of its key, so the same seed gives the same
uniforms on every device, in every batch composition and order. The arithmetic uses int64 tensors
with 16-bit limbs for the 32x32-bit products, which is exact on every torch device.

Uniforms are ``(2k + 1) * 2**-24`` for a 23-bit ``k``: exactly representable in float32, never 0
or 1, and ``u * q`` with float32 ``q`` is exact in float64 (24 + 24 < 53 bits).
"""

from __future__ import annotations

import enum

import torch

_M32 = 0xFFFFFFFF
_MUL0, _MUL1 = 0xD2511F53, 0xCD9E8D57   # Philox-4x32 multipliers (Salmon et al., 2011)
_W0, _W1 = 0x9E3779B9, 0xBB67AE85       # Weyl key increments
ROUNDS = 10


class Stream(enum.IntEnum):
    """Independent streams; draft randomness never shares a stream with verification."""

    WALK = 1        # selector walk, one uniform per draft slot
    ACCEPT = 2      # acceptance coin u in u*q < p
    RESIDUAL = 3    # residual sample after the first rejection
    BONUS = 4       # bonus sample after a fully accepted block


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


def random_bits(seed: torch.Tensor, request: torch.Tensor, position: torch.Tensor,
                stream: int, index: torch.Tensor | int = 0) -> torch.Tensor:
    """32 random bits (int64 in [0, 2**32)) for each broadcast (seed, request, position, index).

    Key = seed (64 bit); counter = (position lo, position hi, request, stream << 24 | index).
    ``index`` (< 2**24) numbers several draws that share one (request, position, stream).
    """
    seed, request, position = (torch.as_tensor(t) for t in (seed, request, position))
    device = position.device
    seed, request = seed.to(device), request.to(device)
    index = torch.as_tensor(index, device=device, dtype=torch.int64)
    seed, request, position, index = torch.broadcast_tensors(seed, request, position, index)
    k0, k1 = _split(seed)
    p0, p1 = _split(position)
    c2 = request.to(torch.int64) & _M32
    c3 = ((int(stream) & 0xFF) << 24) | (index & 0xFFFFFF)
    return philox4x32((p0, p1, c2, c3), (k0, k1))[0]


def bits_to_uniform(bits: torch.Tensor) -> torch.Tensor:
    """uint32 bits → float32 uniforms (2k + 1)·2⁻²⁴, k = bits >> 9: never 0, never 1, exact."""
    k = bits >> 9
    return ((2 * k + 1).to(torch.float64) * 2.0 ** -24).to(torch.float32)


def uniforms(seed: torch.Tensor, request: torch.Tensor, position: torch.Tensor,
             stream: int, index: torch.Tensor | int = 0) -> torch.Tensor:
    """float32 uniforms in (0, 1) for each broadcast key element; see ``random_bits``."""
    return bits_to_uniform(random_bits(seed, request, position, stream, index))
