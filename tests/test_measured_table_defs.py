"""The adaptive policy's measured table (``dflash2rt/engine/policy/table.py``) against its
definitions in docs/adaptive.md and the module's docstrings, with fixed seconds fed in (never
the clock) and every expected value worked out by hand: the batch bucket, the calibrated
median, costs now (observed first, else calibration × the bucket's drift), the per-call fold of
costs and overheads (``MIN_STEPS`` and the first-call rule each alone), the pooled acceptance
at ``POOL_MIN`` and its cap, and the seeded cost noise drawn as documented."""

from __future__ import annotations

import math
import random

import pytest

from dflash2rt.engine.policy import table as T
from dflash2rt.engine.policy.table import CostNoise, MeasuredTable, bucket_of, cost_noise


def test_documented_constants():
    """docs/adaptive.md: entries move halfway (TRACK) after MIN_STEPS steps; speculative calls
    every 3rd, 5th, 9th, 9th ... (gaps 2, 4, 8, 8); the pool's thresholds."""
    assert (T.TRACK, T.MIN_STEPS, T.FIRST_CALL_GAP, T.MAX_CALL_GAP) == (0.5, 3, 2, 8)
    assert (T.POOL_MIN, T.POOL_CAP) == (8, 256.0)


@pytest.mark.parametrize("rows", range(0, 70))
def test_bucket_is_the_next_power_of_two(rows):
    want = 1
    while want < rows:
        want *= 2
    assert bucket_of(rows) == want


def test_calibrated_is_the_median_or_none():
    t = MeasuredTable()
    assert t.calibrated((2, 1, "greedy")) is None
    t.samples[(2, 1, "greedy")] = []
    assert t.calibrated((2, 1, "greedy")) is None
    t.samples[(2, 1, "greedy")] = [3.0, 1.0, 2.0]
    t.samples[(4, 1, "greedy")] = [4.0, 1.0, 2.0, 8.0]
    assert t.calibrated((2, 1, "greedy")) == 2.0 and t.calibrated((4, 1, "greedy")) == 3.0


def test_costs_now_observed_first_then_calibration_times_drift():
    """Bucket 1 greedy: block 2 observed at 2× its calibration, block 4 at 8× → drift
    sqrt(2 · 8) = 4; block 8 (calibrated only) costs 4 × 0.125. Bucket 1 sampled and bucket 2
    have no observed entry of their own: drift 1. An observed entry without calibration
    counts as itself and adds nothing to the drift. Seconds below 1, as steps take."""
    t = MeasuredTable()
    t.samples = {(2, 1, "greedy"): [0.25], (4, 1, "greedy"): [0.0625],
                 (8, 1, "greedy"): [0.125], (2, 1, "sampled"): [3.0], (2, 2, "greedy"): [5.0]}
    t.observed = {(2, 1, "greedy"): 0.5, (4, 1, "greedy"): 0.5, (16, 1, "greedy"): 7.0,
                  (4, 2, "sampled"): 9.0}
    want = {(2, 1, "greedy"): 0.5, (4, 1, "greedy"): 0.5, (8, 1, "greedy"): 0.5,
            (16, 1, "greedy"): 7.0, (2, 1, "sampled"): 3.0, (2, 2, "greedy"): 5.0,
            (4, 2, "sampled"): 9.0}
    got = t.costs_now()
    assert got.keys() == want.keys()
    for k in want:
        assert got[k] == pytest.approx(want[k], rel=1e-12), k
    assert t.costs_now(drift=False) == {**{k: t.calibrated(k) for k in t.samples}, **t.observed}
    assert t.costs_now(False)[(8, 1, "greedy")] == 0.125


@pytest.mark.parametrize("cal,obs", [(0.0, 2.0), (1.0, 0.0), (-1.0, 2.0), (1.0, -2.0)])
def test_a_non_positive_cost_adds_no_drift(cal, obs):
    """Each condition alone: a zero or negative calibration, a zero or negative observation."""
    t = MeasuredTable()
    t.samples = {(2, 1, "greedy"): [cal], (4, 1, "greedy"): [0.5]}
    t.observed = {(2, 1, "greedy"): obs}
    assert t.costs_now()[(4, 1, "greedy")] == 0.5


