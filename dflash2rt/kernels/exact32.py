"""The sampled path's float32 formulation as Triton device functions, for devices without float64
(Intel Arc A-series): the kernels' ``FP64=False`` variants call these instead of computing in
tl.float64, so no float64 value exists in their compiled code.

They are ``dflash2rt.ops.exact32`` (read its docstring for the arithmetic and its error bounds)
written for a kernel: acceptance ``u·q(d) < p(d)`` decided exactly in int64 from the float32
bits; q(d) over duplicated candidates and the residual (p − q)+ as double-floats (TwoSum); the
inverse CDF over weights scaled by a power of two, the target u·total by Dekker's TwoProduct.
The prefix sums are error-free where the torch op's are double-float: each chunk of n = 2^LOG
weights (all ≤ 1 after scaling) is split into slices (Rump, Ogita and Oishi's extraction:
q = fl(σ + x) − σ with σ = 2^LOG, then σ·2^(LOG−24) on what is left, ...), each slice a multiple
of ulp(σ) with at most n·|x| ≤ σ in sum, so its ``tl.cumsum`` is exact in any order; the slices'
sums are then added as double-floats, as is the carry across chunks. What is lost is below
2^-52 per weight (``levels_for``: five slices at LOG 10, three for ≤ 32 candidates), inside the
bound ``ops.exact32`` states, so the drawn index differs from the
torch op's, as from float64's, only within it. Only elementwise operations and the built-in sums: a scan with a Python combine
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


# The functions the chunk loops call are written out, not composed of smaller ones: the
# interpreter pays a Python-level call for every call of a jitted function.
@triton.jit
def dd_add(ah, al, bh, bl):
    """Double-float a + b: TwoSum of the highs, the lows added to the error, TwoSum again."""
    s = ah + bh
    bb = s - ah
    e = ((ah - (s - bb)) + (bh - bb)) + (al + bl)
    h = s + e
    bb = h - s
    return h, (s - (h - bb)) + (e - bb)


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
def hit_mass(c, qk, d, K, BLOCK_K: tl.constexpr, LOG_K: tl.constexpr,
             LEVELS_K: tl.constexpr):
    """q(d) as a double-float: the K candidates' q where c == d (``ops.exact32.draft_mass32``;
    duplicated candidates summed by slices, ``dd_sum``, scaled so that the largest is in
    [1/2, 1): what the slices lose stays below 2^-52 of it however small the q are)."""
    ks = tl.arange(0, BLOCK_K)
    hit = (c == d) & (ks < K)
    hits = tl.where(hit, qk, 0.0)
    hi = tl.sum(hits, 0)                                # one hit (top-K ids are distinct): exact
    lo = tl.zeros([], tl.float32)
    if tl.sum(hit.to(tl.int32), 0) > 1:                 # duplicated candidates
        f1, f2 = scale_of(tl.max(hits, 0))
        hi, lo = dd_sum(hits * f1 * f2, 0, LOG_K, LEVELS_K)
        g = _inverse_pow2(f1) * _inverse_pow2(f2)
        hi, lo = hi * g, lo * g
    return hi, lo


@triton.jit
def residual(p, offs, c, qk, K, BLOCK_K: tl.constexpr, LOG_K: tl.constexpr,
             LEVELS_K: tl.constexpr):
    """max(p − Σ_k q_k [c_k = x], 0) at lanes ``offs`` as a double-float (hi, lo)
    (``ops.exact32.residual32``); 0 where not positive (NaN p included, as there). A lane hit
    by several (duplicated) candidates subtracts their sum (``dd_sum``, scaled as in
    ``hit_mass``)."""
    ks = tl.arange(0, BLOCK_K)
    hit = (offs[:, None] == c[None, :]) & (ks < K)[None, :]             # [BLOCK_V, BLOCK_K]
    qm = tl.where(hit, qk[None, :], 0.0)
    neg = -tl.sum(qm, 1)                                                # ≤ 1 hit a lane: exact
    ql = tl.zeros_like(p)
    if tl.max(tl.sum(hit.to(tl.int32), 1), 0) > 1:     # a duplicated candidate
        f1, f2 = scale_of(tl.max(qm, 1))                # per lane, as ``hit_mass``
        qh, ql = dd_sum(qm * f1[:, None] * f2[:, None], 1, LOG_K, LEVELS_K)
        g = _inverse_pow2(f1) * _inverse_pow2(f2)
        qh, ql = qh * g, ql * g
        neg = -qh
    hi = p + neg                                        # TwoSum(p, −q_hi), then − q_lo
    bb = hi - p
    lo = ((p - (hi - bb)) + (neg - bb)) - ql
    s = hi + lo
    lo = lo - (s - hi)
    hi = s
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
def _inverse_pow2(f):
    """1 / f for f = 2^k, k in [-126, 126] (``scale_of``'s factors), from its bits: exact, where
    a float32 division may be approximate on a GPU."""
    return (0x7F000000 - f.to(tl.int32, bitcast=True)).to(tl.float32, bitcast=True)


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
    dh = ch - gh                                        # TwoSum(ch, −gh)
    bb = dh - ch
    de = (ch - (dh - bb)) + (-gh - bb)
    return tl.where((dh + (de + (cl - gl))) <= 0.0, 1, 0)


@triton.jit
def dd_sum(x, AXIS: tl.constexpr, LOG: tl.constexpr, LEVELS: tl.constexpr):
    """Σ x along ``AXIS`` (2^LOG lanes, each |x| ≤ 1) as a double-float, from exact sums of
    ``LEVELS`` slices (module docstring): no loop over the lanes, whatever their order."""
    r = x
    sigma = _pow2(tl.full([], LOG, tl.int32))
    step = _pow2(tl.full([], LOG - 24, tl.int32))
    q = (sigma + r) - sigma
    r = r - q
    h = tl.sum(q, AXIS)
    lo = tl.zeros_like(h)
    for k in tl.static_range(1, LEVELS):
        sigma = sigma * step
        q = (sigma + r) - sigma
        r = r - q
        h, lo = dd_add(h, lo, tl.sum(q, AXIS), 0.0)
    return h, lo


def levels_for(log: int) -> int:
    """Slices a chunk of 2^log lanes needs so that what is lost stays below 2^-52 per weight
    (24 − log bits a slice)."""
    return next(n for n in range(1, 12) if log + n * (log - 24) <= -52)


@triton.jit
def chunk_cdf(wh, wl, LOG: tl.constexpr, LEVELS: tl.constexpr, LO: tl.constexpr):
    """The inclusive prefix sums of wh (+ wl where ``LO``) over a chunk of 2^LOG lanes, each
    |w| ≤ 1, as double-floats: ``LEVELS`` slices (module docstring), each slice's ``tl.cumsum``
    exact, the slices' sums added as double-floats."""
    h = tl.zeros_like(wh)
    lo = tl.zeros_like(wh)
    rh = wh
    rl = wl
    sigma = _pow2(tl.full([], LOG, tl.int32))
    step = _pow2(tl.full([], LOG - 24, tl.int32))       # σ of the next slice: σ·2^(LOG−24)
    for k in tl.static_range(LEVELS):
        if k > 0:
            sigma = sigma * step
        q = (sigma + rh) - sigma
        rh = rh - q
        if LO:                       # wl's slice is on the same grid: the sum stays exact
            ql = (sigma + rl) - sigma
            rl = rl - ql
            q = q + ql
        h, lo = dd_add(h, lo, tl.cumsum(q, 0), 0.0)
    return h, lo


@triton.jit
def inverse_cdf(w, u, K, BLOCK_K: tl.constexpr, LOG_K: tl.constexpr, LEVELS_K: tl.constexpr):
    """``ops.exact32.inverse_cdf32`` of one row of float32 weights w [BLOCK_K = 2^LOG_K] (lanes
    ≥ K are 0) with uniform u: the index of the first cdf > u·total, clamped to the last
    positive weight; -1 when w is not a law (NaN / inf total, no mass, a negative weight)."""
    ks = tl.arange(0, BLOCK_K)
    live = ks < K
    w = tl.where(live, w, 0.0)
    f1, f2 = scale_of(tl.max(w, 0))
    ch = w * f1 * f2
    sh, sl = chunk_cdf(ch, ch, LOG_K, LEVELS_K, False)
    end = ks == BLOCK_K - 1                             # the prefix sums' last: the total
    th, tlo = two_sum(tl.sum(tl.where(end, sh, 0.0), 0), tl.sum(tl.where(end, sl, 0.0), 0))
    gh, gl = target_of(u.to(tl.float32), th, tlo)
    idx = tl.sum(tl.where(live, count_le(sh, sl, gh, gl), 0), 0)
    last = tl.max(tl.where(live & (w > 0.0), ks, -1), 0)
    negative = tl.sum(tl.where(live & (w < 0.0), 1, 0), 0) > 0
    law = _finite(th) & (th > 0.0) & ~negative
    return tl.where(law, tl.minimum(idx, last), -1)


@triton.jit
def emit_residual(prow, c, qk, u, V, K, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr,
                  LOG_V: tl.constexpr, LEVELS_V: tl.constexpr, LOG_K: tl.constexpr,
                  LEVELS_K: tl.constexpr):
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
        wh, _ = residual(p, offs, c, qk, K, BLOCK_K, LOG_K, LEVELS_K)
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
        wh, wl = residual(p, offs, c, qk, K, BLOCK_K, LOG_K, LEVELS_K)
        sh, sl = chunk_cdf(tl.where(use_p, p, wh) * f1 * f2,
                           tl.where(use_p, 0.0, wl) * f1 * f2, LOG_V, LEVELS_V, True)
        end = lanes == BLOCK_V - 1                      # the prefix sums' last: the total
        th, tlo = dd_add(th, tlo, tl.sum(tl.where(end, sh, 0.0), 0),
                         tl.sum(tl.where(end, sl, 0.0), 0))
    gh, gl = target_of(u, th, tlo)
    carry_h = tl.zeros([], tl.float32)
    carry_l = tl.zeros([], tl.float32)
    count = 0
    for start in range(0, V, BLOCK_V):                # scan 3: the inverse CDF
        offs = start + lanes
        p = tl.load(prow + offs, mask=offs < V, other=0.0).to(tl.float32)
        wh, wl = residual(p, offs, c, qk, K, BLOCK_K, LOG_K, LEVELS_K)
        wh = tl.where(use_p, p, wh) * f1 * f2
        wl = tl.where(use_p, 0.0, wl) * f1 * f2
        sh, sl = chunk_cdf(wh, wl, LOG_V, LEVELS_V, True)
        ch, cl = dd_add(sh, sl, carry_h, carry_l)
        count += tl.sum(tl.where(offs < V, count_le(ch, cl, gh, gl), 0), 0)
        end = lanes == BLOCK_V - 1
        carry_h, carry_l = dd_add(carry_h, carry_l, tl.sum(tl.where(end, sh, 0.0), 0),
                                  tl.sum(tl.where(end, sl, 0.0), 0))
    last = tl.where(use_p, tl.max(last_p, 0), tl.max(last_r, 0))
    law = _finite(th) & (th > 0.0) & ~(use_p & (tl.max(negative, 0) > 0))
    return tl.where(law, tl.minimum(count, last), -1)
