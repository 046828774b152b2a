"""The per-step rule (``AdaptiveSchedule``, engine/policy/schedule.py) against its definitions
in docs/adaptive.md and its docstrings, written out here: a step of block b proposes b − 1
drafts, so with a accepted it reaches slots 1 .. min(a + 1, b − 1) (target-only steps teach
nothing); each row's reached slots forget by ``decay`` then count the step, and the call's
undecayed counts are what ``end`` pools (a fixed table pools nothing unless asked to track);
``end`` returns the tokens (accepted + one per row) and seconds of the steps observed with
seconds since the call began. Choices: the best score, ties to the smaller block; after
``probe`` (4) target-only steps in a row a probe of the best speculative block (ties to the
smaller), the gap doubling up to ``max_probe`` (64) while the target-only steps go on, and
back to ``probe`` once speculation wins. The finish rule's score is the batch's tokens over
the seconds until its slowest row is done, each stretch priced at the bucket of the rows still
live. The "cost_table" ablation costs every step 1.0; "calibration" prices an untimed entry as
the cheapest one the call knows at that bucket and mode (1.0 when none). ``project`` answers
None without a speculative candidate or without a pooled slot 1."""

from __future__ import annotations

import pytest

from dflash2rt.engine.policy.acceptance import ROW_WEIGHT
from dflash2rt.engine.policy.schedule import ABLATIONS, AdaptiveSchedule
from dflash2rt.engine.policy.table import MeasuredTable
from dflash2rt.errors import InvalidInputError

EQUAL = {1: 1.0, 2: 1.0, 4: 1.0}


def ref_chained(acc, seen, prior, weight):
    """docs/adaptive.md: each slot's counts against ``weight`` pseudo-observations of the
    previous slot's estimate (slot 1: the prior)."""
    out, prev = [], prior
    for hit, n in zip(acc, seen):
        prev = (hit + weight * prev) / (n + weight)
        out.append(prev)
    return out


def ref_counts(steps, slots, decay):
    """Each row's decayed (accepted, reached) per slot and the call's undecayed ones, from
    steps (block, accepted) of one row."""
    acc, seen = [0.0] * slots, [0.0] * slots
    pooled_acc, pooled_seen = [0.0] * slots, [0.0] * slots
    for block, a in steps:
        if block < 2:
            continue
        for slot in range(1, min(a + 1, block - 1) + 1):
            j = slot - 1
            acc[j] = decay * acc[j] + (1.0 if slot <= a else 0.0)
            seen[j] = decay * seen[j] + 1.0
            pooled_acc[j] += 1.0 if slot <= a else 0.0
            pooled_seen[j] += 1.0
    return acc, seen, pooled_acc, pooled_seen


STEPS = [(2, 1), (4, 3), (1, 0), (4, 1), (2, 0), (4, 0), (4, 2), (2, 1), (4, 3)]


@pytest.mark.parametrize("upto", range(1, len(STEPS) + 1))
def test_a_rows_estimates_count_the_slots_its_steps_reached(upto):
    s = AdaptiveSchedule((1, 2, 4), EQUAL, decay=0.75)
    s.begin("greedy")
    for block, a in STEPS[:upto]:
        s.observe(["r"], block, [a])
    acc, seen, _, _ = ref_counts(STEPS[:upto], 3, 0.75)
    assert s.alphas("r", 3) == pytest.approx(ref_chained(acc, seen, 0.8, 1.0), rel=1e-12)
    assert s.alphas("fresh", 3) == pytest.approx([0.8] * 3)


def test_slot_zero_is_the_prior():
    s = AdaptiveSchedule((1, 2, 4), EQUAL, prior=0.3)
    s.begin("greedy")
    s.observe(["r"], 4, [0])
    assert s.alpha("r", 0) == 0.3


def test_a_pool_with_slot_one_known_scales_its_profile_by_the_rows_factor():
    table = MeasuredTable()
    table.fold_accept("greedy", "L", ([6.0, 1.0], [10.0, 2.0]))      # slot 1: 0.6, slot 2: -
    s = AdaptiveSchedule((1, 2, 4), EQUAL, table=table)
    s.begin("greedy", "L")
    steps = [(4, 3), (4, 0), (2, 1)]
    for block, a in steps:
        s.observe(["r"], block, [a])
    acc, seen, _, _ = ref_counts(steps, 3, 0.9)
    factor = (sum(acc) + ROW_WEIGHT) / (sum(n * 0.6 for n in seen) + ROW_WEIGHT)
    assert s.alphas("r", 3) == pytest.approx([min(0.6 * factor, 0.99)] * 3, rel=1e-12)