@pytest.mark.parametrize("cal,obs", [(0.001, 0.002), (0.5, 1.0), (2.0, 4.0)])
def test_any_positive_pair_adds_drift(cal, obs):
    t = MeasuredTable()
    t.samples = {(2, 1, "greedy"): [cal], (4, 1, "greedy"): [0.5]}
    t.observed = {(2, 1, "greedy"): obs}
    assert t.costs_now()[(4, 1, "greedy")] == pytest.approx(1.0, rel=1e-12)


def test_fold_costs_moves_track_of_the_way_to_the_median():
    key, frozen_only, cal_only = (2, 1, "greedy"), (4, 1, "greedy"), (8, 1, "greedy")
    t = MeasuredTable()
    t.observed[key] = 1.0
    t.samples[cal_only] = [2.0, 4.0, 3.0]
    steps = {key: [5.0, 2.0, 3.0], frozen_only: [1.0, 1.0, 4.0, 9.0], cal_only: [7.0] * 3}
    t.fold_costs(steps, {key: 100.0, frozen_only: 2.0}, 0.25)
    assert t.observed == {key: 1.0 + 0.25 * (3.0 - 1.0),          # observed beats frozen
                          frozen_only: 2.0 + 0.25 * (2.5 - 2.0),
                          cal_only: 3.0 + 0.25 * (7.0 - 3.0)}


def test_fold_costs_each_condition_alone():
    key = (2, 1, "greedy")
    few = [1.0] * (T.MIN_STEPS - 1)
    enough = [1.0] * T.MIN_STEPS
    t = MeasuredTable()
    t.fold_costs({key: few}, {key: 4.0}, 0.5)              # a cost, too few steps
    assert t.observed == {}
    t.fold_costs({key: enough}, {}, 0.5)                   # enough steps, no cost, not first
    assert t.observed == {}
    t.fold_costs({key: few}, {}, 0.5, first=True)          # first, too few steps
    assert t.observed == {}
    t.fold_costs({key: [3.0, 1.0, 2.0]}, {}, 0.5, first=True)    # first takes the median
    assert t.observed == {key: 2.0}
    t.fold_costs({key: enough}, {}, 0.5, first=True)       # a cost now: first moves it
    assert t.observed == {key: 1.5}
    t.fold_costs({key: enough}, {key: 4.0}, 0.0)           # track 0: unchanged
    assert t.observed == {key: 1.5}
    t.fold_costs({key: [9.0] * 3}, {}, 1.0)                # track 1: the median
    assert t.observed == {key: 9.0}


def test_fold_overhead():
    t = MeasuredTable()
    for bad in (math.nan, math.inf, -math.inf):
        t.fold_overhead(("k",), bad, 0.5)
    assert t.overhead == {}
    t.fold_overhead(("k",), -2.0, 0.25)                    # the first call sets it
    assert t.overhead == {("k",): -2.0}
    t.fold_overhead(("k",), 6.0, 0.25)
    assert t.overhead == {("k",): -2.0 + 0.25 * 8.0}
    t.fold_overhead(("k",), math.nan, 0.25)
    t.fold_overhead(("j",), 0.0, 0.25)
    assert t.overhead == {("k",): 0.0, ("j",): 0.0}
    t.fold_overhead(("j",), 4.0, 0.25)
    assert t.overhead[("j",)] == 1.0


def test_pool_needs_pool_min_observations_per_slot():
    t = MeasuredTable()
    assert t.pool("greedy", "L") == []
    n = float(T.POOL_MIN)
    t.fold_accept("greedy", "L", ([6.0, 3.0, 1.0], [n, n - 1, 0.0]))
    assert t.pool("greedy", "L") == [6.0 / n, None, None]
    assert t.pool("sampled", "L") == [] and t.pool("greedy", "M") == []
    t.fold_accept("greedy", "L", ([0.0, 1.0, 0.0, 2.0], [n, 1.0, n - 0.5, n]))
    assert t.pool("greedy", "L") == [6.0 / (2 * n), 4.0 / n, None, 2.0 / n]
    assert t.accept[("greedy", "L")] == ([6.0, 4.0, 1.0, 2.0],
                                         [2 * n, n, n - 0.5, n])


