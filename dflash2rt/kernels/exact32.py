"""The sampled path's float32 formulation as Triton device functions, for devices without float64
(Intel Arc A-series): the kernels' ``FP64=False`` variants call these instead of computing in
tl.float64, so no float64 value exists in their compiled code.

They are ``dflash2rt.ops.exact32`` (read its docstring for the arithmetic and its error bounds)
written for a kernel: acceptance ``u·q(d) < p(d)`` decided exactly in int64 from the float32
bits; q(d) over duplicated candidates and the residual (p − q)+ as double-floats (TwoSum); the
inverse CDF over weights scaled by a power of two, the target u·total by Dekker's TwoProduct.
The prefix sums are error-free where the torch op's are double-float: each chunk of n = 2^LOG
weights (all ≤ 1 after scaling) is split into ``LEVELS`` slices (Rump, Ogita and Oishi's
extraction: q = fl(σ + x) − σ with σ = 2^LOG, then σ·2^(LOG−24) on what is left, ...), each slice
a multiple of ulp(σ) with at most n·|x| ≤ σ in sum, so its ``tl.cumsum`` and ``tl.sum`` are exact
in any order; the slices' sums are then added as double-floats, as is the carry across chunks.
What is lost is below 2^(LEVELS·(LOG−24)+LOG) per weight (2^-60 at LOG 10), far inside the bound
``ops.exact32`` states, so the drawn index differs from the torch op's, as from float64's, only
within it. Only elementwise operations and the built-in sums: a scan with a Python combine
function would cost the interpreter a call per element.
Kernels calling these are launched unfused (``FP_FUSION``): TwoProduct's splitting and the
extraction assume every product and sum is rounded on its own.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def two_sum(a, b):
    """Knuth's TwoSum: fl(a + b) and the exact error."""
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


@triton.jit
def dd_add(ah, al, bh, bl):
    """Double-float a + b (also the combine function of the scans and reductions)."""
    s, e = two_sum(ah, bh)
    return two_sum(s, e + (al + bl))


@triton.jit
def _split(a):
    c = a * 4097.0                                 # Dekker: 2^12 + 1 splits 24 bits in 12 + 12
    hi = c - (c - a)
    return hi, a - hi


@triton.jit
def two_prod(a, b):
    """Dekker's TwoProduct: fl(a·b) and the exact error (no overflow / underflow)."""
    p = a * b
    ah, al = _split(a)
    bh, bl = _split(b)
    return p, ((ah * bh - p) + ah * bl + al * bh) + al * bl


@triton.jit
def mant_exp(x):
    """Finite float32 x = M·2^E → (M, E) int64, 2^23 ≤ |M| < 2^24 (or M = 0), from the bits;
    subnormals normalised as ``ops.exact32._mant_exp`` does."""
    bits = x.to(tl.float32).to(tl.int32, bitcast=True).to(tl.int64)
    field = (bits >> 23) & 0xFF
    frac = bits & 0x7FFFFF
    b = (frac.to(tl.float32).to(tl.int32, bitcast=True).to(tl.int64) >> 23) & 0xFF
    n = tl.where(frac > 0, 150 - b, 0)
    m = tl.where(field > 0, frac | 0x800000, frac << n)
    e = tl.where(field > 0, field - 150, -149 - n)
    return tl.where(bits < 0, -m, m), e


@triton.jit
def _finite(x):
    return tl.abs(x) < float("inf")                # False for NaN


@triton.jit
def accept(u, q_hi, q_lo, p):
    """u·(q_hi + q_lo) < p, exactly (``ops.exact32.accept``)."""
    mu, eu = mant_exp(u)
    mh, eh = mant_exp(q_hi)
    ml, el = mant_exp(q_lo)
    mp, ep = mant_exp(p)
    f = mu * mh + ((mu * ml) >> tl.minimum(tl.maximum(eh - el, 0), 62))
    s = ep - (eu + eh)
    less = (s >= 0) & ((f >> tl.minimum(tl.maximum(s, 0), 62)) < mp)
    less = tl.where((u == 0.0) | (q_hi == 0.0), p > 0.0, less)
    ok = _finite(u) & _finite(q_hi) & _finite(q_lo) & _finite(p) & (u >= 0.0) \
        & (q_hi >= 0.0) & (p >= 0.0)
    return tl.where(ok, less, u * q_hi < p)


@triton.jit
def hit_mass(c, qk, d, K, BLOCK_K: tl.constexpr):
    """q(d) as a double-float: the K candidates' q where c == d, summed in order with TwoSum
    (``ops.exact32.draft_mass32``)."""
    ks = tl.arange(0, BLOCK_K)
    hits = tl.where((c == d) & (ks < K), qk, 0.0)
    hi = tl.zeros([], tl.float32)
    lo = tl.zeros([], tl.float32)
    for k in range(0, K):
        hi, e = two_sum(hi, tl.sum(tl.where(ks == k, hits, 0.0), 0))
        lo += e
    return two_sum(hi, lo)


