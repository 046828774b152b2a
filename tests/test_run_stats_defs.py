"""RunStats against its definitions (docs/metrics.md and the field comments of
``dflash2rt/engine/stats.py``), counted anew by hand or by loops over the definitions that
share no code with the class: a fresh run counts nothing, every counter and histogram after a
scripted run of steps is exact, every ratio is 0 on its zero denominator and exact off it, the
dict form carries every field and derived figure, and the timings it is fed come back exact
(fixed seconds, never the clock)."""

from __future__ import annotations

import random

import pytest

from dflash2rt.engine.stats import RunStats

PHASES = ("prefill", "draft", "select", "verify", "graphs", "host", "catch_up")


def fresh_fields(mode: str, block: int) -> dict:
    """Every field of a run that has done nothing, written out from the field comments."""
    per_pos = [0] * (block - 1) if mode == "spec" and block >= 2 else []
    return {
        "mode": mode, "backend": "cpu", "device": "cpu", "block_size": block,
        "requests": 0, "adaptive": False, "call_plan": "", "cost_noise": "",
        "block_sizes": {}, "candidates": {}, "block_verified": 0, "costs": {}, "step_time": {},
        "calibration_steps": 0, "calibration_s": 0.0, "draft_deferred": 0,
        "steps": 0, "request_steps": 0, "committed": 0, "generated": 0, "accept_hist": [],
        "num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0,
        "accepted_per_pos": per_pos, "reached_per_pos": list(per_pos),
        "time": {p: 0.0 for p in PHASES}, "wall_s": 0.0, "capture_s": 0.0,
        "compile_s": 0.0, "compile_variants": {}, "syncs": 0, "constraint_host_masks": 0,
        "fallbacks": [], "model_pass": None, "watermarked": False, "tensor_parallel": "",
        "graphs": {},
    }


@pytest.mark.parametrize("mode,block", [("spec", 4), ("spec", 2), ("spec", 1),
                                        ("target-only", 1), ("target-only", 4)])
def test_a_fresh_run_counts_nothing(mode, block):
    """Every counter, histogram and time of a run that made no step is zero / empty / unset,
    with exact types (0 and not False, 0.0 and not 0); a spec run lists every draft position
    of its block (block - 1 of them, none at block 1), a target-only run none."""
    s = RunStats(mode, "cpu", "cpu", block)
    want = fresh_fields(mode, block)
    got = {k: v for k, v in s.as_dict().items() if k in want}
    assert got == want
    for k, v in want.items():
        assert type(got[k]) is type(v), k
    n = len(want["accepted_per_pos"])
    derived = {"tau": 0.0, "tokens_per_s": 0.0, "observed_costs": {},
               "mean_acceptance_length": 0.0, "acceptance_rate": 0.0,
               "acceptance_rate_per_pos": [0.0] * n,
               "conditional_acceptance_rate_per_pos": [0.0] * n}
    assert {k: v for k, v in s.as_dict().items() if k not in want} == derived
    assert s.step_s == 0.0


def test_fresh_runs_share_no_mutable_default():
    a, b = RunStats("spec", "cpu", "cpu", 3), RunStats("spec", "cpu", "cpu", 3)
    a.record_accepts([2], 3)
    a.record_step_time(3, 1, 0.5)
    a.time["draft"] += 1.0
    assert b.as_dict() == RunStats("spec", "cpu", "cpu", 3).as_dict()
    assert b.accept_hist == [] and b.accepted_per_pos == [0, 0] and b.time["draft"] == 0.0


def test_given_position_counts_are_kept():
    """A run rebuilt from its dict keeps its position counts (only empty ones are sized)."""
    s = RunStats("spec", "cpu", "cpu", 4, accepted_per_pos=[5, 2], reached_per_pos=[7, 5])
    assert (s.accepted_per_pos, s.reached_per_pos) == ([5, 2], [7, 5])
    t = RunStats("target-only", "cpu", "cpu", 4)
    assert (t.accepted_per_pos, t.reached_per_pos) == ([], [])


