"""``AdaptivePolicy`` (``dflash2rt/engine/policy/adaptive.py``) against its docstrings and
docs/adaptive.md, with fixed costs or synthetic seconds and a seeded ``CostNoise`` twin (never
the clock): the batch's mode and law from its requests; ``start``'s call (speculative or
planned target-only, its room, the plan asked with the call's key and whether the policy
learns); a planned call's steps target-only and unobserved; the noise on every timing it
learns from; the call's tokens and seconds folded into the plan unless ``track`` is 0;
calibration of the batch's bucket and every smaller one, each block timed after an untimed
step of its own; every decision passed through ``agree``."""

from __future__ import annotations

import itertools
import random

import pytest

from dflash2rt.engine.policy import Call, Live
from dflash2rt.engine.policy.adaptive import AdaptivePolicy, law_of, mode_of
from dflash2rt.engine.policy.call_plan import CallPlan
from dflash2rt.engine.policy.schedule import AdaptiveSchedule
from dflash2rt.engine.policy.table import PERTURB_ENV, CostNoise
from dflash2rt.engine.request import Request, SamplingParams

CANDS = (1, 2, 4, 8)
COSTS = {1: 1.0, 2: 1.6, 4: 1.8, 8: 2.2}       # speculation pays at the prior


def _req(temperature=0.0, top_p=1.0, top_k=0, cands=None, budget=16, rule="token"):
    return Request((1, 2), SamplingParams(max_new_tokens=budget, temperature=temperature,
                                          top_p=top_p, top_k=top_k, num_candidates=cands,
                                          verification=rule))


def ref_mode(reqs):
    base = "greedy"
    for q in reqs:
        if q.params.temperature > 0:
            base = "sampled"
    if "block" in [q.params.verification for q in reqs]:
        base += ", block verification"
    counts = sorted({q.params.num_candidates for q in reqs} - {None})
    if not counts:
        return base
    trained = ["trained"] if any(q.params.num_candidates is None for q in reqs) else []
    return base + ", candidates " + " ".join([str(c) for c in counts] + trained)


def ref_law(reqs):
    first = reqs[0].params
    one = (first.temperature, first.top_p, first.top_k)
    if first.num_candidates is not None:
        one += (first.num_candidates,)
    if first.verification == "block" and first.temperature != 0:
        one += ("block",)
    for q in reqs[1:]:
        p = q.params
        mine = (p.temperature, p.top_p, p.top_k)
        if p.num_candidates is not None:
            mine += (p.num_candidates,)
        if p.verification == "block" and p.temperature != 0:
            mine += ("block",)
        if mine != one:
            return "mixed"
    return one


def test_mode_and_law_of_a_batch():
    rng = random.Random(1)
    kinds = [dict(), dict(temperature=0.5), dict(temperature=1.0), dict(temperature=1.5),
             dict(temperature=1.0, top_p=0.9), dict(top_k=5), dict(cands=8), dict(cands=32),
             dict(temperature=0.7, cands=4), dict(rule="block"),
             dict(temperature=1.0, rule="block"), dict(temperature=0.7, cands=4, rule="block")]
    for _ in range(300):
        reqs = [_req(**rng.choice(kinds)) for _ in range(rng.randint(1, 4))]
        assert mode_of(reqs) == ref_mode(reqs)
        assert law_of(reqs) == ref_law(reqs)
    one = [_req(temperature=0.5, cands=3)]
    assert (mode_of(one), law_of(one)) == ("sampled, candidates 3", (0.5, 1.0, 0, 3))
    assert mode_of([_req(cands=8), _req(cands=2), _req()]) == "greedy, candidates 2 8 trained"
    assert (mode_of([_req(temperature=1.0, rule="block")]),
            law_of([_req(temperature=1.0, rule="block")])) == \
        ("sampled, block verification", (1.0, 1.0, 0, "block"))
    assert law_of([_req(rule="block"), _req()]) == (0.0, 1.0, 0)     # greedy: one law


