"""Triton pieces of the watermark's keyed draws, bit for bit the torch ops' (``watermark.values``,
``watermark.sampler``): Philox-4x32-10 in uint32 arithmetic (``tl.umulhi`` for the high words),
the context hash, the keyed uniforms ``(2k + 1)·2⁻²⁴``, ``neg_log`` (frexp by the float64's bits,
then the same 18-term series in the same order) and the Gumbel-max argmin E / p over a sparse
candidate set. The select and verify kernels call them; the launchers below run them alone (tests,
conformance).

Float64 +, -, *, / round the same everywhere, but only unfused: kernels that call ``neg_log`` are
launched with ``FP_FUSION`` (``enable_fp_fusion=False``), so a compiler cannot contract
``acc * z + c`` into an FMA (one rounding instead of the reference's two; the PTX for sm_90 has
18 ``fma.rn.f64`` with fusion and none without). Float constants are built as float64 (a Python
float in a kernel may be narrowed to float32).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..watermark.keys import SubKey, SubKeyWords
from ..watermark.values import CONTEXT_KEY
from .launch import launch

FP_FUSION = {"enable_fp_fusion": False}      # launch option of every kernel calling neg_log
_CK0, _CK1 = tl.constexpr(CONTEXT_KEY[0]), tl.constexpr(CONTEXT_KEY[1])
_LN2_BITS = tl.constexpr(0x3FE62E42FEFA39EF)   # float64 0.6931471805599453 (values.LN2)
_EXP_CLEAR = tl.constexpr(~(0x7FF << 52))      # float64 bits without the exponent field
_HALF_EXP = tl.constexpr(1022 << 52)           # exponent field of [1/2, 1)


def subkey_words(sub: SubKey | SubKeyWords, device: torch.device | str) -> torch.Tensor:
    """[3] int64 (k0, k1, word): a subkey as a kernel input (a tensor, so graphs can hold it;
    a ``SubKeyWords`` already is one: a captured step's input, used as it is)."""
    if isinstance(sub, SubKeyWords):
        return sub.words.to(device=device, dtype=torch.int64).contiguous()
    return torch.tensor([sub.k0, sub.k1, sub.word], dtype=torch.int64, device=device)


@triton.jit
def philox(c0, c1, c2, c3, k0, k1):
    """Philox-4x32-10 of broadcast uint32 counters and key → four uint32 words
    (``ops.rng.philox_np``)."""
    for _ in tl.static_range(10):
        hi0 = tl.umulhi(c0, 0xD2511F53)
        lo0 = c0 * 0xD2511F53
        hi1 = tl.umulhi(c2, 0xCD9E8D57)
        lo1 = c2 * 0xCD9E8D57
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0 = k0 + 0x9E3779B9
        k1 = k1 + 0xBB67AE85
    return c0, c1, c2, c3


@triton.jit
def _u32(x):
    """The low 32 bits of an integer tensor as uint32."""
    return (x.to(tl.int64) & 0xFFFFFFFF).to(tl.uint32)


@triton.jit
def _word(win, hs, i: tl.constexpr, H: tl.constexpr):
    """Column i of windows win [N, BLOCK_H] int64 as the hash's uint32 word: id + 1, 0 for -1
    (before the sequence start) and for the padding columns i ≥ H."""
    t = tl.sum(tl.where(hs[None, :] == i, win, 0), 1)
    if i >= H:
        t = t * 0 - 1
    return _u32(tl.where(t >= 0, t + 1, 0))


@triton.jit
def context_hash(win, H: tl.constexpr, BLOCK_H: tl.constexpr):
    """Windows win [N, BLOCK_H] int64 (lanes ≥ H ignored, -1 before the sequence start) →
    int64 [N], ``values.context_hash`` of the first H lanes."""
    hs = tl.arange(0, BLOCK_H)
    kh = _u32(tl.full([1], _CK1 + H, tl.int64))
    s0, s1, _, _ = philox(_word(win, hs, 0, H), _word(win, hs, 1, H), _word(win, hs, 2, H),
                          _word(win, hs, 3, H), _u32(tl.full([1], _CK0, tl.int64)), kh)
    for i in tl.static_range(4, H, 2):       # further words two per call, chained
        s0, s1, _, _ = philox(s0, s1, _word(win, hs, i, H), _word(win, hs, i + 1, H),
                              _u32(tl.full([1], _CK0 + i, tl.int64)), kh)
    return ((s1.to(tl.uint64) << 32) | s0.to(tl.uint64)).to(tl.int64, bitcast=True)


@triton.jit
def keyed_uniform(ctx, token, sub_ptr):
    """float32 (2k + 1)·2⁻²⁴ of broadcast context hashes (int64) and token ids under the subkey
    words at sub_ptr (k0, k1, word): ``values.keyed_uniforms``."""
    c = ctx.to(tl.uint64, bitcast=True)
    lo = (c & 0xFFFFFFFF).to(tl.uint32)
    hi = (c >> 32).to(tl.uint32)
    word = _u32(tl.load(sub_ptr + 2))
    b, _, _, _ = philox(lo, hi, _u32(token), word + tl.zeros_like(lo),
                        _u32(tl.load(sub_ptr)), _u32(tl.load(sub_ptr + 1)))
    return ((b >> 9) * 2 + 1).to(tl.float32) * 5.9604644775390625e-08     # 2⁻²⁴, exact


@triton.jit
def neg_log(u):
    """-log u in float64 for u ∈ (0, 1): ``values.neg_log`` bit for bit (m, e = frexp(u) read
    from the float64's bits, -log u = 2·atanh((1 - m)/(1 + m)) - e·ln 2, Horner)."""
    bits = u.to(tl.float64).to(tl.int64, bitcast=True)
    e = ((bits >> 52) & 0x7FF) - 1022
    m = ((bits & _EXP_CLEAR) | _HALF_EXP).to(tl.float64, bitcast=True)      # [1/2, 1)
    one = tl.full([1], 1.0, tl.float64)
    s = (one - m) / (one + m)
    z = s * s
    acc = one / 35.0                                        # SERIES[17] = 1/35
    for j in tl.static_range(16, -1, -1):
        acc = acc * z + one / (2 * j + 1)                   # correctly rounded, as in SERIES
    ln2 = tl.full([1], _LN2_BITS, tl.int64).to(tl.float64, bitcast=True)
    return (2.0 * s) * acc - e.to(tl.float64) * ln2


@triton.jit
def race_key(p, e):
    """The Gumbel-max keys E / p (float64), +inf where p is not positive."""
    return tl.where(p > 0.0, e / tl.where(p > 0.0, p, 1.0), float("inf"))


@triton.jit
def exp_min_candidates(p, ids, e, kmask):
    """One row of K candidates (lanes kmask): float64 law p, int64 ids, float64 E → the
    winning position (lowest id on ties, then lowest position), -1 when p is not a law
    (``sampler.exp_min_candidates``)."""
    ks = tl.arange(0, p.shape[0])
    key = tl.where(kmask, race_key(p, e), float("inf"))
    tied = kmask & (key == tl.min(key, 0))
    low = tl.min(tl.where(tied, ids, 9223372036854775807), 0)
    pos = tl.min(tl.where(tied & (ids == low), ks, p.shape[0]), 0)
    broken = tl.sum(tl.where(kmask & ((p != p) | (p < 0.0) | (p == float("inf"))), 1, 0), 0)
    mass = tl.sum(tl.where(kmask & (p > 0.0), 1, 0), 0)
    return tl.where((broken == 0) & (mass > 0), pos, -1)


@triton.jit
def _values_kernel(c_ptr, k_ptr, win_ptr, ctx_ptr, tok_ptr, sub_ptr, x_ptr, words_ptr,
                   hash_ptr, u_ptr, e_ptr, N, H: tl.constexpr, BLOCK: tl.constexpr,
                   BLOCK_H: tl.constexpr):
    n = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    live = n < N
    w0, w1, w2, w3 = philox(_u32(tl.load(c_ptr + n * 4, mask=live, other=0)),
                            _u32(tl.load(c_ptr + n * 4 + 1, mask=live, other=0)),
                            _u32(tl.load(c_ptr + n * 4 + 2, mask=live, other=0)),
                            _u32(tl.load(c_ptr + n * 4 + 3, mask=live, other=0)),
                            _u32(tl.load(k_ptr + n * 2, mask=live, other=0)),
                            _u32(tl.load(k_ptr + n * 2 + 1, mask=live, other=0)))
    tl.store(words_ptr + n * 4, w0.to(tl.int64), mask=live)
    tl.store(words_ptr + n * 4 + 1, w1.to(tl.int64), mask=live)
    tl.store(words_ptr + n * 4 + 2, w2.to(tl.int64), mask=live)
    tl.store(words_ptr + n * 4 + 3, w3.to(tl.int64), mask=live)
    hs = tl.arange(0, BLOCK_H)
    win = tl.load(win_ptr + n[:, None] * H + hs[None, :], mask=live[:, None] & (hs < H)[None, :],
                  other=-1)
    tl.store(hash_ptr + n, context_hash(win, H, BLOCK_H), mask=live)
    u = keyed_uniform(tl.load(ctx_ptr + n, mask=live, other=0),
                      tl.load(tok_ptr + n, mask=live, other=0), sub_ptr)
    tl.store(u_ptr + n, u, mask=live)
    tl.store(e_ptr + n, neg_log(tl.load(x_ptr + n, mask=live, other=0.5)), mask=live)


def kernel_values(*, counter: torch.Tensor | None = None, key: torch.Tensor | None = None,
                  windows: torch.Tensor | None = None, ctx: torch.Tensor | None = None,
                  token: torch.Tensor | None = None, sub: SubKey | None = None,
                  u: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """The pieces alone, N rows each (inputs left out are zeros, u 1/2): counter [N, 4] and key
    [N, 2] uint32 words (int64) → "words" [N, 4] (Philox); windows [N, H] → "hash" [N];
    ctx [N], token [N] → "u" [N] float32 (the keyed uniforms under ``sub``; 96 zero bits when
    None); u [N] float32 in (0, 1) → "e" [N] float64 (``neg_log``)."""
    given = next(x for x in (counter, windows, ctx, token, u) if x is not None)
    n, dev = given.shape[0], given.device
    zeros = torch.zeros(n, dtype=torch.int64, device=dev)
    windows = zeros.view(n, 1) if windows is None else windows
    h = windows.shape[1]
    args = [zeros.view(n, 1).expand(n, w) if x is None else x.to(torch.int64)
            for x, w in ((counter, 4), (key, 2), (windows, h), (ctx, 1), (token, 1))]
    args = [x.reshape(n, -1).contiguous() for x in args]
    subkey = subkey_words(sub, dev) if sub is not None else zeros.new_zeros(3)
    u = torch.full((n,), 0.5, device=dev) if u is None else u.to(torch.float32).contiguous()
    out = {"words": torch.empty(n, 4, dtype=torch.int64, device=dev),
           "hash": torch.empty(n, dtype=torch.int64, device=dev),
           "u": torch.empty(n, dtype=torch.float32, device=dev),
           "e": torch.empty(n, dtype=torch.float64, device=dev)}
    block = min(1024, triton.next_power_of_2(max(n, 1)))
    launch(_values_kernel, (triton.cdiv(n, block),), *args, subkey, u, out["words"],
           out["hash"], out["u"], out["e"], n, H=h, BLOCK=block,
           BLOCK_H=triton.next_power_of_2(h), **FP_FUSION)
    return out
