"""The call plan (``dflash2rt/engine/policy/call_plan.py``) against its definition in
docs/adaptive.md and the module's docstrings, with a stub projection (no schedule, no clock):
a kind's whole call is its tokens (each budget at least 1) at the projected step rate plus the
seconds its earlier calls took beyond their steps (a kind with no record takes the other's; the
call's seconds at least ``MIN_SHARE`` of its steps'); it speculates only if that beats
``PLAN_MARGIN`` × the target-only call's rate, else runs target-only with a speculative call
after 2, 4, 8, 8, ... of them (reset by a win); ``fold`` moves the planned kind's overhead
toward what the call took beyond its tokens at its kind's rate. Every expected value is
recomputed here in exact rationals."""

from __future__ import annotations

import math
import random
import re
from fractions import Fraction as F

import pytest

from dflash2rt.engine.policy import call_plan
from dflash2rt.engine.policy.call_plan import CallPlan
from dflash2rt.engine.policy.table import MeasuredTable

KEY = ("sampled", "L", 8)
SPEC, ONLY = (*KEY, "spec"), (*KEY, "target-only")
LOSE = (4, 10.0, 10.0)        # speculation projects no faster than target-only: never pays
WIN = (4, 30.0, 10.0)


class Proj:
    """A projection that answers ``value`` and records what it was asked."""

    def __init__(self, value):
        self.value, self.asked = value, []

    def __call__(self, rows, remaining):
        self.asked.append((rows, list(remaining)))
        return self.value


def test_documented_constants():
    """docs/adaptive.md: speculation must project 1.05 × target-only over the call; a call's
    seconds are at least a tenth of its steps'."""
    assert call_plan.PLAN_MARGIN == 1.05 and call_plan.MIN_SHARE == 0.1


def ref_call_rate(tokens, rate, overhead):
    """tokens / seconds, the seconds being the steps' (tokens at ``rate``) plus the overhead,
    but never under a tenth of the steps'."""
    steps = F(tokens) / F(rate)
    seconds = steps + F(overhead)
    if seconds < steps / 10:
        seconds = steps / 10
    return F(tokens) / seconds


def ref_rates(budgets, spec_rate, only_rate, rec_spec, rec_only):
    tokens = sum(n if n >= 1 else 1 for n in budgets)
    o_spec = rec_spec if rec_spec is not None else (rec_only if rec_only is not None else 0.0)
    o_only = rec_only if rec_only is not None else (rec_spec if rec_spec is not None else 0.0)
    return (ref_call_rate(tokens, spec_rate, o_spec), ref_call_rate(tokens, only_rate, o_only),
            o_spec, o_only)


NUM = r"([-+0-9.e]+|inf|nan)"
MESSAGE = re.compile(
    rf"target-only call: at bucket (\d+) \(([^)]*)\) the pooled acceptance and measured costs "
    rf"project {NUM} tokens/s target-only against {NUM} at block (\d+) over the call \(steps "
    rf"at {NUM} and {NUM} tokens/s, plus {NUM} s and {NUM} s as earlier calls took\); a "
    rf"speculative call after (\d+) more$")


def test_whole_call_rates_decide_and_the_message_says_them():
    """Random budgets (0 and 1 included), rates and overhead records (either kind, both or
    none; negative ones past the floor): the decision is the definition's, and a target-only
    call's message gives both call rates, the block, both step rates and both overheads."""
    rng = random.Random(11)
    seen = {True: 0, False: 0}
    for _ in range(600):
        budgets = [rng.choice([0, 1, 2, 3, rng.randint(1, 300)]) for _ in range(rng.randint(1, 9))]
        only_rate = rng.uniform(5.0, 50.0)
        spec_rate = only_rate * rng.uniform(0.5, 2.0)
        steps = sum(max(n, 1) for n in budgets) / only_rate
        recs = [None if rng.random() < 0.4 else rng.choice(
            [rng.uniform(-0.5, 3.0) * steps, -rng.uniform(0.85, 5.0) * steps])
            for _ in range(2)]
        t = MeasuredTable()
        for kind, rec in zip((SPEC, ONLY), recs):
            if rec is not None:
                t.overhead[kind] = rec
        block = rng.choice([2, 4, 8, 16])
        call_spec, call_only, o_spec, o_only = ref_rates(budgets, spec_rate, only_rate, *recs)
        ratio = call_spec / call_only
        if abs(ratio - F(105, 100)) < F(1, 10**6):
            continue                                      # ties: test_a_tie_runs_target_only
        got = CallPlan(t).plan(KEY, len(budgets), budgets, Proj((block, spec_rate, only_rate)),
                               True)
        speculates = ratio > F(105, 100)
        seen[speculates] += 1
        assert (got == "") == speculates, (budgets, spec_rate, only_rate, recs)
        if speculates:
            continue
        m = MESSAGE.match(got)
        assert m, got
        assert (int(m[1]), m[2], int(m[5]), int(m[10])) == (8, "sampled", block, 1)
        for text, want, digits in ((m[3], call_only, 4), (m[4], call_spec, 4),
                                   (m[6], only_rate, 4), (m[7], spec_rate, 4),
                                   (m[8], o_only, 3), (m[9], o_spec, 3)):
            assert float(text) == pytest.approx(float(want), rel=0.6 * 10 ** (1 - digits),
                                                abs=1e-300), (text, float(want))
    assert min(seen.values()) > 100