class Plan(CallPlan):
    """A call plan answering ``answer`` and recording what it is asked."""

    def __init__(self, table, answer=""):
        super().__init__(table)
        self.answer, self.asked, self.folds, self.forgot = answer, [], [], 0

    def plan(self, key, rows, remaining, project, learning):
        self.asked.append((key, rows, list(remaining), project, learning))
        self.last = self.answer
        return self.answer

    def fold(self, tokens, seconds, project, track):
        self.folds.append((tokens, seconds, project, track))

    def forget(self):
        self.forgot += 1


class Spy(AdaptiveSchedule):
    """A schedule recording its choices and observations."""

    def __init__(self, *a, **kw):
        self.chosen, self.seen = [], []
        super().__init__(*a, **kw)

    def choose(self, rows, remaining=None):
        b = super().choose(rows, remaining)
        self.chosen.append((list(rows), list(remaining), b))
        return b

    def observe(self, rows, block, accepted, seconds=None):
        self.seen.append((list(rows), block, list(accepted), seconds))
        super().observe(rows, block, accepted, seconds)


def _no_probe(k):
    raise AssertionError("calibrated")


@pytest.mark.parametrize("answer", ["", "target-only call: why"])
def test_start_makes_the_call_its_plan_says(answer):
    s = Spy(CANDS, COSTS)
    p = AdaptivePolicy.of(s, Plan(s.table, answer))
    noise = CostNoise("3")
    call = p.start("sampled", "L", 5, [7, 9, 11, 13, 15], noise)
    assert call == Call(answer == "", 1 if answer else 8, True, answer, noise.describe())
    assert p.call_plan.asked == [(("sampled", "L", 8), 5, [7, 9, 11, 13, 15], s.project, False)]
    assert (s.mode, s.law) == ("sampled", "L")
    assert p.start("greedy", None, 1, [4]) == Call(answer == "", 1 if answer else 8, True,
                                                   answer, "")


@pytest.mark.parametrize("costs,track,learns", [(None, None, True), (None, 1.0, True),
                                                (None, 0.3, True), (None, 0.0, False),
                                                (COSTS, None, False), (COSTS, 0.5, False)])
def test_the_plan_learns_only_over_a_measured_tracking_table(costs, track, learns):
    s = AdaptiveSchedule(CANDS, costs, track=track)
    p = AdaptivePolicy.of(s, Plan(s.table))
    p.start("greedy", None, 2, [8, 8])
    assert p.call_plan.asked[0][4] is learns


def test_the_call_plan_is_on_unless_ablated():
    assert AdaptivePolicy(CANDS, COSTS).call_plan.enabled
    assert not AdaptivePolicy(CANDS, COSTS, without={"call_plan"}).call_plan.enabled
    s = AdaptiveSchedule(CANDS, COSTS)
    assert AdaptivePolicy.of(s).call_plan.enabled and AdaptivePolicy.of(s).call_plan.table is \
        s.table
    off = AdaptiveSchedule(CANDS, COSTS, without={"call_plan"})
    assert not AdaptivePolicy.of(off).call_plan.enabled
    mine = CallPlan(s.table, enabled=False)
    assert AdaptivePolicy.of(s, mine).call_plan is mine


def test_a_planned_call_steps_target_only_and_observes_nothing():
    s = Spy(CANDS, COSTS)
    p = AdaptivePolicy.of(s, Plan(s.table, "target-only call"))
    p.start("greedy", None, 2, [9, 9])
    assert p.choose(Live([0, 1], [9, 9], _no_probe)) == 1
    p.observe([0, 1], 1, [0, 0], 0.25)
    assert s.chosen == [] and s.seen == []


def test_a_speculative_call_takes_the_schedule_s_choice():
    s = Spy(CANDS, COSTS)
    p = AdaptivePolicy.of(s, Plan(s.table))
    assert p.choose(Live([0], [30], _no_probe)) == 8             # no call begun: per step
    p.start("greedy", None, 2, [30, 20])
    assert p.choose(Live([0, 1], [30, 20], _no_probe)) == 8
    p.observe([0, 1], 8, [0, 0], 0.5)
    assert s.chosen == [([0], [30], 8), ([0, 1], [30, 20], 8)]
    assert s.seen == [([0, 1], 8, [0, 0], 0.5)]