def test_fold_accept_adds_and_caps_slot_one():
    t = MeasuredTable()
    t.fold_accept("g", 0, ([100.0, 50.0], [200.0, 100.0]))
    t.fold_accept("g", 0, ([56.0], [56.0]))                 # exactly the cap: unscaled
    assert t.accept[("g", 0)] == ([156.0, 50.0], [256.0, 100.0])
    t.fold_accept("g", 0, ([256.0, 0.0, 12.0], [256.0, 156.0, 16.0]))  # 512 → halved
    assert t.accept[("g", 0)] == ([206.0, 25.0, 6.0], [256.0, 128.0, 8.0])
    t.fold_accept("h", 0, ([0.0], [0.0]))
    assert t.accept[("h", 0)] == ([0.0], [0.0])
    t.fold_accept("e", 0, ([], []))
    assert t.accept[("e", 0)] == ([], []) and t.pool("e", 0) == []


def test_accept_copy_is_the_pool_alone_and_apart():
    t = MeasuredTable()
    t.fold_accept("g", 0, ([9.0], [10.0]))
    t.observed[(2, 1, "g")] = 1.0
    t.samples[(2, 1, "g")] = [1.0]
    t.overhead[("k",)] = 1.0
    t.calls[("k",)] = (1, 2)
    c = t.accept_copy()
    assert c.accept == {("g", 0): ([9.0], [10.0])}
    assert (c.observed, c.samples, c.overhead, c.calls) == ({}, {}, {}, {})
    c.fold_accept("g", 0, ([1.0], [1.0]))
    assert t.accept == {("g", 0): ([9.0], [10.0])}


def ref_noise(seed: str, calls):
    """The documented draws: per entry e^U(-2.5, 2.5) from the seed and the entry, per sample
    e^U(-0.5, 0.5) and per call e^U(-1, 1), both from one stream of the seed."""
    rng = random.Random(f"{seed}:samples")
    out = []
    for kind, sec, key in calls:
        if kind == "step":
            f = math.exp(random.Random(f"{seed}:{key}").uniform(-2.5, 2.5))
            out.append(sec * f * math.exp(rng.uniform(-0.5, 0.5)))
        else:
            out.append(sec * math.exp(rng.uniform(-1.0, 1.0)))
    return out


@pytest.mark.parametrize("seed", ["1", "7", "abc"])
def test_cost_noise_draws_as_documented(seed):
    r = random.Random(seed)
    calls = []
    for _ in range(60):
        key = (r.choice([1, 2, 4, 8]), r.choice([1, 2, 4]), r.choice(["greedy", "sampled"]))
        calls.append((r.choice(["step", "step", "call"]), r.randint(1, 9) / 8, key))
    n = CostNoise(seed)
    got = [n.step(sec, *key) if kind == "step" else n.call(sec) for kind, sec, key in calls]
    assert got == pytest.approx(ref_noise(seed, calls), rel=1e-12)
    assert n.describe() == f"step costs perturbed (DFLASH2RT_PERTURB_COSTS={seed})"


def test_cost_noise_follows_the_variable(monkeypatch):
    monkeypatch.setenv(T.PERTURB_ENV, "   ")
    assert cost_noise() is None
    monkeypatch.setenv(T.PERTURB_ENV, "")
    assert cost_noise() is None
    monkeypatch.setenv(T.PERTURB_ENV, " 11 ")
    a = cost_noise()
    assert a.seed == "11" and cost_noise() is a
    monkeypatch.setenv(T.PERTURB_ENV, "12")
    assert cost_noise().seed == "12" and cost_noise() is not a