@triton.jit
def residual(p, offs, c, qk, K, BLOCK_K: tl.constexpr):
    """max(p − Σ_k q_k [c_k = x], 0) at lanes ``offs`` as a double-float (hi, lo), each hit
    subtracted in candidate order with TwoSum (``ops.exact32.residual32``); 0 where not
    positive (NaN p included, as there)."""
    ks = tl.arange(0, BLOCK_K)
    hi = p
    lo = tl.zeros_like(p)
    inside = (c >= tl.min(offs, 0)) & (c <= tl.max(offs, 0)) & (ks < K)
    if tl.sum(inside.to(tl.int32), 0) > 0:            # most chunks hold no candidate
        for k in range(0, K):
            ck = tl.sum(tl.where(ks == k, c, 0), 0)
            qv = tl.sum(tl.where(ks == k, qk, 0.0), 0)
            s, e = two_sum(hi, -qv)
            s, e = two_sum(s, e + lo)
            hit = offs == ck
            hi = tl.where(hit, s, hi)
            lo = tl.where(hit, e, lo)
    pos = hi > 0.0
    return tl.where(pos, hi, 0.0), tl.where(pos, lo, 0.0)


@triton.jit
def scale_of(top):
    """The power of two (as two float32 factors, each exact) that brings the largest weight
    ``top`` into [1/2, 1); 1 when ``top`` is not a finite positive."""
    ok = _finite(top) & (top > 0.0)
    e = mant_exp(tl.where(ok, top, 1.0))[1] + 24
    shift = tl.minimum(tl.maximum(tl.where(ok, -e, 0), -252), 252)
    half = tl.where(shift >= 0, shift // 2, -((1 - shift) // 2))       # floor(shift / 2)
    return _pow2(half), _pow2(shift - half)


@triton.jit
def _pow2(e):
    return ((e + 127).to(tl.int32) << 23).to(tl.float32, bitcast=True)


@triton.jit
def target_of(u, th, tlo):
    """u·(th + tlo) as a double-float (TwoProduct)."""
    ph, pe = two_prod(u, th)
    return two_sum(ph, pe + u * tlo)


@triton.jit
def count_le(ch, cl, gh, gl):
    """1 where the double-float cdf (ch, cl) ≤ the target (gh, gl), else 0."""
    dh, de = two_sum(ch, -gh)
    return tl.where((dh + (de + (cl - gl))) <= 0.0, 1, 0)


LEVELS = tl.constexpr(5)


@triton.jit
def _slices(x, LOG: tl.constexpr):
    """x (|x| ≤ 1, a chunk of 2^LOG lanes) as ``LEVELS`` slices whose sums over the chunk are
    exact in float32 (module docstring), and the remainder dropped (below 2^(5·(LOG−24)+LOG))."""
    step = tl.full([], LOG - 24, tl.int32)
    e = tl.full([], LOG, tl.int32)
    s1 = _pow2(e)
    q1 = (s1 + x) - s1
    r = x - q1
    s2 = _pow2(e + step)
    q2 = (s2 + r) - s2
    r = r - q2
    s3 = _pow2(e + 2 * step)
    q3 = (s3 + r) - s3
    r = r - q3
    s4 = _pow2(e + 3 * step)
    q4 = (s4 + r) - s4
    r = r - q4
    s5 = _pow2(e + 4 * step)
    q5 = (s5 + r) - s5
    return q1, q2, q3, q4, q5


@triton.jit
def _dd_of(a, b, c, d, e):
    """a + b + c + d + e as a double-float (each term exact: the slices' sums)."""
    h, lo = two_sum(a, b)
    h, lo = dd_add(h, lo, c, 0.0)
    h, lo = dd_add(h, lo, d, 0.0)
    return dd_add(h, lo, e, 0.0)


@triton.jit
def chunk_sum(wh, wl, LOG: tl.constexpr):
    """Σ (wh + wl) over a chunk as a double-float."""
    a1, a2, a3, a4, a5 = _slices(wh, LOG)
    b1, b2, b3, b4, b5 = _slices(wl, LOG)
    return _dd_of(tl.sum(a1, 0) + tl.sum(b1, 0), tl.sum(a2, 0) + tl.sum(b2, 0),
                  tl.sum(a3, 0) + tl.sum(b3, 0), tl.sum(a4, 0) + tl.sum(b4, 0),
                  tl.sum(a5, 0) + tl.sum(b5, 0))


@triton.jit
def chunk_cdf(wh, wl, LOG: tl.constexpr):
    """The inclusive prefix sums of (wh + wl) over a chunk as double-floats."""
    a1, a2, a3, a4, a5 = _slices(wh, LOG)
    b1, b2, b3, b4, b5 = _slices(wl, LOG)
    return _dd_of(tl.cumsum(a1, 0) + tl.cumsum(b1, 0), tl.cumsum(a2, 0) + tl.cumsum(b2, 0),
                  tl.cumsum(a3, 0) + tl.cumsum(b3, 0), tl.cumsum(a4, 0) + tl.cumsum(b4, 0),
                  tl.cumsum(a5, 0) + tl.cumsum(b5, 0))


@triton.jit
def inverse_cdf(w, u, K, BLOCK_K: tl.constexpr, LOG_K: tl.constexpr):
    """``ops.exact32.inverse_cdf32`` of one row of float32 weights w [BLOCK_K = 2^LOG_K] (lanes
    ≥ K are 0) with uniform u: the index of the first cdf > u·total, clamped to the last
    positive weight; -1 when w is not a law (NaN / inf total, no mass, a negative weight)."""
    ks = tl.arange(0, BLOCK_K)
    live = ks < K
    w = tl.where(live, w, 0.0)
    f1, f2 = scale_of(tl.max(w, 0))
    ch = w * f1 * f2
    zero = tl.zeros_like(ch)
    sh, sl = chunk_cdf(ch, zero, LOG_K)
    th, tlo = chunk_sum(ch, zero, LOG_K)
    gh, gl = target_of(u.to(tl.float32), th, tlo)
    idx = tl.sum(tl.where(live, count_le(sh, sl, gh, gl), 0), 0)
    last = tl.max(tl.where(live & (w > 0.0), ks, -1), 0)
    negative = tl.sum(tl.where(live & (w < 0.0), 1, 0), 0) > 0
    law = _finite(th) & (th > 0.0) & ~negative
    return tl.where(law, tl.minimum(idx, last), -1)


@triton.jit
def emit_residual(prow, c, qk, u, V, K, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr,
                  LOG_V: tl.constexpr):
    """The token a rejected (or bonus) slot emits from its target row ``prow`` (float32 p over V)
    and its candidates (c, qk; none hit for the bonus row): the inverse CDF of the residual
    (p − q)+, or of p where the residual is empty, with uniform u; -1 where that is not a law.
    Three scans of the row: the largest weights and last positives; the scaled total; the
    chunked cdf (``ops.verify`` float32 formulation)."""
    lanes = tl.arange(0, BLOCK_V)
    top_r = tl.zeros([BLOCK_V], tl.float32)
    top_p = tl.zeros([BLOCK_V], tl.float32)
    last_r = tl.full([BLOCK_V], -1, tl.int32)
    last_p = tl.full([BLOCK_V], -1, tl.int32)
    negative = tl.zeros([BLOCK_V], tl.int32)
    for start in range(0, V, BLOCK_V):                # scan 1: maxima, last positives
        offs = start + lanes
        p = tl.load(prow + offs, mask=offs < V, other=0.0).to(tl.float32)
        wh, _ = residual(p, offs, c, qk, K, BLOCK_K)
        top_r = tl.maximum(top_r, wh)
        top_p = tl.maximum(top_p, p)
        last_r = tl.maximum(last_r, tl.where(wh > 0.0, offs, -1))
        last_p = tl.maximum(last_p, tl.where(p > 0.0, offs, -1))
        negative |= (p < 0.0).to(tl.int32)
    use_p = tl.max(last_r, 0) < 0                     # the residual is empty: draw from p
    f1, f2 = scale_of(tl.where(use_p, tl.max(top_p, 0), tl.max(top_r, 0)))
    th = tl.zeros([], tl.float32)
    tlo = tl.zeros([], tl.float32)
    for start in range(0, V, BLOCK_V):                # scan 2: the scaled total
        offs = start + lanes
        p = tl.load(prow + offs, mask=offs < V, other=0.0).to(tl.float32)
        wh, wl = residual(p, offs, c, qk, K, BLOCK_K)
        bh, bl = chunk_sum(tl.where(use_p, p, wh) * f1 * f2, tl.where(use_p, 0.0, wl) * f1 * f2,
                           LOG_V)
        th, tlo = dd_add(th, tlo, bh, bl)
    gh, gl = target_of(u, th, tlo)
    carry_h = tl.zeros([], tl.float32)
    carry_l = tl.zeros([], tl.float32)
    count = 0
    for start in range(0, V, BLOCK_V):                # scan 3: the inverse CDF
        offs = start + lanes
        p = tl.load(prow + offs, mask=offs < V, other=0.0).to(tl.float32)
        wh, wl = residual(p, offs, c, qk, K, BLOCK_K)
        wh = tl.where(use_p, p, wh) * f1 * f2
        wl = tl.where(use_p, 0.0, wl) * f1 * f2
        sh, sl = chunk_cdf(wh, wl, LOG_V)
        ch, cl = dd_add(sh, sl, carry_h, carry_l)
        count += tl.sum(tl.where(offs < V, count_le(ch, cl, gh, gl), 0), 0)
        bh, bl = chunk_sum(wh, wl, LOG_V)
        carry_h, carry_l = dd_add(carry_h, carry_l, bh, bl)
    last = tl.where(use_p, tl.max(last_p, 0), tl.max(last_r, 0))
    law = _finite(th) & (th > 0.0) & ~(use_p & (tl.max(negative, 0) > 0))
    return tl.where(law, tl.minimum(count, last), -1)