def reference(steps: list[tuple[list[int], int]]) -> dict:
    """Every count of a run of (accepted per live row, block) steps, from the definitions:
    a draft is one row's step of block b >= 2 (b - 1 draft tokens); position i is reached
    when the block has it and every earlier one was accepted, accepted when the row's
    accepted count passes it; the histogram's index is the accepted count."""
    hist: dict[int, int] = {}
    blocks: dict[int, int] = {}
    drafts = draft_tokens = accepted_tokens = committed = request_steps = 0
    acc_pos: dict[int, int] = {}
    reach_pos: dict[int, int] = {}
    longest = 0
    for accepted, block in steps:
        blocks[block] = blocks.get(block, 0) + 1
        longest = max(longest, block - 1)             # every position of every block seen
        for a in accepted:
            request_steps += 1
            committed += a + 1                        # the accepted drafts and one more token
            hist[a] = hist.get(a, 0) + 1
            if block < 2:
                continue
            drafts += 1
            draft_tokens += block - 1
            accepted_tokens += a
            for pos in range(block - 1):
                if all(p < a for p in range(pos)):      # every earlier position accepted
                    reach_pos[pos] = reach_pos.get(pos, 0) + 1
                if pos < a:
                    acc_pos[pos] = acc_pos.get(pos, 0) + 1
    top = max(hist) + 1 if hist else 0
    return {"accept_hist": [hist.get(k, 0) for k in range(top)], "block_sizes": blocks,
            "num_drafts": drafts, "num_draft_tokens": draft_tokens,
            "num_accepted_tokens": accepted_tokens, "committed": committed,
            "request_steps": request_steps, "longest": longest,
            "acc_pos": acc_pos, "reach_pos": reach_pos}


def counts_of(s: RunStats) -> dict:
    return {k: getattr(s, k) for k in ("accept_hist", "block_sizes", "num_drafts",
                                       "num_draft_tokens", "num_accepted_tokens", "committed",
                                       "request_steps")}


def check_against_reference(s: RunStats, steps, block_size: int) -> None:
    ref = reference(steps)
    assert counts_of(s) == {k: ref[k] for k in counts_of(s)}
    width = max(ref["longest"], block_size - 1 if s.mode == "spec" else 0, 0)
    assert s.accepted_per_pos == [ref["acc_pos"].get(i, 0) for i in range(width)]
    assert s.reached_per_pos == [ref["reach_pos"].get(i, 0) for i in range(width)]
    # ratios from the reference's counts, each over its own denominator
    d, t = ref["num_drafts"], ref["num_draft_tokens"]
    assert s.tau == (ref["committed"] / ref["request_steps"] if ref["request_steps"] else 0.0)
    assert s.mean_acceptance_length == (1 + ref["num_accepted_tokens"] / d if d else 0.0)
    assert s.acceptance_rate == (ref["num_accepted_tokens"] / t if t else 0.0)
    assert s.acceptance_rate_per_pos == [ref["acc_pos"].get(i, 0) / d if d else 0.0
                                         for i in range(width)]
    assert s.conditional_acceptance_rate_per_pos == [
        ref["acc_pos"].get(i, 0) / ref["reach_pos"][i] if ref["reach_pos"].get(i) else 0.0
        for i in range(width)]


def test_every_edge_of_one_draft():
    """One row, block 4 (3 draft tokens), each accepted count alone: nothing, a middle one,
    everything (the last position reached and accepted, nothing past the block)."""
    for a, acc, reach in ((0, [0, 0, 0], [1, 0, 0]), (1, [1, 0, 0], [1, 1, 0]),
                          (2, [1, 1, 0], [1, 1, 1]), (3, [1, 1, 1], [1, 1, 1])):
        s = RunStats("spec", "cpu", "cpu", 4)
        s.record_accepts([a], 4)
        assert (s.accepted_per_pos, s.reached_per_pos) == (acc, reach), a
        assert s.accept_hist == [0] * a + [1]
        assert (s.num_drafts, s.num_draft_tokens, s.num_accepted_tokens) == (1, 3, a)
        assert (s.committed, s.request_steps, s.block_sizes) == (a + 1, 1, {4: 1})