@pytest.mark.parametrize("candidates", [(1, 2, 4), (1, 2, 8), (1, 4)])
def test_end_pools_the_calls_undecayed_counts(candidates):
    table = MeasuredTable()
    s = AdaptiveSchedule(candidates, table=table)                    # measured: tracks
    s.begin("sampled", "L")
    steps = [(2, [1, 0]), (4, [3, 0]), (1, [0, 0]), (4, [1, 2]), (2, [0, 1]), (4, [3, 3])]
    for block, accepted in steps:
        s.observe(["a", "b"], block, [min(a, block - 1) for a in accepted])
    slots = max(candidates) - 1
    want_acc, want_seen = [0.0] * slots, [0.0] * slots
    for r in range(2):
        _, _, acc, seen = ref_counts([(b, min(a[r], b - 1)) for b, a in steps], slots, 0.9)
        want_acc = [x + y for x, y in zip(want_acc, acc)]
        want_seen = [x + y for x, y in zip(want_seen, seen)]
    s.end()
    acc, seen = table.accept[("sampled", "L")]
    pad = [0.0] * slots
    assert ((acc + pad)[:slots], (seen + pad)[:slots]) == (want_acc, want_seen)


def test_a_fixed_table_pools_nothing_unless_asked_to_track():
    for track, pooled in ((None, False), (0.5, True)):
        table = MeasuredTable()
        s = AdaptiveSchedule((1, 2, 4), EQUAL, table=table, track=track)
        s.begin("greedy")
        s.observe(["r"], 4, [2], 0.5)
        s.end()
        assert bool(table.accept) is pooled, track


@pytest.mark.parametrize("track", [None, 0.5])
def test_end_returns_the_tokens_and_seconds_of_the_steps_observed_with_seconds(track):
    s = AdaptiveSchedule((1, 2, 4), EQUAL, track=track)
    s.begin("greedy")
    s.observe(["a", "b"], 4, [3, 1], 0.5)          # 4 + 2 tokens
    s.observe(["a", "b"], 1, [0, 0], 0.25)         # 2
    s.observe(["a"], 2, [1])                       # no seconds: not counted
    s.observe(["a"], 2, [0], 0.125)                # 1
    assert s.end() == (9.0, 0.875)
    assert s.end() == (0.0, 0.0)                   # drained
    s.begin("greedy")
    s.observe(["c"], 4, [2], 2.0)
    assert s.end() == (3.0, 2.0)


def run_lengths(choices):
    """The lengths of the runs of target-only choices between speculative ones."""
    out, n = [], 0
    for b in choices:
        if b == 1:
            n += 1
        else:
            out.append(n)
            n = 0
    return out


def test_probes_come_after_4_target_only_steps_then_double_up_to_64():
    s = AdaptiveSchedule((1, 2, 4), {1: 1.0, 2: 5.0, 4: 9.0})       # speculation never pays
    s.begin("greedy")
    want = [4, 8, 16, 32, 64, 64, 64]
    choices = [s.choose(["r"]) for _ in range(sum(want) + len(want))]
    assert run_lengths(choices) == want
    assert set(choices) == {1, 2}                                     # the best probe: 2


def test_the_probe_gap_starts_again_once_speculation_wins():
    s = AdaptiveSchedule((1, 2, 4), {1: 1.0, 2: 1.5, 4: 2.0})
    s.begin("greedy")
    for _ in range(3):
        s.observe(["bad"], 4, [0])                  # a row that speculation no longer pays
        s.observe(["good"], 4, [3])
    bad = [s.choose(["bad"]) for _ in range(4 + 1 + 8 + 1 + 3)]
    assert run_lengths(bad) == [4, 8]
    assert s.choose(["good"]) > 1                   # speculation wins
    bad = [s.choose(["bad"]) for _ in range(4 + 1 + 8 + 1)]
    assert run_lengths(bad) == [4, 8]               # the gaps start again


def test_ties_go_to_the_smaller_block_and_so_does_a_tied_probe():
    s = AdaptiveSchedule((1, 2, 4), EQUAL, prior=0.0)               # every block commits one
    s.begin("greedy")
    assert [s.choose(["r"]) for _ in range(5)] == [1, 1, 1, 1, 2]


def test_a_probe_with_one_speculative_block_takes_it():
    s = AdaptiveSchedule((1, 2), {1: 1.0, 2: 9.0})
    s.begin("greedy")
    assert [s.choose(["r"]) for _ in range(5)] == [1, 1, 1, 1, 2]


