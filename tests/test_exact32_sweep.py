"""The float32 formulation (``ops.exact32``) where a sweep found classes the other tests let
through: one-weight rows (an infinite weight is no law), u = 1 (the clamp to the last positive
weight), subnormal weights beside a largest weight in [1/2, 1) (no scaling: kept exactly) and
TwoProduct on operands up to 2^115 (Dekker's split a·4097 stays finite). Expected values by hand
or from an inverse CDF over rationals written here."""

from __future__ import annotations

from fractions import Fraction

import torch

from dflash2rt.ops import exact32
from dflash2rt.ops.sampling import inverse_cdf

F32 = torch.float32
NAN, INF = float("nan"), float("inf")
TINY = 2.0 ** -149                                  # the smallest float32 subnormal


def _rational_index(weights, u) -> int:
    """First index whose cumulative weight exceeds u·total, over exact rationals, clamped to the
    last positive weight; -1 for a row that is not a law (none here has a bad weight)."""
    w = [Fraction(float(x)) for x in weights]
    total = sum(w)
    if total <= 0:
        return -1
    target, cum, idx = Fraction(float(u)) * total, Fraction(0), 0
    for x in w:
        cum += x
        idx += cum <= target
    return min(idx, max(i for i, x in enumerate(w) if x > 0))


def test_a_one_weight_row_is_a_law_only_when_that_weight_is_finite_and_positive():
    w = torch.tensor([[INF], [NAN], [0.0], [-1.0], [2.5], [TINY], [3.4e38]], dtype=F32)
    u = torch.full((7,), 0.5)
    got = exact32.inverse_cdf32(w, u).tolist()
    assert got == [-1, -1, -1, -1, 0, 0, 0]
    assert got == inverse_cdf(w.double(), u.double()).tolist()


def test_u_one_clamps_to_the_last_positive_weight():
    """u = 1: every CDF entry is <= u·total, so the count runs past the row: the index is the
    last positive weight, never a trailing zero-weight token."""
    w = torch.tensor([[0.5, 0.0, 0.0], [0.0, 0.25, 0.0], [0.1, 0.2, 0.3], [0.0, 0.0, 7.0],
                      [TINY, 0.0, 0.0]], dtype=F32)
    u = torch.ones(5)
    got = exact32.inverse_cdf32(w, u).tolist()
    assert got == [0, 1, 2, 2, 0]
    assert got == inverse_cdf(w.double(), u.double()).tolist()


def test_subnormal_weights_beside_a_largest_weight_in_half_one_are_kept_exactly():
    """A largest weight in [1/2, 1) is not rescaled, so a subnormal weight in front keeps every
    bit: u·total falls a subnormal short of the second CDF entry, which the rational CDF (and
    this path) see and float64, rounding that weight away in its sums, does not."""
    w = torch.tensor([[TINY, 0.5, 0.5], [TINY, 0.75, 0.75], [3 * TINY, 0.75, 0.75]], dtype=F32)
    u = torch.full((3,), 0.5)
    want = [_rational_index(row, x) for row, x in zip(w, u)]
    assert want == [1, 1, 1]
    assert exact32.inverse_cdf32(w, u).tolist() == want
    assert inverse_cdf(w.double(), u.double()).tolist() == [2, 2, 2]     # float64 rounds here


def test_two_prod_is_error_free_for_operands_up_to_2_to_the_115():
    """p + e == a·b exactly for |a| up to 1.5·2^115 (its split's a·4097 is still finite) times
    factors that keep the product and its error normal."""
    g = torch.Generator().manual_seed(4)
    a = torch.tensor([1.5 * 2.0 ** 115, -1.25 * 2.0 ** 114, 2.0 ** 115 + 2.0 ** 92, 3.0e34])
    a = torch.cat([a, (1 + torch.rand(60, generator=g)) * 2.0 ** 114])
    b = torch.cat([torch.tensor([1.1 * 2.0 ** -20, 3.0 ** 0.5, 0.7, -1.3e-10]),
                   (torch.rand(60, generator=g) + 0.5) * 2.0 ** -40])
    p, e = exact32.two_prod(a, b)
    assert p.dtype == e.dtype == F32
    for x, y, a_, b_ in zip(p, e, a, b):
        assert Fraction(float(x)) + Fraction(float(y)) == Fraction(float(a_)) * Fraction(float(b_))
    q, f = exact32.two_prod(b, a)                                  # either operand large
    assert torch.equal(q, p) and torch.equal(f, e)