def test_block_two_is_a_draft_and_block_one_is_not():
    s = RunStats("spec", "cpu", "cpu", 2)
    s.record_accepts([1, 0], 2)
    assert (s.num_drafts, s.num_draft_tokens, s.num_accepted_tokens) == (2, 2, 1)
    assert (s.accepted_per_pos, s.reached_per_pos) == ([1], [2])
    s.record_accepts([0, 0, 0], 1)
    assert (s.num_drafts, s.num_draft_tokens, s.num_accepted_tokens) == (2, 2, 1)
    assert (s.accepted_per_pos, s.reached_per_pos) == ([1], [2])
    assert s.accept_hist == [4, 1] and s.block_sizes == {2: 1, 1: 1}
    assert (s.request_steps, s.committed) == (5, 6)


def test_target_only_steps_count_tokens_but_no_draft():
    s = RunStats("target-only", "cpu", "cpu", 1)
    for rows in ([0, 0, 0], [0, 0], [0]):
        s.record_accepts(rows, 1)
    assert s.accept_hist == [6] and s.block_sizes == {1: 3}
    assert (s.request_steps, s.committed, s.tau) == (6, 6, 1.0)
    assert (s.num_drafts, s.num_draft_tokens, s.accepted_per_pos) == (0, 0, [])
    assert s.mean_acceptance_length == 0.0 and s.acceptance_rate == 0.0


def test_a_step_with_no_live_row_counts_the_step_only():
    s = RunStats("spec", "cpu", "cpu", 4)
    s.record_accepts([], 4)
    assert s.block_sizes == {4: 1} and s.accept_hist == []
    assert (s.num_drafts, s.num_draft_tokens, s.request_steps, s.committed) == (0, 0, 0, 0)
    assert s.accepted_per_pos == [0, 0, 0] and s.reached_per_pos == [0, 0, 0]


def test_position_lists_grow_to_a_larger_block_and_never_shrink():
    """A block past the run's ``block_size`` (adaptive: twice the draft's block) lengthens
    the position lists to its draft tokens; a smaller block later leaves them that long."""
    s = RunStats("spec", "cpu", "cpu", 2)
    s.record_accepts([4], 6)
    assert s.accepted_per_pos == [1, 1, 1, 1, 0] and s.reached_per_pos == [1] * 5
    s.record_accepts([1], 3)
    assert s.accepted_per_pos == [2, 1, 1, 1, 0] and s.reached_per_pos == [2, 2, 1, 1, 1]
    t = RunStats("target-only", "cpu", "cpu", 1)
    t.record_accepts([0], 3)
    assert t.accepted_per_pos == [0, 0] and t.reached_per_pos == [1, 0]


@pytest.mark.parametrize("seed", range(6))
def test_random_runs_match_the_definitions(seed):
    """Random mixes of blocks 1 .. 9 and live rows, every accepted count from 0 to the
    block's drafts, checked after every step against the reference."""
    rng = random.Random(seed)
    mode = "spec" if seed % 3 else "target-only"
    block_size = rng.choice([1, 2, 4, 8]) if mode == "spec" else 1
    s = RunStats(mode, "cpu", "cpu", block_size)
    steps = []
    for _ in range(25):
        block = rng.choice([1, 1, 2, 3, 4, 5, 8, 9])
        rows = [rng.randint(0, block - 1) for _ in range(rng.randint(0, 5))]
        steps.append((rows, block))
        s.record_accepts(rows, block)
        check_against_reference(s, steps, block_size)


