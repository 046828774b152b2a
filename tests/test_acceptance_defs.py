"""The acceptance estimators (``dflash2rt/engine/policy/acceptance.py``) against their
definitions in docs/adaptive.md, recomputed in exact rationals by loops that share no code
with the module: the pooled profile (a slot with no pooled value takes the previous slot's,
slot 1 the prior), the row's one factor (accepted + ``ROW_WEIGHT``) / (Σ reached_i · p_i +
``ROW_WEIGHT``) over every slot the row reached, the cap, and the chained per-slot counts
against ``weight`` pseudo-observations of the pooled slot or of the previous estimate."""

from __future__ import annotations

import random
from fractions import Fraction as F

import pytest

from dflash2rt.engine.policy import acceptance
from dflash2rt.engine.policy.acceptance import chained, scaled

ROW = F(12)          # ROW_WEIGHT (docs/benchmarks/adaptive.md: factor, ROW_WEIGHT 12)
CAP = F(99, 100)     # ALPHA_CAP


def test_documented_constants():
    assert acceptance.PRIOR_WEIGHT == {"greedy": 1.0, "sampled": 4.0}
    assert acceptance.ROW_WEIGHT == 12.0 and acceptance.ALPHA_CAP == 0.99


def ref_profile(pool, slots, n_seen, prior):
    out, last = [], F(prior)
    for j in range(max(slots, n_seen)):
        known = j < len(pool) and pool[j] is not None
        if known:
            last = F(pool[j])
        out.append(last)
    return out


def ref_scaled(acc, seen, pool, slots, prior):
    prof = ref_profile(pool, slots, len(seen), prior)
    expected = F(0)
    for j in range(len(seen)):
        expected += F(seen[j]) * prof[j]
    factor = (sum(F(a) for a in acc) + ROW) / (expected + ROW)
    return [p * factor if p * factor < CAP else CAP for p in prof[:slots]]


def ref_chained(acc, seen, pool, slots, prior, weight):
    out, est = [], F(prior)
    for j in range(slots):
        hit = F(acc[j]) if j < len(acc) else F(0)
        n = F(seen[j]) if j < len(acc) else F(0)
        base = F(pool[j]) if j < len(pool) and pool[j] is not None else est
        est = (hit + base * F(weight)) / (n + F(weight))
        out.append(est)
    return out


def close(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert abs(F(g) - w) <= F(1, 10**12) * max(abs(w), 1), (got, [float(x) for x in want])


def test_scaled_by_hand():
    """Pool [0.5, None, 0.25] at prior 0.75 → profile 0.5, 0.5, 0.25, 0.25; the row reached
    slots 4, 2, 2 times and accepted 3, 1, 0 → factor (4 + 12) / (4·0.5 + 2·0.5 + 2·0.25 + 12)
    = 16 / 15.5."""
    got = scaled([3.0, 1.0, 0.0], [4.0, 2.0, 2.0], [0.5, None, 0.25], 4, 0.75)
    f = F(16) / F(31, 2)
    close(got, [F(1, 2) * f, F(1, 2) * f, F(1, 4) * f, F(1, 4) * f])


def test_scaled_unknown_first_slot_takes_the_prior_and_slots_past_the_pool_the_last():
    got = scaled([], [], [None, 0.5], 4, 0.75)
    assert got == [0.75, 0.5, 0.5, 0.5]
    assert scaled([], [], [], 3, 0.25) == [0.25, 0.25, 0.25]


def test_scaled_counts_reached_slots_past_the_asked_ones():
    """The factor takes every slot the row reached, also those past ``slots``: a row that
    reached slot 3 ten times and accepted nothing there is lower at slot 1 too."""
    got = scaled([0.0, 0.0, 0.0], [0.0, 0.0, 10.0], [0.5], 1, 0.5)
    close(got, [F(1, 2) * ROW / (F(5) + ROW)])


def test_scaled_cap_and_just_below():
    assert scaled([100.0], [100.0], [0.995], 2, 0.5) == [0.99, 0.99]     # factor 1, p > cap
    assert scaled([0.0], [0.0], [0.99], 1, 0.5) == [0.99]                 # at the cap
    low = scaled([0.0], [0.0], [0.989], 1, 0.5)
    assert low == [0.989]
    hi = scaled([30.0], [30.0], [0.5], 1, 0.5)                            # factor 42 / 27
    close(hi, [min(F(1, 2) * F(42, 27), CAP)])
    assert hi[0] < 0.99


def test_scaled_no_slots_is_empty():
    assert scaled([1.0], [2.0], [0.5], 0, 0.5) == []


@pytest.mark.parametrize("seed", range(8))
def test_scaled_random(seed):
    rng = random.Random(seed)
    for _ in range(40):
        n = rng.randint(0, 7)
        seen = [float(rng.randint(0, 30)) for _ in range(n)]
        acc = [float(rng.randint(0, int(s))) for s in seen]
        pool = [rng.choice([None, rng.randint(1, 63) / 64]) for _ in range(rng.randint(0, 8))]
        slots = rng.randint(0, 9)
        prior = rng.randint(1, 15) / 16
        close(scaled(acc, seen, pool, slots, prior), ref_scaled(acc, seen, pool, slots, prior))


def test_chained_by_hand():
    """Prior 0.5, weight 2, no pool; slot 1: 3 of 4 → (3 + 1) / 6 = 2/3; slot 2: 1 of 3 →
    (1 + 4/3) / 5 = 7/15; slot 3 never reached → 7/15 again."""
    got = chained([3.0, 1.0], [4.0, 3.0], [], 3, 0.5, 2.0)
    close(got, [F(2, 3), F(7, 15), F(7, 15)])


def test_chained_pooled_slots_replace_the_chain_where_known():
    """Pool [None, 0.25]: slot 1 chains from the prior, slot 2 starts from 0.25 whatever slot
    1 was, slot 3 chains from slot 2."""
    got = chained([1.0, 0.0, 0.0], [1.0, 1.0, 0.0], [None, 0.25], 3, 0.5, 1.0)
    close(got, [F(3, 4), F(1, 8), F(1, 8)])


def test_chained_no_counts_is_the_prior_or_the_pool():
    assert chained([], [], [], 3, 0.75, 4.0) == [0.75, 0.75, 0.75]
    assert chained([], [], [0.5, None, 0.25], 4, 0.75, 4.0) == [0.5, 0.5, 0.25, 0.25]
    assert chained([2.0], [2.0], [], 0, 0.5, 1.0) == []


@pytest.mark.parametrize("seed", range(8))
def test_chained_random(seed):
    rng = random.Random(100 + seed)
    for _ in range(40):
        n = rng.randint(0, 7)
        seen = [rng.randint(0, 40) / 4 for _ in range(n)]         # decayed counts
        acc = [rng.randint(0, int(4 * s)) / 4 for s in seen]
        pool = [rng.choice([None, rng.randint(1, 63) / 64]) for _ in range(rng.randint(0, 8))]
        slots = rng.randint(0, 9)
        prior, weight = rng.randint(1, 15) / 16, rng.choice([0.5, 1.0, 4.0])
        close(chained(acc, seen, pool, slots, prior, weight),
              ref_chained(acc, seen, pool, slots, prior, weight))
