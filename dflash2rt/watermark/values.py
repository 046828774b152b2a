"""Keyed pseudorandom values r(key, context, token) ∈ (0, 1), bit-exact on every device.

context = a 64-bit hash of the ``h`` tokens before a position (oldest first; a slot before the
start of the sequence is -1 and hashes apart from every token id): Philox-4x32-10 under a public
key that carries h, counter = the first 4 words (one call for the usual h = 4), further words two
per call, chained. value = word 0 of Philox-4x32-10 keyed by the subkey's 64-bit Philox key at
counter (context lo, context hi, token, subkey word), mapped to ``(2k + 1)·2⁻²⁴`` like every
dflash2rt uniform (``ops.rng.bits_to_uniform``: exact float32, never 0 or 1). Philox runs as in
``ops.rng``: exact uint64 NumPy on CPU tensors, int64 tensors with 16-bit limbs elsewhere (no
wrapping arithmetic anywhere), so cpu, the Triton interpreter and cuda give the same bits.

``neg_log`` turns a value into the exponential variable E = -log r of the Gumbel-max draw with
float64 +, -, *, / only, in a fixed order (IEEE-754 rounds those the same on every device; a
library ``log`` does not), so the float64 NumPy reference reproduces it bit for bit.
"""

from __future__ import annotations

import numbers

import numpy as np
import torch

from ..ops.rng import bits_to_uniform, philox4x32, philox_np
from .keys import SubKey, SubKeyWords

_M32 = 0xFFFFFFFF
CONTEXT_KEY = (0x6A09E667, 0x3C6EF372)        # public: the context hash is unkeyed
COIN_TOKEN = _M32                             # the token word of the acceptance coin (no vocab id)
MAX_TOKEN_ID = _M32 - 1                        # token ids are hashed as uint32; (id + 1) in windows
LN2 = 0.6931471805599453
SERIES = tuple(1.0 / (2 * j + 1) for j in range(18))   # 2·atanh(s) = 2s·Σ s^2j/(2j+1), s ≤ 1/3


Word = "int | torch.Tensor"      # a uint32 key word: a Python int, or a 0-d int64 tensor


def _philox(counter: tuple[torch.Tensor, ...], key: tuple[Word, Word]) -> tuple[torch.Tensor, ...]:
    """Philox-4x32-10 of broadcast int64 uint32 words; exact NumPy on CPU, limbs elsewhere.
    Key words may be tensors (``keys.SubKeyWords``: graph inputs), read on the host only on
    the CPU (which captures no graphs)."""
    counter = torch.broadcast_tensors(*counter)
    device = counter[0].device
    if use_numpy(device):
        words = philox_np(tuple(c.contiguous().numpy() for c in counter),
                          (np.full(counter[0].shape, int(key[0]), np.uint64),
                           np.full(counter[0].shape, int(key[1]), np.uint64)))
        return tuple(torch.from_numpy(np.asarray(w, dtype=np.int64)) for w in words)
    return philox4x32(counter, (_fill(counter[0], key[0]), _fill(counter[0], key[1])))


def _fill(like: torch.Tensor, word: Word) -> torch.Tensor:
    """``like``'s shape filled with ``word`` (an int, or a 0-d tensor: broadcast, no sync)."""
    if isinstance(word, torch.Tensor):
        return word.to(device=like.device, dtype=torch.int64).expand_as(like)
    return torch.full_like(like, word)


def use_numpy(device: torch.device) -> bool:
    """The uint64 NumPy fast path (CPU tensors); tests switch it off to run the limb path."""
    return device.type == "cpu"


def join64(lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    """Two uint32 words → one int64 holding the 64 bits (two's complement), no overflow."""
    hi_signed = hi - ((hi >> 31) << 32)
    return hi_signed * 4294967296 + lo


def split64(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x & _M32, (x >> 32) & _M32


def context_hash(window: torch.Tensor) -> torch.Tensor:
    """[..., h] int64 token ids (oldest first, -1 = before the sequence start) → int64 [...].

    One Philox call for h ≤ 4 (the words, zero-padded, are the counter; the key carries h),
    then one per further pair of words, chained through the first two output words."""
    window = window.to(torch.int64)
    h = window.shape[-1]
    words = torch.where(window >= 0, (window + 1) & _M32, torch.zeros_like(window))
    pad = max(4, h + h % 2) - h                  # to 4 words, then to an even count
    if pad:
        words = torch.cat([words, words.new_zeros(*words.shape[:-1], pad)], dim=-1)
    s0, s1, _, _ = _philox(tuple(words[..., i] for i in range(4)), context_key(h, 0))
    for i in range(4, words.shape[-1], 2):
        s0, s1, _, _ = _philox((s0, s1, words[..., i], words[..., i + 1]), context_key(h, i))
    return join64(s0, s1)


def context_key(width: int, index: int) -> tuple[int, int]:
    """The public Philox key of the context hash's call that starts at word ``index``."""
    return (CONTEXT_KEY[0] + index) & _M32, (CONTEXT_KEY[1] + width) & _M32


def windows(tokens: torch.Tensor, width: int) -> torch.Tensor:
    """[N] int64 → [N, width]: row i = the ``width`` tokens before position i (-1 before 0)."""
    pad = torch.full((width,), -1, dtype=torch.int64, device=tokens.device)
    padded = torch.cat([pad, tokens.to(torch.int64)])
    return padded.unfold(0, width, 1)[:tokens.shape[0]]


def keyed_bits(sub: SubKey | SubKeyWords, ctx: torch.Tensor, token: torch.Tensor | int
               ) -> torch.Tensor:
    """32 keyed bits (int64 in [0, 2³²)) per broadcast (context hash, token id). An int token
    (the coin's) is filled on the device, not copied from the host: a captured step may not
    copy host memory."""
    ctx = torch.as_tensor(ctx, dtype=torch.int64)
    lo, hi = split64(ctx)
    token = _fill(lo, int(token)) if isinstance(token, numbers.Integral) else \
        torch.as_tensor(token, dtype=torch.int64, device=ctx.device)
    return _philox((lo, hi, token & _M32, _fill(lo, sub.word)), (sub.k0, sub.k1))[0]


def keyed_uniforms(sub: SubKey | SubKeyWords, ctx: torch.Tensor, token: torch.Tensor | int
                   ) -> torch.Tensor:
    """float32 values (2k + 1)·2⁻²⁴ ∈ (0, 1) per broadcast (context hash, token id)."""
    return bits_to_uniform(keyed_bits(sub, ctx, token))


def neg_log(u: torch.Tensor) -> torch.Tensor:
    """-log(u) in float64 for u ∈ (0, 1), the same bits on every IEEE-754 float64 device.

    u = m·2^e (frexp, exact) with m ∈ [1/2, 1): -log u = 2·atanh((1 - m)/(1 + m)) - e·ln 2,
    the series in Horner form (18 terms: truncation < 1e-17 for s ≤ 1/3). Both terms are ≥ 0,
    so there is no cancellation: relative error a few ulp, also next to u = 1."""
    m, e = torch.frexp(u.to(torch.float64))
    s = (1.0 - m) / (1.0 + m)
    z = s * s
    acc = torch.full_like(z, SERIES[-1])
    for c in reversed(SERIES[:-1]):
        acc = acc * z + c
    return (2.0 * s) * acc - e.to(torch.float64) * LN2
