"""The adaptive schedule in a batch: the slowest row's spread, the per-row law cache, the per-mode
prior weight, and calibration that times each block after one of its own (test_schedule.py has
the rule itself)."""

from __future__ import annotations

import random
import statistics

import pytest

from dflash2rt import get_backend
from dflash2rt.engine.engine import Engine
from dflash2rt.engine.policy.adaptive import AdaptivePolicy
from dflash2rt.engine.policy.call_plan import PLAN_MARGIN
from dflash2rt.engine.policy.finish import (BlockLaw, expected_of, finish_spread, finish_steps,
                                            order_z)
from dflash2rt.engine.policy.schedule import PRIOR_WEIGHT, AdaptiveSchedule
from dflash2rt.engine.request import Request, SamplingParams
from dflash2rt.errors import InvalidInputError

from tiny_models import oracle_pair

CANDS = (1, 2, 4, 8)


def _steps_to_finish(alphas, block, n, rng):
    """One draw of the steps a row needs for n tokens at ``block`` (slot j accepted w.p. α_j)."""
    steps = 0
    while n > 0:
        k = 1
        while k < block and rng.random() < alphas[k - 1]:
            k += 1
        n -= k
        steps += 1
    return steps


def test_order_statistics_of_the_slowest_rows():
    """Blom's expected normal order statistics: none at batch 1; symmetric, ascending, the
    largest near the exact E[max] of 2, 4, 8 standard normals (0.5642, 1.0294, 1.4236)."""
    assert order_z(1) == (0.0,)
    for rows, top in ((2, 0.5642), (4, 1.0294), (8, 1.4236)):
        z = order_z(rows)
        assert len(z) == rows and list(z) == sorted(z)
        assert z == pytest.approx(tuple(-x for x in reversed(z)))
        assert z[-1] == pytest.approx(top, abs=0.05)


@pytest.mark.parametrize("alphas,block", [([0.6] * 7, 4), ([0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3], 8),
                                          ([0.3] * 7, 2)])
def test_finish_spread_matches_simulated_rows(alphas, block):
    """Mean and spread of the steps to finish n tokens against 4,000 simulated rows (the mean
    within 2%, the standard deviation within 12%: a CLT approximation); target-only: exactly n
    steps, no spread."""
    rng, n = random.Random(7), 128
    draws = [_steps_to_finish(alphas, block, n, rng) for _ in range(4000)]
    mean, sd = finish_spread(alphas, block, n)
    assert mean == finish_steps(alphas, block, n)
    assert mean == pytest.approx(statistics.fmean(draws), rel=0.02)
    assert sd == pytest.approx(statistics.pstdev(draws), rel=0.12)
    assert finish_spread(alphas, 1, n) == (float(n), 0.0)


def test_block_law_moments():
    law = BlockLaw([0.6, 0.6, 0.6], 4)
    assert law.commit == pytest.approx([0.4, 0.24, 0.144, 0.216])
    assert law.mean == pytest.approx(2.176)
    assert law.var == pytest.approx(0.4 + 4 * 0.24 + 9 * 0.144 + 16 * 0.216 - 2.176 ** 2)
    assert [law.steps(n) for n in (1, 2)] == [1.0, pytest.approx(1 + 0.4)]   # 2: P(commit 1)


def test_a_batch_waits_for_its_slowest_row():
    """Eight rows at α 0.6, 128 tokens each, block 4 at twice a target-only step: one row alone
    finishes in 59 expected steps (118 < 128: speculate); eight rows wait for the slowest
    (about 59 + 1.42 · 4.1 steps: target-only wins), though the rate rule and each row's mean
    say block 4."""
    costs = {1: 1.0, 2: 1.9, 4: 2.0, 8: 3.0}
    s = AdaptiveSchedule(CANDS, costs, prior=0.6, prior_weight=1e9)
    s.begin("sampled")
    rows = list(range(8))
    assert max(s.scores(rows), key=s.scores(rows).get) == 4
    assert s.choose(rows[:1], [128]) == 4
    fin = s.finish_scores(rows, [128] * 8)
    assert max(fin, key=fin.get) == 1 and s.choose(rows, [128] * 8) == 1
    assert fin[4] == pytest.approx(1024 / (2.0 * (59 + sum(order_z(8)[-1:]) * 4.14)), rel=0.02)