def test_a_tie_runs_target_only():
    """Speculation must beat the margin: a call projected exactly PLAN_MARGIN × target-only
    runs target-only, one just above it speculates."""
    assert 1.05 * 10.0 == 10.5 and 32 / (32 / 10.5) == 10.5 and 32 / (32 / 10.0) == 10.0
    assert CallPlan(MeasuredTable()).plan(KEY, 4, [8] * 4, Proj((2, 10.5, 10.0)), True) != ""
    above = math.nextafter(10.5, 11.0)
    assert 32 / (32 / above) > 10.5
    assert CallPlan(MeasuredTable()).plan(KEY, 4, [8] * 4, Proj((2, above, 10.0)), True) == ""


def ref_gaps(calls):
    """What ``calls`` losing calls plan: target-only runs of 2, 4, 8, 8, ... each followed by
    one speculative call; per call (speculates, target-only calls still to come before the
    next speculative one, the record after it)."""
    out, gap = [], 2
    while len(out) < calls:
        for i in range(gap):
            out.append((False, gap - i - 1, (i + 1, gap)))
        gap2 = gap * 2 if gap * 2 < 8 else 8
        out.append((True, None, (0, gap2)))
        gap = gap2
    return out[:calls]


def test_losing_calls_speculate_after_2_4_8_8():
    t = MeasuredTable()
    p = CallPlan(t)
    for speculates, more, record in ref_gaps(40):
        got = p.plan(KEY, 8, [64] * 8, Proj(LOSE), True)
        assert (got == "") == speculates and p.last == got
        if not speculates:
            assert got.endswith(f"a speculative call after {more} more")
        assert t.calls[KEY] == record
    assert ("other", "L", 8) not in t.calls


def test_a_win_drops_the_record_and_the_gaps_start_again():
    t = MeasuredTable()
    p = CallPlan(t)
    plans = [p.plan(KEY, 8, [64] * 8, Proj(LOSE), True) for _ in range(5)]
    assert [x == "" for x in plans] == [False, False, True, False, False]
    t.calls[("other", "L", 8)] = (1, 8)
    assert p.plan(KEY, 8, [64] * 8, Proj(WIN), True) == "" and KEY not in t.calls
    assert t.calls[("other", "L", 8)] == (1, 8)
    again = [p.plan(KEY, 8, [64] * 8, Proj(LOSE), True) == "" for _ in range(4)]
    assert again == [False, False, True, False] and t.calls[KEY] == (1, 4)


@pytest.mark.parametrize("why", ["not learning", "disabled", "no rows", "no projection"])
def test_calls_that_are_not_planned_speculate_and_keep_the_record(why):
    t = MeasuredTable()
    t.calls[KEY] = (1, 4)
    p = CallPlan(t, enabled=why != "disabled")
    proj = Proj(None if why == "no projection" else LOSE)
    rows = 0 if why == "no rows" else 3
    got = p.plan(KEY, rows, [64] * rows, proj, why != "not learning")
    assert got == "" == p.last and t.calls == {KEY: (1, 4)}
    assert proj.asked == ([(3, [64] * 3)] if why == "no projection" else [])