def test_agree_passes_every_decision():
    """A tensor-parallel run makes the plan, what to calibrate and each block rank 0's."""
    seen = []

    def rank0(value):
        seen.append(value)
        return {8: 4, "": "rank 0 says target-only"}.get(value, value) \
            if not isinstance(value, list) else value
    s = AdaptiveSchedule(CANDS, COSTS)
    p = AdaptivePolicy.of(s, Plan(s.table), agree=rank0)
    call = p.start("greedy", None, 1, [20])
    assert not call.spec and call.plan == "rank 0 says target-only" and seen == [""]
    assert p.choose(Live([0], [20], _no_probe)) == 1
    s2 = AdaptiveSchedule(CANDS, COSTS)
    q = AdaptivePolicy.of(s2, Plan(s2.table, "x"), agree=lambda v: "" if v == "x" else
                          (4 if v == 8 else v))
    assert q.start("greedy", None, 1, [20]).spec
    assert q.choose(Live([0], [20], _no_probe)) == 4


def _noisy_policy(track=None):
    s = Spy(CANDS, reps=1, track=track)
    p = AdaptivePolicy.of(s, Plan(s.table))
    for b in CANDS:
        for k in (1, 2, 4):
            s.measure(b, k, 0.01 * b)
    return s, p


def test_noise_distorts_each_step_and_the_call_s_seconds():
    s, p = _noisy_policy()
    noise, twin = CostNoise("5"), CostNoise("5")
    p.start("sampled", "L", 3, [30] * 3, noise)
    p.observe([0, 1, 2], 4, [1, 2, 3], 0.5)
    p.observe([0, 1], 4, [0, 3], None)
    p.observe([0], 2, [1], 0.25)
    assert s.seen == [([0, 1, 2], 4, [1, 2, 3], twin.step(0.5, 4, 4, "sampled")),
                      ([0, 1], 4, [0, 3], None), ([0], 2, [1], twin.step(0.25, 2, 1, "sampled"))]
    p.end(40, 3.0)
    assert p.call_plan.folds == [(40, twin.call(3.0), s.project, 0.5)]
    p.start("sampled", "L", 1, [30])                         # no noise for this call
    p.observe([0], 2, [1], 0.125)
    p.end(9, 2.0)
    assert s.seen[-1][3] == 0.125 and p.call_plan.folds[-1][:2] == (9, 2.0)


def test_end_folds_what_the_steps_made_unless_told():
    s, p = _noisy_policy(track=1.0)
    noise, twin = CostNoise("8"), CostNoise("8")
    p.start("greedy", None, 2, [30, 30], noise)
    p.observe([0, 1], 4, [2, 3], 0.5)
    made = (2 + 3 + 2, twin.step(0.5, 4, 2, "greedy"))
    p.end()                                                   # both from the steps, as timed
    assert p.call_plan.folds == [(made[0], made[1], s.project, 1.0)]
    for tokens, seconds in ((None, 4.0), (11, None)):
        p.start("greedy", None, 2, [30, 30], noise)
        p.observe([0, 1], 4, [2, 3], 0.5)
        made = (7, twin.step(0.5, 4, 2, "greedy"))
        p.end(tokens, seconds)
        want = (made[0] if tokens is None else tokens,
                made[1] if seconds is None else twin.call(seconds))
        assert p.call_plan.folds[-1][:2] == want
    assert p.call_plan.forgot == 0


def test_a_call_that_learns_nothing_folds_nothing():
    s = Spy(CANDS, COSTS)                                  # fixed: track 0
    p = AdaptivePolicy.of(s, Plan(s.table))
    p.start("greedy", None, 1, [10])
    p.end(10, 1.0)
    assert p.call_plan.folds == [] and p.call_plan.forgot == 1


class Probe:
    """A live batch's probe: records (bucket, block) of every step it times; seconds from a
    counter, so the timed step of each pair is known."""

    def __init__(self, rows):
        self.rows, self.log, self.clock = rows, [], itertools.count(1)

    def __call__(self, k):
        assert self.rows[:k]                               # the batch's first k rows

        def time_step(b):
            self.log.append((k, b))
            return 0.001 * next(self.clock)
        return time_step