def test_cached_row_laws_follow_each_observation():
    """Choices reuse a row's law until the row observes a step: then it is rebuilt, so a
    schedule's finish scores equal a fresh schedule's given the same observations."""
    costs = {1: 1.0, 2: 1.3, 4: 1.5, 8: 1.9}
    seq = [[7, 7], [0, 3], [1, 0], [7, 2]]
    s = AdaptiveSchedule(CANDS, costs)
    s.begin("sampled")
    for i, acc in enumerate(seq):
        s.finish_scores(["a", "b"], [64, 40])                 # fills the cache
        s.observe(["a", "b"], 8, acc)
        fresh = AdaptiveSchedule(CANDS, costs)
        fresh.begin("sampled")
        for a in seq[:i + 1]:
            fresh.observe(["a", "b"], 8, a)
        assert s.finish_scores(["a", "b"], [64, 40]) == fresh.finish_scores(["a", "b"], [64, 40])
    for _ in range(3):                         # target-only steps observe nothing: same scores
        before = s.finish_scores(["a", "b"], [30, 30])
        s.observe(["a", "b"], 1, [0, 0])
        assert s.finish_scores(["a", "b"], [30, 30]) == before


def test_prior_weight_per_mode():
    """Greedy: one pseudo-observation (a request's own outcomes lead); sampled: four (its
    coin-flipped outcomes are mostly noise); a number sets both; nonsense is refused."""
    assert PRIOR_WEIGHT == {"greedy": 1.0, "sampled": 4.0}
    for mode, want in (("greedy", 0.8 / 2), ("sampled", 0.8 * 4 / 5)):
        s = AdaptiveSchedule(CANDS, {1: 1.0, 2: 1.1, 4: 1.2, 8: 1.3}, prior=0.8)
        s.begin(mode)
        s.observe(["r"], 8, [0])                               # slot 1 rejected once
        assert s.alpha("r", 1) == pytest.approx(want)
    one = AdaptiveSchedule(CANDS, {1: 1.0, 2: 1.1, 4: 1.2, 8: 1.3}, prior=0.8, prior_weight=3.0)
    for mode in ("greedy", "sampled"):
        one.begin(mode)
        one.observe(["r"], 8, [0])
        assert one.alpha("r", 1) == pytest.approx(0.8 * 3 / 4)
    assert one.replica().prior_weight == 3.0
    for bad in (0.0, -1.0, {"greedy": 1.0}, {"greedy": 1.0, "sampled": 0.0}):
        with pytest.raises(InvalidInputError, match="prior_weight"):
            AdaptiveSchedule(CANDS, prior_weight=bad)


def test_calibration_times_each_block_after_one_of_its_own(monkeypatch):
    """Every timed calibration step follows an untimed step of the same block (a step right
    after another block runs on the caches that one left); both count as calibration steps."""
    events: list[tuple[str, int]] = []

    class Recording(AdaptiveSchedule):
        def measure(self, block, bucket, seconds):
            events.append(("measure", block))
            super().measure(block, bucket, seconds)

    def step(kind, block, clock, run):               # a step's first body: a step of block
        if kind != "verify":
            events.append(("step", block))
        return run()
    engine = Engine(oracle_pair(4), get_backend("cpu"))
    engine.runner.timer = step
    engine.policy = AdaptivePolicy.of(Recording(CANDS, reps=2))
    req = Request((1, 2, 3), SamplingParams(max_new_tokens=6, ignore_eos=True, temperature=1.0))
    _, stats = engine.generate([req])
    timed = [i for i, e in enumerate(events) if e[0] == "measure"]
    assert len(timed) == 2 * len(CANDS) and stats.calibration_steps == 2 * len(timed)
    for i in timed:
        b = events[i][1]
        assert events[i - 2:i] == [("step", b), ("step", b)]