def test_one_row_is_planned():
    t = MeasuredTable()
    p = CallPlan(t)
    assert p.plan(("greedy", None, 1), 1, [40], Proj(LOSE), True).startswith("target-only")
    assert t.calls == {("greedy", None, 1): (1, 2)}


def test_fold_moves_the_planned_kinds_overhead():
    """The call's seconds beyond its tokens at its kind's rate (asked of the projection again,
    for the planned rows and budgets), ``track`` of the way; the first sets it."""
    t = MeasuredTable()
    p = CallPlan(t)
    assert p.plan(KEY, 2, [50, 30], Proj(LOSE), True) != ""           # target-only
    later = Proj((4, 25.0, 8.0))
    p.fold(80, 20.0, later, 0.5)
    assert later.asked == [(2, [50, 30])]
    assert t.overhead == {ONLY: pytest.approx(20.0 - 80 / 8.0)}
    assert p.plan(KEY, 2, [50, 30], Proj(LOSE), True) != ""
    p.fold(80, 30.0, later, 0.5)
    assert t.overhead == {ONLY: pytest.approx(10.0 + 0.5 * ((30.0 - 10.0) - 10.0))}
    for project in (Proj(WIN), Proj(None)):                       # a win; nothing projected
        p = CallPlan(t)
        assert p.plan(KEY, 2, [50, 30], project, True) == ""
        p.fold(80, 12.0, later, 1.0)
        assert t.overhead[SPEC] == pytest.approx(12.0 - 80 / 25.0)
        del t.overhead[SPEC]


def test_a_probe_call_folds_as_speculative():
    t = MeasuredTable()
    p = CallPlan(t)
    for _ in range(2):
        assert p.plan(KEY, 8, [64] * 8, Proj(LOSE), True) != ""
    assert p.plan(KEY, 8, [64] * 8, Proj(LOSE), True) == ""             # the probe
    p.fold(512, 60.0, Proj((4, 16.0, 10.0)), 0.5)
    assert t.overhead == {SPEC: pytest.approx(60.0 - 512 / 16.0)}


@pytest.mark.parametrize("case", ["zero seconds", "negative seconds", "folded twice", "forgot",
                                  "no projection now", "not planned", "replayed"])
def test_fold_folds_nothing(case):
    t = MeasuredTable()
    p = CallPlan(t, replay="x" if case == "replayed" else None)
    if case == "not planned":
        p.plan(KEY, 8, [64] * 8, Proj(LOSE), False)
    else:
        p.plan(KEY, 8, [64] * 8, Proj(LOSE), True)
    now = Proj(None if case == "no projection now" else WIN)
    seconds = {"zero seconds": 0.0, "negative seconds": -1.0}.get(case, 5.0)
    if case == "folded twice":
        p.fold(512, 5.0, now, 0.5)
        t.overhead.clear()
    if case == "forgot":
        p.forget()
    p.fold(512, seconds, now, 0.5)
    assert t.overhead == {}


def test_fold_takes_short_calls():
    """Any positive call seconds are folded, under a second too."""
    t = MeasuredTable()
    p = CallPlan(t)
    p.plan(KEY, 1, [4], Proj(LOSE), True)
    p.fold(4, 0.5, Proj(LOSE), 0.5)
    assert t.overhead == {ONLY: pytest.approx(0.5 - 4 / 10.0)}


def test_a_replica_repeats_the_last_plan_and_learns_nothing():
    t = MeasuredTable()
    p = CallPlan(t, enabled=False)
    assert p.replica(MeasuredTable()).plan(KEY, 8, [64] * 8, Proj(WIN), True) == ""
    p = CallPlan(t)
    said = p.plan(KEY, 8, [64] * 8, Proj(LOSE), True)
    own = MeasuredTable()
    r = p.replica(own)
    assert r.table is own and r.enabled and said != ""
    proj = Proj(WIN)
    for key, rows in ((KEY, 8), (("greedy", None, 1), 1)):
        assert r.plan(key, rows, [64] * rows, proj, True) == said
    assert r.last == "" and proj.asked == [] and own.calls == {}
    r.fold(512, 9.0, proj, 0.5)
    assert own.overhead == {} and proj.asked == []
    p.plan(KEY, 8, [64] * 8, Proj(WIN), True)
    assert r.plan(KEY, 8, [64] * 8, proj, True) == said
    assert p.replica(own).plan(KEY, 8, [64] * 8, proj, True) == ""