def ref_calibration(buckets, todo):
    """Per bucket still lacking a block (halving from the batch's): each block stepped twice,
    the second timed."""
    steps, measured, t = [], {}, 0
    for k in buckets:
        for b in todo.get(k, ()):
            steps += [(k, b), (k, b)]
            t += 2
            measured[(b, k)] = 0.001 * t
    return steps, measured


@pytest.mark.parametrize("rows,timed", [(5, {}), (8, {4: CANDS}), (3, {1: CANDS, 2: (1, 2)}),
                                        (1, {}), (16, {16: CANDS, 4: CANDS, 2: CANDS})])
def test_calibration_times_the_bucket_and_every_smaller_one(rows, timed):
    s = AdaptiveSchedule(CANDS, reps=1)
    s.begin("sampled", "L")
    for k, blocks in timed.items():
        for b in blocks:
            s.measure(b, k, 9.0)
    p = AdaptivePolicy.of(s)
    probe = Probe(list(range(rows)))
    p.calibrate(Live(list(range(rows)), [30] * rows, probe))
    buckets, k = [], 1
    while k < rows:
        k *= 2
    while k >= 1:
        buckets.append(k)
        k //= 2
    todo = {k: [b for b in CANDS if b not in timed.get(k, ())] for k in buckets}
    steps, measured = ref_calibration(buckets, todo)
    assert probe.log == steps
    for k in buckets:
        for b in CANDS:
            want = [9.0] if b in timed.get(k, ()) else [pytest.approx(measured[(b, k)])]
            assert s.table.samples[(b, k, "sampled")] == want
    probe.log.clear()
    p.calibrate(Live(list(range(rows)), [30] * rows, _no_probe))   # nothing left to time


def test_calibration_under_noise_and_ahead_of_a_call(monkeypatch):
    monkeypatch.setenv(PERTURB_ENV, "calib-7")
    twin = CostNoise("calib-7")
    s = AdaptiveSchedule((1, 4), reps=1)
    p = AdaptivePolicy.of(s)
    reqs = [_req(temperature=1.0), _req(temperature=1.0)]
    probe = Probe([0, 1])
    p.calibrate_ahead(reqs, Live([0, 1], [16, 16], probe))
    assert (s.mode, s.law) == ("sampled", (1.0, 1.0, 0))
    assert p.noise is not None and p.noise.seed == "calib-7"
    want = {}
    for t, (k, b) in enumerate(probe.log, 1):
        if t % 2 == 0:
            want[(b, k, "sampled")] = [twin.step(0.001 * t, b, k, "sampled")]
    assert len(probe.log) == 8 and s.table.samples == want
    call = p.begin(reqs)
    assert call.cost_noise == twin.describe() and call.adaptive and call.room == 4
    fixed = AdaptivePolicy(CANDS, COSTS)
    assert fixed.begin(reqs).cost_noise == "" and fixed.noise is None
    monkeypatch.delenv(PERTURB_ENV)
    assert AdaptivePolicy((1, 4), reps=1).begin(reqs).cost_noise == ""


def test_begin_passes_the_requests_mode_law_and_budgets():
    s = AdaptiveSchedule(CANDS, COSTS)
    p = AdaptivePolicy.of(s, Plan(s.table))
    reqs = [_req(temperature=0.5, budget=5), _req(temperature=0.5, budget=12),
            _req(temperature=0.5, budget=3)]
    p.begin(reqs)
    assert p.call_plan.asked[0][:3] == (("sampled", (0.5, 1.0, 0), 4), 3, [5, 12, 3])


def test_a_replica_plans_as_the_last_call():
    s = AdaptiveSchedule(CANDS, COSTS)
    p = AdaptivePolicy.of(s, Plan(s.table, "target-only call: copied"))
    p.start("greedy", None, 4, [9] * 4)
    r = p.replica()
    assert r.call_plan.replay == "target-only call: copied"
    call = r.start("sampled", "other", 2, [5, 5])
    assert not call.spec and call.plan == "target-only call: copied"