def test_a_run_of_target_only_steps_keeps_its_choice_without_scoring():
    """While target-only steps run (estimates unchanged), the choice is kept without scoring
    until the probe is due or a row leaves; under the rate rule the choices are exactly those
    of scoring every step."""
    costs = {1: 1.0, 2: 1.6, 4: 1.8, 8: 2.2}
    class Scoring(AdaptiveSchedule):                 # scores every step: holds no choice
        def choose(self, rows, remaining=None):
            self._held = None
            return super().choose(rows, remaining)

    lazy = AdaptiveSchedule(CANDS, costs, prior=0.05, prior_weight=1e9)
    eager = Scoring(CANDS, costs, prior=0.05, prior_weight=1e9)
    calls = []
    scores = lazy.scores
    lazy.scores = lambda rows: calls.append(len(rows)) or scores(rows)
    got, want = [], []
    for _ in range(40):
        for s, out in ((lazy, got), (eager, want)):
            b = s.choose(["r", "q"])
            out.append(b)
            s.observe(["r", "q"], b, [0, 0], 0.0)
    assert got == want and got.count(1) > 30
    probes = 40 - got.count(1)
    assert len(calls) == 1 + 2 * probes     # the first choice; each probe's and the one after
    calls.clear()
    lazy.choose(["r"])                                # a row left: scored again
    assert calls == [1]


def _planning_schedule(accept: float, track: float | None = None) -> AdaptivePolicy:
    """A measured (learning) policy whose table is timed at bucket 8 (sampled) and whose pool
    for law "L" holds 100 observations of slot 1 at ``accept`` (every slot alike)."""
    s = AdaptivePolicy(CANDS, reps=1, track=track)
    s.schedule.begin("sampled", "L")
    for b, sec in ((1, 1.0), (2, 1.9), (4, 2.2), (8, 2.8)):
        s.schedule.measure(b, 8, sec)
    s.table.fold_accept("sampled", "L", ([100 * accept] * 7, [100.0] * 7))
    return s


def _plan(s: AdaptivePolicy, rows: int, law: str) -> str:
    """A sampled call of ``rows`` requests, 128 tokens each, under ``law``: its plan."""
    return s.start("sampled", law, rows, [128] * rows).plan


def test_plan_runs_whole_calls_target_only_where_speculation_does_not_pay():
    """From the pool and the table only (earlier calls): target-only calls where the first
    step would pick target-only, with a speculative call after 2, 4, 8, 8 of them; nothing
    planned where speculation pays, before anything is pooled or timed, or for schedules
    that must repeat exactly (track=0, fixed tables)."""
    s = _planning_schedule(0.1)
    got = [bool(_plan(s, 8, "L")) for _ in range(30)]
    spec_calls = [i for i, g in enumerate(got) if not g]
    assert got[:2] == [True, True] and spec_calls[0] == 2
    assert [j - i - 1 for i, j in zip(spec_calls, spec_calls[1:])] == [4, 8, 8]
    assert "target-only call" in _plan(s, 8, "L") + \
        _plan(s, 8, "L")
    assert _plan(s, 8, "other law") == ""       # nothing pooled for it
    assert _plan(s, 3, "L") == ""               # bucket 4 not timed
    good = _planning_schedule(0.95)
    assert _plan(good, 8, "L") == ""
    assert _plan(_planning_schedule(0.1, track=0.0), 8, "L") == ""
    fixed = AdaptivePolicy(CANDS, {1: 1.0, 2: 1.9, 4: 2.2, 8: 2.8})
    assert _plan(fixed, 8, "L") == ""


def test_a_planned_target_only_call_reports_itself():
    """The engine runs a planned call with the target-only stepper and says so in its stats
    (mode, adaptive, call_plan, block sizes): never silently."""
    pair = oracle_pair(4)
    engine = Engine(pair, get_backend("cpu"))
    engine.policy = _planning_schedule(0.0)
    engine.policy.table.fold_accept("sampled", (1.0, 1.0, 0), ([0.0] * 7, [100.0] * 7))
    for b, sec in ((1, 1.0), (2, 1.9), (4, 2.2), (8, 2.8)):
        engine.policy.schedule.measure(b, 1, sec)
    req = Request((1, 2, 3), SamplingParams(max_new_tokens=6, ignore_eos=True, temperature=1.0))
    outs, stats = engine.generate([req])
    assert stats.call_plan.startswith("target-only call") and stats.mode == "target-only"
    assert stats.adaptive and set(stats.block_sizes) == {1} and len(outs[0].token_ids) == 6
    assert stats.as_dict()["call_plan"] == stats.call_plan
    assert stats.costs[1][1] == 1.0 and stats.costs[8][8] == 2.8     # the table it decided with


