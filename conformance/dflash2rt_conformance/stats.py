"""χ² tail and power for the L4 sampling test (pure Python; no SciPy needed).

``chi2_sf`` is the regularised upper incomplete gamma Q(k/2, x/2) (series / continued
fraction, Numerical Recipes §6.2). ``detectable_tv`` is the smallest total-variation distance a
χ² test with n samples over ``cells`` cells detects at level ``alpha`` with ``power``: any
alternative at TV ε has χ² divergence ≥ 4ε², hence noncentrality λ ≥ 4nε²; the noncentral χ²
tail uses Patnaik's scaled-χ² approximation.
"""

from __future__ import annotations

import math


def _gamma_p_series(a: float, x: float) -> float:
    term = total = 1.0 / a
    n = a
    for _ in range(10000):
        n += 1
        term *= x / n
        total += term
        if abs(term) < abs(total) * 1e-15:
            break
    return total * math.exp(-x + a * math.log(x) - math.lgamma(a))


def _gamma_q_cf(a: float, x: float) -> float:
    tiny = 1e-300
    b = x + 1 - a
    c, d = 1 / tiny, 1 / b
    h = d
    for i in range(1, 10000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        h *= d * c
        if abs(d * c - 1) < 1e-15:
            break
    return math.exp(-x + a * math.log(x) - math.lgamma(a)) * h


def chi2_sf(x: float, k: float) -> float:
    """P(χ²_k > x)."""
    if x <= 0:
        return 1.0
    a, y = k / 2, x / 2
    return 1 - _gamma_p_series(a, y) if y < a + 1 else _gamma_q_cf(a, y)


def chi2_isf(p: float, k: float) -> float:
    lo, hi = 0.0, k + 100 * math.sqrt(2 * k) + 100
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if chi2_sf(mid, k) > p else (lo, mid)
    return (lo + hi) / 2


def nc_chi2_sf(x: float, k: float, lam: float) -> float:
    h = (k + 2 * lam) / (k + lam)
    return chi2_sf(x / h, (k + lam) ** 2 / (k + 2 * lam))


def detectable_tv(n: int, cells: int, alpha: float, power: float) -> float:
    k = max(cells - 1, 1)
    crit = chi2_isf(alpha, k)
    lo, hi = 0.0, 1e7
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if nc_chi2_sf(crit, k, mid) < power else (lo, mid)
    return math.sqrt(hi / (4 * n))


def samples_for_tv(tv: float, cells: int, alpha: float, power: float) -> int:
    n = 1000
    while detectable_tv(n, cells, alpha, power) > tv:
        n = int(n * 1.25)
    return n


def chi2_test(counts: dict, expected_p: dict, n: int, min_expected: float = 5.0
              ) -> tuple[float, int, float]:
    """(statistic, degrees of freedom, p-value); cells with n·p < min_expected are pooled;
    an observed outcome with expected probability 0 makes the statistic infinite."""
    if any(k not in expected_p or expected_p[k] <= 0 for k, c in counts.items() if c > 0):
        return math.inf, 0, 0.0
    stat, cells, pool_o, pool_e = 0.0, 0, 0.0, 0.0
    for k, p in expected_p.items():
        e, o = n * p, counts.get(k, 0)
        if e < min_expected:
            pool_o, pool_e = pool_o + o, pool_e + e
            continue
        stat += (o - e) ** 2 / e
        cells += 1
    if pool_e > 0:
        stat += (pool_o - pool_e) ** 2 / pool_e
        cells += 1
    dof = max(cells - 1, 1)
    return stat, dof, chi2_sf(stat, dof)
