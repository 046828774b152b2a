"""A step's Philox-4x32-10 uniforms in one launch: the kernel form of ``ops.rng.uniform_words``.

Program r draws the four streams of request r at positions ``first[r] + lead + e`` for e in
[0, n): key = seed[r] (64 bits, two's complement), counter = (position lo, position hi,
request[r] lo, 0), ten rounds in exact uint64 arithmetic (32×32-bit products), uniforms
``(2k + 1)·2⁻²⁴`` with k = word >> 9: the same bits as ``ops.rng`` on every device, integer and
float32 arithmetic only (no float64 anywhere). ``R``, ``n`` and ``lead`` are not specialized:
one binary serves every batch and block size.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..errors import InvalidInputError
from ..ops.batch import BlockNoise
from ..ops.rng import ROUNDS
from .launch import launch

# Positions per tile: a block of up to 32 slots plus its bonus position takes two tiles.
NOISE_TILE = 32


@triton.jit(do_not_specialize=["R", "n", "lead"])
def _noise_kernel(seed_ptr, req_ptr, first_ptr, out_ptr, R, n, lead,
                  ROUNDS: tl.constexpr, BLOCK: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    m32 = 0xFFFFFFFF
    seed = tl.load(seed_ptr + r)                                 # int64
    k0_ = (seed & m32).to(tl.uint64)
    k1_ = ((seed >> 32) & m32).to(tl.uint64)
    c2_ = (tl.load(req_ptr + r) & m32).to(tl.uint64)
    first = tl.load(first_ptr + r) + lead                        # int64
    for e0 in range(0, n, BLOCK):
        e = e0 + tl.arange(0, BLOCK)                             # [BLOCK] positions' offsets
        pos = first + e
        c0 = (pos & m32).to(tl.uint64)
        c1 = ((pos >> 32) & m32).to(tl.uint64)
        c2 = tl.zeros([BLOCK], tl.uint64) + c2_
        c3 = tl.zeros([BLOCK], tl.uint64)
        k0 = tl.zeros([BLOCK], tl.uint64) + k0_
        k1 = tl.zeros([BLOCK], tl.uint64) + k1_
        for _ in tl.static_range(ROUNDS):
            p0 = c0 * 0xD2511F53                                 # < 2**64: exact in uint64
            p1 = c2 * 0xCD9E8D57
            c0, c1, c2, c3 = (p1 >> 32) ^ c1 ^ k0, p1 & m32, (p0 >> 32) ^ c3 ^ k1, p0 & m32
            k0 = (k0 + 0x9E3779B9) & m32
            k1 = (k1 + 0xBB67AE85) & m32
        live = e < n
        at = out_ptr + r * n + e                                 # out [4, R, n]
        plane = R * n
        tl.store(at, ((c0 >> 9) * 2 + 1).to(tl.float32) * 5.9604644775390625e-08, mask=live)
        tl.store(at + plane, ((c1 >> 9) * 2 + 1).to(tl.float32) * 5.9604644775390625e-08,
                 mask=live)
        tl.store(at + 2 * plane, ((c2 >> 9) * 2 + 1).to(tl.float32) * 5.9604644775390625e-08,
                 mask=live)
        tl.store(at + 3 * plane, ((c3 >> 9) * 2 + 1).to(tl.float32) * 5.9604644775390625e-08,
                 mask=live)


def uniform_words(seed: torch.Tensor, request: torch.Tensor, first: torch.Tensor, n: int,
                  lead: int = 0) -> torch.Tensor:
    """seed, request, first: [R] integer tensors → float32 [4, R, n]: the four streams'
    uniforms at positions first[r] + lead + e (``ops.rng.uniform_words`` of the same keys)."""
    if seed.dim() != 1 or request.shape != seed.shape or first.shape != seed.shape:
        raise InvalidInputError(
            f"noise kernel: seed, request and first must be [R], got {tuple(seed.shape)}, "
            f"{tuple(request.shape)}, {tuple(first.shape)}")
    r = seed.shape[0]
    out = torch.empty(4, r, n, dtype=torch.float32, device=first.device)
    if r == 0 or n == 0:
        return out
    i64 = [t.to(torch.int64).contiguous() for t in (seed, request, first)]
    launch(_noise_kernel, (r,), *i64, out, r, n, lead, ROUNDS=ROUNDS, BLOCK=NOISE_TILE)
    return out


def block_noise(seed: torch.Tensor, request: torch.Tensor, anchor_pos: torch.Tensor,
                gamma: int) -> BlockNoise:
    """Kernel version of ``BlockNoise.draw``: one launch for the step's four streams."""
    u = uniform_words(seed, request, anchor_pos, gamma + 1, lead=1)      # [4, R, γ+1]
    return BlockNoise(walk=u[0, :, :gamma], accept=u[1, :, :gamma],
                      residual=u[2, :, :gamma], bonus=u[3, :, gamma])
