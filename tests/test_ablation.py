"""Each adaptive mechanism can be switched off (``AdaptivePolicy(without=...)``, for
ablations; docs/adaptive.md says what replaces each one), and switching it off changes a
decision in a constructed scenario. Every scenario decides from fixed costs or synthetic
timings, never from this machine's speed."""

from __future__ import annotations

import pytest

from dflash2rt.engine.policy import Live
from dflash2rt.engine.policy.adaptive import AdaptivePolicy
from dflash2rt.engine.policy.schedule import ABLATIONS
from dflash2rt.errors import InvalidInputError

CHEAP = {1: 1.0, 2: 1.6, 4: 1.8, 8: 2.2}       # speculation pays at the prior (α = 0.8)
DEAR = {1: 1.0, 8: 9.0}                        # it does not


def _live(rows, remaining=None, probe=None):
    def no_probe(k):
        raise AssertionError("a policy with a fixed or timed table calibrated")
    return Live(list(rows), list(remaining or [100] * len(rows)), probe or no_probe)


def _choices(without, make, drive):
    """``drive(policy)`` under everything on and with ``without`` off."""
    return drive(make(frozenset())), drive(make(frozenset({without})))


def test_every_mechanism_is_named_and_unknown_names_are_refused():
    assert ABLATIONS == {"row_alpha", "row_scale", "pooled_prior", "cost_table", "drift",
                         "finish_rule", "call_plan", "probes", "calibration"}
    with pytest.raises(InvalidInputError, match="unknown mechanisms"):
        AdaptivePolicy((1, 8), CHEAP, without={"prior"})


def test_without_row_alpha_a_row_is_judged_by_the_prior_alone():
    def drive(p):
        p.start("greedy", None, 1, [100])
        for _ in range(4):                           # this row keeps rejecting slot 1
            p.observe([0], 8, [0])
        return p.choose(_live([0]))
    assert _choices("row_alpha", lambda w: AdaptivePolicy((1, 2, 4, 8), CHEAP, without=w),
                    drive) == (1, 8)


def test_without_row_scale_one_rejection_weighs_on_its_slot_alone():
    """A pool says every slot accepts 0.9; a batch of 4 rows on block 8's costs each had one
    step, one of them rejecting slot 1. With the row scale that row is a little below the
    pool on every slot and the batch keeps speculating; without, its slot 1 is halved and the
    finish rule, which prices the batch by its slowest row, steps target-only."""
    costs = {1: 1.0, 2: 1.6, 4: 2.2, 8: 3.4}

    def drive(p):
        p.table.fold_accept("greedy", "L", ([90.0] * 7, [100.0] * 7))
        p.start("greedy", "L", 4, [40] * 4)
        p.observe([0, 1, 2, 3], 8, [0, 7, 7, 7])
        return p.choose(_live([0, 1, 2, 3], [40] * 4))
    got, without = _choices("row_scale", lambda w: AdaptivePolicy(
        (1, 2, 4, 8), costs, without=w | {"call_plan"}), drive)
    assert got > 1 and without == 1


def test_without_pooled_prior_a_new_row_starts_from_the_fixed_prior():
    def drive(p):
        p.table.fold_accept("greedy", "L", ([0.0] * 7, [100.0] * 7))   # earlier calls: α 0
        p.start("greedy", "L", 1, [100])
        return p.choose(_live([0]))
    assert _choices("pooled_prior", lambda w: AdaptivePolicy((1, 2, 4, 8), CHEAP, without=w),
                    drive) == (1, 8)


def test_without_cost_table_every_step_costs_the_same():
    def drive(p):
        p.start("greedy", None, 1, [100])
        return p.choose(_live([0]))
    assert _choices("cost_table", lambda w: AdaptivePolicy((1, 8), DEAR, without=w),
                    drive) == (1, 8)


def _timed(without):
    """A measured policy timed by hand at bucket 1: block 1 at 1 s, block 8 at 2 s, and the
    table's observed cost of block 8 four times its calibration (the machine slowed down)."""
    p = AdaptivePolicy((1, 8), reps=1, without=without)
    p.schedule.begin("greedy")
    p.schedule.measure(1, 1, 1.0)
    p.schedule.measure(8, 1, 2.0)
    p.table.observed[(8, 1, "greedy")] = 8.0
    return p


def test_without_drift_an_unobserved_entry_keeps_its_calibration():
    def drive(p):
        p.start("greedy", None, 1, [100])
        return p.choose(_live([0]))
    # drift: target-only's entry follows block 8's (x4), so block 8 still pays; without, it
    # stays at its calibrated 1 s and wins
    assert _choices("drift", _timed, drive) == (8, 1)


def test_without_finish_rule_the_rate_rule_decides_the_last_token():
    def drive(p):
        p.start("greedy", None, 1, [1])
        return p.choose(_live([0], [1]))             # one token left
    assert _choices("finish_rule", lambda w: AdaptivePolicy((1, 8), {1: 1.0, 8: 2.0},
                                                            without=w), drive) == (1, 8)


def test_without_call_plan_every_call_speculates():
    def make(without):
        p = AdaptivePolicy((1, 2, 4, 8), reps=1, without=without)
        p.schedule.begin("sampled", "L")
        for b, sec in ((1, 1.0), (2, 1.9), (4, 2.2), (8, 2.8)):
            p.schedule.measure(b, 8, sec)
        p.table.fold_accept("sampled", "L", ([10.0] * 7, [100.0] * 7))   # acceptance 0.1
        return p

    def drive(p):
        call = p.start("sampled", "L", 8, [128] * 8)
        return call.spec, bool(call.plan)
    assert _choices("call_plan", make, drive) == ((False, True), (True, False))


def test_without_probes_target_only_steps_never_try_speculation_again():
    def drive(p):
        p.start("greedy", None, 1, [100])
        out = []
        for _ in range(6):
            out.append(p.choose(_live([0])))
            p.observe([0], out[-1], [0])
        return out
    got, without = _choices("probes", lambda w: AdaptivePolicy((1, 8), DEAR, without=w), drive)
    assert got == [1, 1, 1, 1, 8, 1] and without == [1] * 6


def test_without_calibration_untimed_blocks_cost_what_the_call_knows():
    timed = []

    def probe(k):
        def time_step(block):
            timed.append(block)
            return DEAR[block]                       # synthetic seconds
        return time_step

    def drive(p):
        timed.clear()
        p.start("greedy", None, 1, [100])
        return p.choose(_live([0], probe=probe)), sorted(set(timed))
    assert _choices("calibration", lambda w: AdaptivePolicy((1, 8), reps=1, without=w),
                    drive) == ((1, [1, 8]), (8, []))


def test_default_is_everything_on():
    p = AdaptivePolicy((1, 8), CHEAP)
    assert p.without == frozenset() and p.call_plan.enabled
