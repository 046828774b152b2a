"""The finish rule's arithmetic (``dflash2rt/engine/policy/finish.py``) against its definitions
in the module's docstrings and docs/adaptive.md, recomputed in exact rationals by loops that
share no code with the module: a step at block b commits k < b tokens with probability
Π_{i<k} α_i · (1 − α_k), b with Π_{i<b} α_i; E[X] and Var[X] of that law; the expected steps
for a row's last n tokens, counted exactly (S(0) = 0, S(m) = 1 + Σ_{k<m} P(k)·S(m − k)) for
the last ``TAIL`` · b = 4b tokens and ⌈n / E[X]⌉ before them; the renewal-CLT spread
√(n·Var[X] / E[X]³) (none for target-only steps); Blom's normal order statistics."""

from __future__ import annotations

import math
import random
from fractions import Fraction as F

import pytest

from dflash2rt.engine.policy import finish
from dflash2rt.engine.policy.finish import (BlockLaw, expected_of, finish_spread, finish_steps,
                                            order_z)


def test_documented_constants():
    assert finish.TAIL == 4


def ref_law(alphas, b):
    """(P(commit k) for k = 1 .. b, E[X], Var[X]) in exact rationals."""
    probs, reach = [], F(1)
    for k in range(1, b):
        a = F(alphas[k - 1])
        probs.append(reach * (1 - a))
        reach *= a
    probs.append(reach)
    mean = sum(k * p for k, p in enumerate(probs, 1))
    second = sum(k * k * p for k, p in enumerate(probs, 1))
    return probs, mean, second - mean * mean


def ref_tail(probs, upto):
    """S(0 .. upto): S(m) = 1 + Σ_{k < m} P(k)·S(m − k) (a commit of m or more ends the row)."""
    s = [F(0)]
    for m in range(1, upto + 1):
        s.append(1 + sum((probs[k - 1] * s[m - k] for k in range(1, len(probs) + 1) if k < m),
                         F(0)))
    return s


def ref_steps(alphas, b, n):
    probs, mean, _ = ref_law(alphas, b)
    if n <= 4 * b:
        return ref_tail(probs, n)[n]
    return F(math.ceil(F(n) / mean))


def _chain(rng, slots):
    pick = rng.random()
    if pick < 0.1:
        return [1.0] * slots
    if pick < 0.2:
        return [0.0] * slots
    return [rng.choice([rng.random(), 0.5, 0.9, 0.99]) for _ in range(slots)]


def test_expected_tokens_per_step():
    """1 + Σ_{j<b} Π_{i≤j} α_i: the law's mean; slots past b − 1 are not read."""
    rng = random.Random(3)
    for _ in range(300):
        b = rng.randint(1, 16)
        alphas = _chain(rng, 20)
        want = ref_law(alphas, b)[1]
        assert expected_of(alphas, b) == pytest.approx(float(want), rel=1e-12)
        assert expected_of(alphas[:max(b - 1, 0)], b) == expected_of(alphas, b)
        assert BlockLaw(alphas, b).mean == pytest.approx(float(want), rel=1e-12)
    assert expected_of([], 1) == 1.0 == expected_of([0.7], 1)


def test_block_law_is_the_commit_law():
    rng = random.Random(5)
    for _ in range(300):
        b = rng.choice([1, 2, 3, 4, 5, 8, 16])
        alphas = _chain(rng, 16)
        probs, mean, var = ref_law(alphas, b)
        law = BlockLaw(alphas, b)
        assert law.block == b and len(law.commit) == b
        assert law.commit == pytest.approx([float(p) for p in probs], rel=1e-12, abs=1e-15)
        assert law.var == pytest.approx(float(var), rel=1e-9, abs=1e-12)
        assert law.var >= 0.0


def test_steps_count_the_last_four_blocks_exactly_and_divide_before():
    """Every n from 1 to 6b, asked in a random order of one law (its table of exact counts
    grows as asked) and of fresh ones: exact to 4b inclusive, ⌈n / E[X]⌉ past it."""
    rng = random.Random(9)
    for _ in range(60):
        b = rng.choice([1, 2, 3, 4, 8])
        alphas = _chain(rng, 15)
        law = BlockLaw(alphas, b)
        ns = list(range(1, 6 * b + 3))
        rng.shuffle(ns)
        mean = ref_law(alphas, b)[1]
        for n in ns:
            want = ref_steps(alphas, b, n)
            if n > 4 * b and abs(F(n) / mean - round(F(n) / mean)) < F(1, 10**9):
                continue                           # n / E[X] a whole number: rounding decides
            assert law.steps(n) == pytest.approx(float(want), rel=1e-9), (alphas, b, n)
            assert finish_steps(alphas, b, n) == law.steps(n)
        assert law.steps(0) == 0.0 == finish_steps(alphas, b, 0)     # S(0): nothing left


def test_the_exact_tail_differs_from_division_at_its_edge():
    """At α 0.5 and block 4 the exact count at n = 4b and past it differ from ⌈n / E[X]⌉, so
    where the exact counting stops is seen."""
    alphas, b = [0.5] * 3, 4
    mean = ref_law(alphas, b)[1]
    for n in (4 * b, 4 * b + 1, 5 * b):
        exact = ref_tail(ref_law(alphas, b)[0], n)[n]
        assert exact != math.ceil(F(n) / mean)
        want = exact if n <= 4 * b else F(math.ceil(F(n) / mean))
        assert finish_steps(alphas, b, n) == pytest.approx(float(want), rel=1e-12)


def test_spread_is_the_renewal_clt():
    rng = random.Random(13)
    for _ in range(200):
        b = rng.choice([1, 2, 4, 8, 16])
        n = rng.randint(1, 300)
        alphas = _chain(rng, 16)
        mean, sd = finish_spread(alphas, b, n)
        if b == 1:
            assert (mean, sd) == (float(n), 0.0)
            continue
        _, e, var = ref_law(alphas, b)
        assert mean == finish_steps(alphas, b, n)
        assert sd == pytest.approx(math.sqrt(float(n * var / e ** 3)), rel=1e-9, abs=1e-12)


def _inv_phi(p):
    lo, hi = -10.0, 10.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if 0.5 * (1 + math.erf(mid / math.sqrt(2))) < p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


@pytest.mark.parametrize("rows", [0, 1, 2, 3, 5, 8, 16, 33])
def test_order_statistics_are_blom_s(rows):
    """Φ⁻¹((i − 0.375) / (rows + 0.25)) for i = 1 .. rows; none for one row."""
    if rows < 2:
        assert order_z(rows) == (0.0,) * rows
        return
    want = [_inv_phi((i - 0.375) / (rows + 0.25)) for i in range(1, rows + 1)]
    assert order_z(rows) == pytest.approx(want, abs=1e-9)