def test_ratios_over_each_own_denominator():
    """Counts set by hand so that every ratio's numerator and denominator differ from every
    other's: a ratio over the wrong count, or not guarded at its zero, shows."""
    s = RunStats("spec", "cpu", "cpu", 3, num_drafts=4, num_draft_tokens=10,
                 num_accepted_tokens=5, accepted_per_pos=[3, 2, 0],
                 reached_per_pos=[4, 3, 0], committed=21, request_steps=6, generated=9,
                 wall_s=2.0)
    assert s.mean_acceptance_length == 1 + 5 / 4
    assert s.acceptance_rate == 5 / 10
    assert s.acceptance_rate_per_pos == [3 / 4, 2 / 4, 0.0]
    assert s.conditional_acceptance_rate_per_pos == [3 / 4, 2 / 3, 0.0]
    assert s.tau == 21 / 6 and s.tokens_per_s == 9 / 2.0
    z = RunStats("spec", "cpu", "cpu", 3, accepted_per_pos=[2, 1], reached_per_pos=[0, 0],
                 num_accepted_tokens=3, committed=4, generated=5)
    assert z.mean_acceptance_length == 0.0 and z.acceptance_rate == 0.0
    assert z.acceptance_rate_per_pos == [0.0, 0.0]
    assert z.conditional_acceptance_rate_per_pos == [0.0, 0.0]
    assert z.tau == 0.0


@pytest.mark.parametrize("wall,want", [(0.0, 0.0), (-1.0, 0.0), (0.5, 12.0), (4.0, 1.5)])
def test_tokens_per_s_is_zero_unless_time_passed(wall, want):
    s = RunStats("spec", "cpu", "cpu", 4, generated=6, wall_s=wall)
    assert s.tokens_per_s == want


def test_step_seconds_leave_prefill_capture_and_calibration_out():
    s = RunStats("spec", "cpu", "cpu", 4, wall_s=10.0, capture_s=1.25, calibration_s=2.0,
                 steps=5)
    s.time["prefill"] = 0.5
    s.time["draft"] = 3.0                          # inside the steps: not subtracted
    assert s.step_s == (10.0 - 0.5 - 1.25 - 2.0) / 5
    assert RunStats("spec", "cpu", "cpu", 4, wall_s=10.0, steps=0).step_s == 0.0
    assert RunStats("spec", "cpu", "cpu", 4, wall_s=3.0, steps=1).step_s == 3.0


def test_step_time_cells_and_observed_costs():
    """Each (block, bucket) cell counts its steps and sums their fixed seconds; the observed
    cost is their mean; a cell with no step (rebuilt from a dict) has no cost."""
    s = RunStats("spec", "cpu", "cpu", 4)
    for block, bucket, sec in ((4, 1, 0.5), (4, 1, 0.25), (4, 2, 1.0), (1, 1, 0.125),
                               (4, 1, 0.75)):
        s.record_step_time(block, bucket, sec)
    assert s.step_time == {4: {1: [3, 1.5], 2: [1, 1.0]}, 1: {1: [1, 0.125]}}
    assert type(s.step_time[1][1][0]) is int
    assert s.observed_costs == {1: {1: 0.125}, 4: {1: 0.5, 2: 1.0}}
    assert list(s.observed_costs) == [1, 4]
    s.step_time[8] = {4: [0, 0.0], 2: [2, 3.0]}
    assert s.observed_costs[8] == {2: 1.5}
    assert s.as_dict()["observed_costs"] == {1: {1: 0.125}, 4: {1: 0.5, 2: 1.0}, 8: {2: 1.5}}


def test_the_dict_form_is_every_field_and_every_derived_figure():
    s = RunStats("spec", "cpu", "cpu", 4, generated=5, wall_s=2.5)
    s.record_accepts([2, 0], 4)
    s.record_accepts([3], 4)
    s.record_step_time(4, 2, 0.5)
    d = s.as_dict()
    assert {k: d[k] for k in fresh_fields("spec", 4)} == {k: getattr(s, k)
                                                         for k in fresh_fields("spec", 4)}
    assert d["tau"] == 8 / 3 and d["tokens_per_s"] == 2.0
    assert d["mean_acceptance_length"] == 1 + 5 / 3 and d["acceptance_rate"] == 5 / 9
    assert d["acceptance_rate_per_pos"] == [2 / 3, 2 / 3, 1 / 3]
    assert d["conditional_acceptance_rate_per_pos"] == [2 / 3, 1.0, 1 / 2]
    assert d["observed_costs"] == {4: {2: 0.5}}
    back = RunStats(**{k: v for k, v in d.items() if k in RunStats.__dataclass_fields__})
    assert back.as_dict() == d