def test_plan_needs_speculation_to_win_by_its_margin():
    """A call speculates only if its first step projects PLAN_MARGIN x the target-only rate:
    the step costs leave out what a speculative call pays besides its steps."""
    assert PLAN_MARGIN > 1.0
    s = _planning_schedule(0.7)                      # block 4 projects x1.04 target-only
    s.schedule.begin("sampled", "L")
    sc = s.schedule.finish_scores(list(range(8)), [128] * 8)
    best_spec = max(v for b, v in sc.items() if b > 1)
    want_plan = best_spec <= PLAN_MARGIN * sc[1]
    assert bool(_plan(s, 8, "L")) == want_plan
    assert best_spec > sc[1] and want_plan          # wins per step, not by the margin


def _call(s: AdaptivePolicy, spec_extra: float, only_extra: float = 0.0) -> str:
    """A sampled call of 8 requests under law "L", 128 tokens each: its plan, then
    (speculative) one step of block 4, then ``end`` with wall seconds of its tokens at the
    rate ``project`` gave its kind plus ``spec_extra`` (a planned target-only call:
    ``only_extra``) seconds."""
    plan = _plan(s, 8, "L")
    _, rate, tonly = s.schedule.project(8, [128] * 8)
    if not plan:
        s.observe(list(range(8)), 4, [1] * 8, 0.001)
    extra, base = (only_extra, tonly) if plan else (spec_extra, rate)
    s.end(8 * 128, 8 * 128 / base + extra)
    return plan


def _call_rates(s: AdaptivePolicy) -> tuple[float, float]:
    """Speculation's and target-only's projected rates over the next whole call of 8 × 128
    tokens, with the overheads the table holds (a kind without one: the other's)."""
    s.schedule.begin("sampled", "L")
    _, rate, tonly = s.schedule.project(8, [128] * 8)
    key, only = ("sampled", "L", 8, "spec"), ("sampled", "L", 8, "target-only")
    o_spec = s.table.overhead.get(key, s.table.overhead.get(only, 0.0))
    o_only = s.table.overhead.get(only, s.table.overhead.get(key, 0.0))
    return 1024 / (1024 / rate + o_spec), 1024 / (1024 / tonly + o_only)


def test_plan_adds_what_planned_calls_took_beyond_their_steps():
    """Planned calls teach the plan the seconds each kind takes beyond its projected steps
    (whole calls timed: the prefill above all). Both kinds pay them, so a large one shrinks
    speculation's lead over a whole call: under the margin, calls run target-only (the message
    says both rates and both overheads), with probes after 2, 4, ... of them; a kind not timed
    yet takes the other's (a first speculative call's prefill is not counted against
    speculation alone); target-only calls that take longer bring speculation back; other laws
    and buckets are not touched."""
    s = _planning_schedule(0.8)
    s.schedule.begin("sampled", "L")
    spec, rate, tonly = s.schedule.project(8, [128] * 8)
    assert spec > 1 and rate > 1.2 * tonly              # speculation projects a clear win
    key, only = ("sampled", "L", 8, "spec"), ("sampled", "L", 8, "target-only")
    assert _call(s, 60.0) == "" and s.table.overhead == {key: pytest.approx(60.0)}
    assert _call(s, 60.0) == ""                         # small against the call: speculate
    big = _planning_schedule(0.8)
    assert _call(big, 900.0) == ""                      # no record yet: speculate, learn
    decisions = []
    for _ in range(8):
        call_spec, call_only = _call_rates(big)
        plan = _call(big, 900.0, 900.0)
        decisions.append((call_spec > PLAN_MARGIN * call_only, plan))
        if plan:
            assert plan.startswith("target-only call") and \
                f"project {call_only:.4g} tokens/s target-only against {call_spec:.4g}" in plan
    assert not any(pays for pays, _ in decisions)       # 900 s for both: x1.04, not x1.05
    assert [bool(p) for _, p in decisions] == [True, True, False, True, True, True, True, False]
    assert big.table.overhead == {key: pytest.approx(900.0), only: pytest.approx(900.0)}
    for _ in range(4):                                  # target-only calls take far longer
        _call(big, 900.0, 5000.0)
    call_spec, call_only = _call_rates(big)
    assert call_spec > PLAN_MARGIN * call_only and _plan(big, 8, "L") == ""
    fresh = _planning_schedule(0.8)                     # no record: speculates
    assert _plan(fresh, 8, "L") == ""
    for seconds, speculates in ((300.0, True), (900.0, False)):
        shared = _planning_schedule(0.8)                # a speculative call's record only:
        shared.table.fold_overhead(key, seconds, 0.5)   # target-only pays it too (x1.07, x1.04)
        assert (_plan(shared, 8, "L") == "") == speculates


