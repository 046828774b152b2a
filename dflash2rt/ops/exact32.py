"""The sampled path in float32 and int64 only, for devices without float64 (Intel Arc A-series).

Used by the ops when a backend says ``has_fp64 = False`` (passed explicitly by its ``select`` /
``verify``, or set for the whole decode by ``Backend.run_context()``, which also covers the ops
the engine calls directly: ``sample_next``). No float64 tensor is created on this path.

* Acceptance ``u·q(d) < p(d)`` (``accept``): decided EXACTLY in int64. A finite float32 is M·2^E
  with an integer M, 2^23 ≤ |M| < 2^24 (read from its bits; subnormals included), so u·q is an
  integer below 2^48 times a power of two and the comparison needs only shifts. For one float32
  q(d) this is the float64 decision bit for bit (float64 is exact there: 24 + 24 < 53 bits).
* q(d) over duplicated candidates (``draft_mass32``): never produced by the selector (top-K ids
  are distinct), possible at the op boundary. Summed as a double-float hi + lo with TwoSum:
  exact for up to two hits of a token, else within 2^-47 relative; the decision is then exact
  for that hi + lo. (float64 rounds such sums as well.)
* Residual weights (p − q)+ (``residual32``): exact double-floats (TwoSum is error-free,
  subnormals included) for one hit per token; within 2^-47 relative with duplicates.
* Inverse CDF (``inverse_cdf32``): weights scaled by a power of two (exact, unless the largest
  weight is ≥ 1 and some are subnormal after scaling down), double-float prefix sums by a
  log-depth scan (relative error ≲ (log2 V + 2)·2^-47), the target u·total by Dekker's
  TwoProduct, and the count of cdf ≤ target. Its index is the float64 path's except when
  u·total lies within (2^-40 + V·2^-53)·total of a CDF breakpoint: this path's error (≲ 2^-40)
  plus float64's own rounding of its sums (≤ V·2^-53 worst case); on inputs both hold exactly
  (e.g. dyadic) they agree. Bad laws (NaN, ±inf or negative weight, no mass) return -1, the
  clamp to the last positive weight is the same.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Iterator

import torch

_FP64 = contextvars.ContextVar("dflash2rt_fp64", default=True)
F32 = torch.float32


def fp64_enabled(has_fp64: bool | None = None) -> bool:
    """``has_fp64`` if given, else whether the current context allows float64 (default True)."""
    return _FP64.get() if has_fp64 is None else bool(has_fp64)


@contextlib.contextmanager
def without_fp64() -> Iterator[None]:
    """Ops called inside (with ``has_fp64=None``) take the float32 formulation."""
    token = _FP64.set(False)
    try:
        yield
    finally:
        _FP64.reset(token)


def two_sum(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Knuth's TwoSum: s = fl(a + b) and the exact error a + b − s (no overflow assumed)."""
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