def test_the_finish_rule_prices_each_stretch_at_the_live_rows_bucket():
    costs = {(1, 1): 1.0, (1, 2): 1.5, (2, 1): 2.0, (2, 2): 2.5, (4, 1): 3.0, (4, 2): 4.25}
    s = AdaptiveSchedule((1, 2, 4), costs, prior=1.0)    # every draft accepted: b per step
    s.begin("greedy")
    want = {}
    for b in (1, 2, 4):
        steps = sorted(-(-n // b) for n in (3, 7))       # each row's steps, then the slowest
        want[b] = 10 / (steps[0] * costs[(b, 2)] + (steps[1] - steps[0]) * costs[(b, 1)])
    assert s.finish_scores(["a", "b"], [3, 7]) == pytest.approx(want, rel=1e-12)
    s = AdaptiveSchedule((1, 2, 4), costs, prior=0.0)    # every block commits one a step
    s.begin("greedy")
    want = {b: 10 / (3 * costs[(b, 2)] + 4 * costs[(b, 1)]) for b in (1, 2, 4)}
    assert s.finish_scores(["a", "b"], [7, 3]) == pytest.approx(want, rel=1e-12)


def test_without_the_cost_table_every_step_costs_one():
    s = AdaptiveSchedule((1, 2, 4), without={"cost_table"})
    assert s.costs == {(1, 0): 1.0, (2, 0): 1.0, (4, 0): 1.0}
    assert s.cost(4, 8) == 1.0


def test_without_calibration_an_untimed_entry_costs_the_cheapest_known_at_its_bucket():
    table = MeasuredTable()
    for key, secs in {(1, 2, "greedy"): 3.0, (2, 2, "greedy"): 2.0, (4, 4, "greedy"): 0.5,
                      (4, 2, "sampled"): 0.25, (1, 1, "sampled"): 0.125}.items():
        table.samples[key] = [secs]
    s = AdaptiveSchedule((1, 2, 4), table=table, without={"calibration"})
    s.begin("greedy")
    assert [s.cost(b, 2) for b in (1, 2, 4)] == [3.0, 2.0, 2.0]
    assert s.cost(1, 4) == 0.5 and s.cost(2, 1) == 1.0 and s.cost(2, 8) == 1.0
    assert s.calibrate(2) == []
    s.begin("sampled")
    assert s.cost(2, 2) == 0.25 and s.cost(4, 1) == 0.125 and s.cost(1, 4) == 1.0


def test_every_mechanism_may_be_switched_off_at_once():
    s = AdaptiveSchedule((1, 2, 4), EQUAL, without=ABLATIONS)
    assert s.without == ABLATIONS
    with pytest.raises(InvalidInputError, match="unknown mechanisms"):
        AdaptiveSchedule((1, 2, 4), EQUAL, without=ABLATIONS | {"nothing"})


def test_calibration_takes_three_samples_per_entry_by_default():
    s = AdaptiveSchedule((1, 2, 4))
    s.begin("greedy")
    for n in range(3):
        assert s.calibrate(2) == [1, 2, 4]
        for b in (1, 2, 4):
            s.measure(b, 2, 1.0 + n)
    assert s.calibrate(2) == [] and s.calibrate(1) == [1, 2, 4]
    s.measure(2, 2, 100.0)                            # past the samples it keeps
    assert s.table.samples[(2, 2, "greedy")] == [1.0, 2.0, 3.0]


def _pooled(pool_counts, candidates=(1, 2, 4), costs=None):
    table = MeasuredTable()
    if pool_counts is not None:
        table.fold_accept("greedy", None, pool_counts)
    s = AdaptiveSchedule(candidates, costs or dict.fromkeys(candidates, 1.0), table=table)
    s.begin("greedy")
    return s


def test_project_ties_go_to_the_smaller_speculative_block():
    s = _pooled(([0.0] * 3, [10.0] * 3))              # pooled: nothing accepted
    assert s.project(1, [10]) == (2, pytest.approx(1.0), pytest.approx(1.0))
    s = AdaptiveSchedule((1, 2, 4), EQUAL, table=s.table, without={"finish_rule"})
    s.begin("greedy")
    assert s.project(1, [10]) == (2, pytest.approx(1.0), pytest.approx(1.0))


def test_project_needs_a_speculative_candidate_and_a_pooled_slot_one():
    assert _pooled(([9.0], [10.0]), candidates=(1, 2)).project(1, [10])[0] == 2
    assert _pooled(([9.0], [10.0]), candidates=(1,)).project(1, [10]) is None
    assert _pooled(([8.0, 0.0], [10.0, 2.0])).project(2, [10, 10])[0] in (2, 4)
    assert _pooled(([1.0], [2.0])).project(1, [10]) is None            # slot 1 not pooled
    assert _pooled(None).project(1, [10]) is None