def test_overhead_needs_a_projection_and_track():
    """Nothing is folded before a projection exists (nothing pooled), or under track=0; a
    non-finite overhead is ignored, and a call that beat its projection (a negative one) is
    kept, its projected call rate bounded (``MIN_SHARE``)."""
    s = AdaptivePolicy(CANDS, reps=1)
    assert _plan(s, 8, "L") == ""                      # nothing pooled or timed
    s.observe(list(range(8)), 1, [0] * 8, 0.01)
    s.end(8)
    assert s.table.overhead == {}
    frozen = _planning_schedule(0.8, track=0.0)
    _plan(frozen, 8, "L")
    frozen.end(8, 1.0)
    assert frozen.table.overhead == {}
    s.table.fold_overhead(("k",), float("nan"), 0.5)
    assert s.table.overhead == {}
    s.table.fold_overhead(("k",), -5.0, 0.5)
    assert s.table.overhead == {("k",): -5.0}
    beat = _planning_schedule(0.8)
    beat.table.fold_overhead(("sampled", "L", 8, "spec"), -1e6, 0.5)
    assert _plan(beat, 8, "L") == ""                   # finite: the steps' tenth at least


def _law_by_definition(alphas, b):
    """P(commit k) = Π_{i<k} α_i · (1 − α_k), the rest on k = b; E[X] as ``expected_of``;
    Var[X] = Σ k²P(k) − (Σ k·P(k))², every sum in the order of k."""
    commit, run = [], 1.0
    for k in range(1, b):
        commit.append(run * (1.0 - alphas[k - 1]))
        run *= alphas[k - 1]
    commit.append(run)
    e1 = sum(k * p for k, p in enumerate(commit, 1))
    e2 = sum(k * k * p for k, p in enumerate(commit, 1))
    return commit, expected_of(alphas, b), max(e2 - e1 * e1, 0.0)


def test_block_law_family_equals_each_law_bit_for_bit():
    """The laws built in one pass over the slots, alone or as a family, equal the law's
    definition exactly (commit law, mean, variance), and a family's tail steps and spread
    equal each block's own law's; random chains included."""
    rng = random.Random(7)
    for _ in range(500):
        alphas = [rng.random() for _ in range(15)] if rng.random() < 0.9 else [1.0] * 15
        blocks = sorted(rng.sample([1, 2, 3, 4, 8, 16], rng.randint(1, 6)))
        for b, law in BlockLaw.family(alphas, blocks).items():
            ref, n = BlockLaw(alphas, b), rng.randint(1, 160)
            assert (law.block, law.commit, law.mean, law.var) == \
                (ref.block, ref.commit, ref.mean, ref.var) == (b, *_law_by_definition(alphas, b))
            assert (law.steps(n), law.spread(n)) == (ref.steps(n), ref.spread(n))


def test_a_replica_plans_every_call_as_the_call_it_copies():
    """Another engine compared with this one (graphs vs eager, backend vs backend) must run
    the same kind of call: a replica returns the copied call's plan, target-only or not."""
    s = _planning_schedule(0.1)
    plans = [_plan(s, 8, "L") for _ in range(3)]      # target-only, target-only, a probe
    assert plans[0] and plans[1] and plans[2] == ""
    r = s.replica()
    assert _plan(r, 8, "L") == "" and _plan(r, 1, "other") == ""
    _plan(s, 8, "L")
    r = s.replica()
    assert _plan(r, 8, "L") == s.call_plan.last != "" and _plan(r, 3, "M") == s.call_plan.last