def _split(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    c = a * 4097.0                                 # Dekker: 2^12 + 1 splits 24 bits in 12 + 12
    hi = c - (c - a)
    return hi, a - hi


def two_prod(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dekker's TwoProduct: p = fl(a·b) and the exact error (no overflow / underflow)."""
    p = a * b
    ah, al = _split(a)
    bh, bl = _split(b)
    return p, ((ah * bh - p) + ah * bl + al * bh) + al * bl


def _dd_add(ah, al, bh, bl):
    s, e = two_sum(ah, bh)
    return two_sum(s, e + (al + bl))


def _mant_exp(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Finite float32 x = M·2^E: (M int64 with 2^23 ≤ |M| < 2^24, or 0; E int64), read from the
    bits (no frexp, which not every device backend implements). A subnormal's fraction f < 2^23
    is normalised by 150 − b, b the biased exponent of float32(f) (exact: f < 2^24)."""
    bits = x.to(F32).contiguous().view(torch.int32).to(torch.int64)
    field, frac = (bits >> 23) & 0xFF, bits & 0x7FFFFF
    b = (frac.to(F32).view(torch.int32).to(torch.int64) >> 23) & 0xFF
    n = torch.where(frac > 0, 150 - b, 0)                                 # subnormal shift
    m = torch.where(field > 0, frac | 0x800000, frac << n)
    e = torch.where(field > 0, field - 150, -149 - n)
    return torch.where(bits < 0, -m, m), e


def accept(u: torch.Tensor, q_hi: torch.Tensor, q_lo: torch.Tensor | None,
           p: torch.Tensor) -> torch.Tensor:
    """bool: u·(q_hi + q_lo) < p, exactly, for finite u, q_hi, p ≥ 0 and |q_lo| ≤ ulp(q_hi)/2.

    With A = M_u·M_h, a = E_u + E_h and s = E_p − a: u·q < p ⇔ A + B·2^-g < M_p·2^s (B = M_u·M_l,
    g = E_h − E_l ≥ 24) ⇔ ⌊(A + ⌊B / 2^g⌋) / 2^s⌋ < M_p, an identity for integers; s < 0 is
    false (the left side is ≥ 2^45 > M_p·2^s) and s ≥ 62 true. Other inputs (NaN, inf,
    negative: rows flagged bad_q) use the plain float32 product, which agrees with float64 there.
    """
    q_lo = torch.zeros_like(q_hi) if q_lo is None else q_lo
    mu, eu = _mant_exp(u)
    mh, eh = _mant_exp(q_hi)
    ml, el = _mant_exp(q_lo)
    mp, ep = _mant_exp(p)
    f = mu * mh + ((mu * ml) >> (eh - el).clamp(0, 62))
    s = ep - (eu + eh)
    less = (s >= 0) & ((f >> s.clamp(0, 62)) < mp)
    less = torch.where((u == 0) | (q_hi == 0), p > 0, less)
    ok = torch.isfinite(u) & torch.isfinite(q_hi) & torch.isfinite(q_lo) & torch.isfinite(p) \
        & (u >= 0) & (q_hi >= 0) & (p >= 0)
    return torch.where(ok, less, u * q_hi < p)


def draft_mass32(draft: torch.Tensor, candidates: torch.Tensor, q: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """q_j(d_j) as a double-float (hi, lo) [R, γ]: duplicated candidates summed with TwoSum."""
    hit = candidates == draft.unsqueeze(-1)                               # [R, γ, K]
    q = q.to(F32)
    hi = torch.zeros(draft.shape, dtype=F32, device=q.device)
    lo = torch.zeros_like(hi)
    for k in range(q.shape[-1]):
        hi, e = two_sum(hi, torch.where(hit[..., k], q[..., k], 0.0))
        lo = lo + e
    return two_sum(hi, lo)


def residual32(p_row: torch.Tensor, cand: torch.Tensor, q: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """max(p − Σ_k q_k [cand_k = x], 0) as a double-float (hi, lo) [R, V]; p_row [R, V],
    cand / q [R, K]. hi > 0 exactly where the residual is positive, else hi = lo = 0."""
    hi, lo = p_row.to(F32), torch.zeros_like(p_row, dtype=F32)
    for k in range(cand.shape[1]):
        idx = cand[:, k:k + 1]
        s, e = two_sum(hi.gather(1, idx), -q[:, k:k + 1].to(F32))
        s, e = two_sum(s, e + lo.gather(1, idx))
        hi, lo = hi.scatter(1, idx, s), lo.scatter(1, idx, e)
    pos = hi > 0
    return torch.where(pos, hi, 0.0), torch.where(pos, lo, 0.0)


def _pow2(e: torch.Tensor) -> torch.Tensor:
    """float32 2^e for int64 e in [-126, 127], built from its bits."""
    return ((e + 127).to(torch.int32) << 23).view(F32)


def inverse_cdf32(hi: torch.Tensor, u: torch.Tensor, lo: torch.Tensor | None = None
                  ) -> torch.Tensor:
    """``sampling.inverse_cdf`` on float32 weights hi (+ lo) [..., V] with uniforms u [...]."""
    hi = hi.to(F32)
    lo = torch.zeros_like(hi) if lo is None else lo.to(F32)
    top = hi.amax(dim=-1, keepdim=True)
    ok = torch.isfinite(top) & (top > 0)
    e = _mant_exp(torch.where(ok, top, 1.0))[1] + 24                      # top < 2^e
    shift = torch.where(ok, -e, 0).clamp(-252, 252)
    half = torch.div(shift, 2, rounding_mode="floor")
    f1, f2 = _pow2(half), _pow2(shift - half)
    ch, cl = hi * f1 * f2, lo * f1 * f2                                   # largest in [1/2, 1)
    v = hi.shape[-1]
    step = 1
    while step < v:                                                       # Hillis–Steele scan
        ph = torch.nn.functional.pad(ch[..., :v - step], [step, 0])
        pl = torch.nn.functional.pad(cl[..., :v - step], [step, 0])
        ch, cl = _dd_add(ch, cl, ph, pl)
        step *= 2
    th, tl = ch[..., -1:], cl[..., -1:]
    uf = u.to(F32).unsqueeze(-1)
    ph, pe = two_prod(uf, th)
    gh, gl = two_sum(ph, pe + uf * tl)                                    # target u·total
    dh, de = two_sum(ch, -gh)
    idx = ((dh + (de + (cl - gl))) <= 0).sum(dim=-1)                      # first cdf > target
    positions = torch.arange(v, device=hi.device)
    last_pos = torch.where(hi > 0, positions, -1).amax(dim=-1)
    total = th.squeeze(-1)
    is_law = torch.isfinite(total) & (total > 0) & ~(hi < 0).any(dim=-1)
    return torch.where(is_law, torch.minimum(idx, last_pos), -1)
