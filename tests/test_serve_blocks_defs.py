"""The server's block of each step (``serve.blocks.Blocks``) against its definition, written
out here (docs/serving.md, ``--block-size``; the module docstring): a fixed block answers
itself and leaves the engine's policy alone (speculative when above 1); ``auto`` uses the
engine's policy, or makes the measured one over the engine's table with the draft's default
candidates and the rate rule (no finish rule, no call plan). An adaptive epoch runs from the
step that finds the batch non-empty to the step that leaves it empty, or to the join that
brings the rows it took past 1,024; the policy hears each epoch begin once, and at its end the
tokens generated in it and its seconds without the calibration seconds spent in it. Before
rows join, the draft context deferred by target-only steps is settled, its positions and
seconds counted. A step is observed with its seconds plus the catch-up before it. Calibration
times discarded steps on the batch's first k rows under the calibration keys, counted in the
run's stats; ahead of time, every row with a budget of one token."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from dflash2rt.engine.engine import CALIBRATION_KEY
from dflash2rt.engine.policy import Live
from dflash2rt.engine.policy.adaptive import AdaptivePolicy
from dflash2rt.engine.policy.table import MeasuredTable
from dflash2rt.engine.request import Request, SamplingParams
from dflash2rt.engine.runner import Step
from dflash2rt.engine.state import new_state
from dflash2rt.engine.stats import RunStats
from dflash2rt.models.kv_cache import KVCache
from dflash2rt.serve import blocks as blocks_mod
from dflash2rt.serve.blocks import Blocks

from fake_clock import Clock

DOCUMENTED_EPOCH_ROWS = 1024       # docs/serving.md: "past 1,024 rows"


class Recorder:
    """A policy that records what it hears and answers a fixed block."""

    def __init__(self, candidates=(1, 2, 4)) -> None:
        self.schedule = SimpleNamespace(candidates=candidates)
        self.heard: list[tuple] = []

    def begin(self, requests):
        self.heard.append(("begin", list(requests)))

    def choose(self, live: Live) -> int:
        self.heard.append(("choose", live))
        return 2

    def calibrate_ahead(self, requests, live: Live) -> None:
        self.heard.append(("calibrate_ahead", list(requests), live))

    def observe(self, rows, block, accepted, seconds) -> None:
        self.heard.append(("observe", list(rows), block, list(accepted), seconds))

    def end(self, tokens=None, seconds=None) -> None:
        self.heard.append(("end", tokens, seconds))

    def kinds(self) -> list[str]:
        return [h[0] for h in self.heard]


class Runner:
    """settle → (pending, seconds) from a list; trial → 0.25 s, recording the batch's keys."""

    def __init__(self, settled=()) -> None:
        self.settled = list(settled)
        self.settles: list = []
        self.trials: list[tuple[list[int], list[int], int]] = []

    def settle(self, st):
        self.settles.append(st)
        return self.settled.pop(0) if self.settled else (0, 0.0)

    def trial(self, st, block):
        self.trials.append((st.key.tolist(), st.rows, block))
        return 0.25


def _engine(policy=None, runner=None, draft_block=4):
    return SimpleNamespace(policy=policy, runner=runner or Runner(), table=MeasuredTable(),
                           pair=SimpleNamespace(draft=SimpleNamespace(
                               cfg=SimpleNamespace(block_size=draft_block))))


def _stats() -> RunStats:
    return RunStats("spec", "cpu", "cpu", 4)


def _batch(n: int):
    """A batch of n rows (ids 10, 11, ...; keys 100, 101, ...) in caches of n slots."""
    def cache():
        return KVCache((torch.zeros(n, 4, 1, 2),), (torch.zeros(n, 4, 1, 2),))
    reqs = [Request((1,), SamplingParams(max_new_tokens=5), key=100 + i) for i in range(n)]
    st = new_state(reqs, cache(), cache(), torch.device("cpu"), 16)
    st.rows[:] = [10 + i for i in range(n)]
    return st, reqs


@pytest.fixture
def clock(monkeypatch):
    return Clock().install(monkeypatch, blocks_mod)


@pytest.mark.parametrize("block,spec", [(1, False), (2, True), (3, True), (8, True)])
def test_a_fixed_block_answers_itself_and_does_nothing_else(block, spec):
    runner = Runner([(5, 1.0)])
    engine, stats = _engine(runner=runner), _stats()
    b = Blocks(engine, block, stats)
    assert not b.adaptive and b.policy is None and engine.policy is None
    assert b.candidates == (block,) and b.room == block and b.spec is spec
    st, reqs = _batch(2)
    assert b.choose(st, reqs, [5, 5]) == block
    b.calibrate_ahead(st, reqs)
    b.before_join(st, 2)
    b.observe(Step([10, 11], block, 1, [[0, 0, 1]] * 2, 0.0, 0.0, 0.0, 0.0, 0.5), 1.0)
    b.idle()
    assert runner.settles == [] and runner.trials == [] and b.epochs == 0
    assert stats.time["catch_up"] == 0.0 and stats.draft_deferred == 0


def test_auto_makes_the_measured_rate_rule_policy_over_the_engines_table():
    engine = _engine(draft_block=4)
    b = Blocks(engine, None, _stats())
    assert b.adaptive and isinstance(b.policy, AdaptivePolicy) and engine.policy is b.policy
    assert b.policy.table is engine.table and not b.policy.schedule.fixed
    assert {"finish_rule", "call_plan"} <= b.policy.without
    assert b.candidates == (1, 2, 4, 8) and b.room == 8 and b.spec
    assert b.epochs == 0


def test_auto_uses_the_policy_the_engine_has():
    mine = Recorder((1, 3))
    engine = _engine(policy=mine)
    b = Blocks(engine, None, _stats())
    assert b.policy is mine and engine.policy is mine and b.adaptive
    assert b.candidates == (1, 3) and b.room == 3 and b.spec


def test_one_row_candidates_only_make_a_target_only_server():
    b = Blocks(_engine(policy=Recorder((1,))), None, _stats())
    assert b.adaptive and b.room == 1 and not b.spec


def test_an_epoch_begins_once_and_ends_with_its_tokens_and_seconds_less_calibration(clock):
    policy = Recorder()
    stats = _stats()
    b = Blocks(_engine(policy=policy), None, stats)
    st, reqs = _batch(3)
    stats.generated, stats.calibration_s = 7, 0.5        # what earlier epochs left
    assert b.choose(st, reqs, [4, 3, 2]) == 2
    assert b.epochs == 1
    assert policy.heard[0] == ("begin", reqs)
    live = policy.heard[1][1]
    assert live.rows == [10, 11, 12] and live.remaining == [4, 3, 2]
    clock.now += 3.0
    stats.generated += 12
    stats.calibration_s += 0.75
    assert b.choose(st, reqs, [3, 2, 1]) == 2            # the same epoch: no new begin
    assert b.epochs == 1 and policy.kinds() == ["begin", "choose", "choose"]
    clock.now += 1.0
    b.idle()
    kind, tokens, seconds = policy.heard[-1]
    assert kind == "end" and tokens == 12 and seconds == pytest.approx(4.0 - 0.75)
    b.idle()                                              # no epoch open: nothing ends
    assert policy.kinds().count("end") == 1
    b.choose(st, reqs, [1, 1, 1])
    assert b.epochs == 2 and policy.kinds().count("begin") == 2


def test_idle_before_any_epoch_ends_nothing(clock):
    policy = Recorder()
    b = Blocks(_engine(policy=policy), None, _stats())
    b.idle()
    assert policy.heard == [] and b.epochs == 0


@pytest.mark.parametrize("first", [1, 3])
def test_an_epoch_ends_at_the_join_that_brings_it_past_the_documented_rows(clock, first):
    policy = Recorder()
    b = Blocks(_engine(policy=policy), None, _stats())
    st, reqs = _batch(first)
    b.choose(st, reqs, [1] * first)
    b.before_join(st, DOCUMENTED_EPOCH_ROWS - first - 1)
    b.before_join(st, 1)                                  # exactly 1,024 rows: still open
    assert "end" not in policy.kinds()
    b.before_join(st, 1)                                  # 1,025: it ends here
    assert policy.kinds().count("end") == 1
    b.before_join(st, 1)                                  # none open: nothing more ends
    assert policy.kinds().count("end") == 1
    b.choose(st, reqs, [1] * first)                       # the next step begins another
    assert b.epochs == 2 and policy.kinds().count("begin") == 2
    b.before_join(st, DOCUMENTED_EPOCH_ROWS - first)
    assert policy.kinds().count("end") == 1
    b.before_join(st, 1)
    assert policy.kinds().count("end") == 2


def test_rows_that_join_a_new_epoch_count_from_its_batch(clock):
    policy = Recorder()
    b = Blocks(_engine(policy=policy), None, _stats())
    b.before_join(None, DOCUMENTED_EPOCH_ROWS)            # joins before the epoch's first step
    st, reqs = _batch(2)
    b.choose(st, reqs, [1, 1])                            # the epoch takes its 2 rows
    b.before_join(st, DOCUMENTED_EPOCH_ROWS - 2)
    assert "end" not in policy.kinds()
    b.before_join(st, 1)
    assert policy.kinds().count("end") == 1


def test_before_join_settles_the_deferred_context_and_counts_it():
    runner = Runner([(6, 0.125), (0, 0.0), (3, 0.5)])
    stats = _stats()
    b = Blocks(_engine(policy=Recorder(), runner=runner), None, stats)
    st, _ = _batch(2)
    b.before_join(st, 1)
    b.before_join(None, 2)
    b.before_join(st, 1)
    assert runner.settles == [st, None, st]
    assert stats.draft_deferred == 9 and stats.time["catch_up"] == pytest.approx(0.625)


def test_a_step_is_observed_with_its_catch_up_seconds():
    policy = Recorder()
    b = Blocks(_engine(policy=policy), None, _stats())
    step = Step([10, 11], 4, 4, [[2, 0, 5, 6, 7, 0], [0, 0, 9, 0, 0, 0]], 0.0, 0.0, 0.0, 0.0,
                catch_up_s=0.25, deferred=3)
    b.observe(step, 1.5)
    assert policy.heard == [("observe", [10, 11], 4, [2, 0], pytest.approx(1.75))]


def test_calibration_ahead_sees_every_row_with_one_token_left():
    policy = Recorder()
    b = Blocks(_engine(policy=policy), None, _stats())
    st, reqs = _batch(3)
    b.calibrate_ahead(st, reqs)
    (kind, got, live), = policy.heard
    assert kind == "calibrate_ahead" and got == reqs
    assert live.rows == [10, 11, 12] and live.remaining == [1, 1, 1]


@pytest.mark.parametrize("k", [1, 2, 3, 4, 8])
def test_a_probe_times_discarded_steps_on_the_first_rows_under_calibration_keys(k):
    runner = Runner()
    policy = Recorder()
    stats = _stats()
    b = Blocks(_engine(policy=policy, runner=runner), None, stats)
    st, reqs = _batch(3)
    b.choose(st, reqs, [1, 1, 1])
    time_step = policy.heard[1][1].probe(k)
    assert time_step(4) == 0.25 and time_step(2) == 0.25
    n = min(k, 3)
    keys = [(100 + i) ^ CALIBRATION_KEY for i in range(n)]
    rows = [10 + i for i in range(n)]
    assert runner.trials == [(keys, rows, 4), (keys, rows, 2)]
    assert stats.calibration_steps == 2 and stats.calibration_s == pytest.approx(0.5)
    assert st.key.tolist() == [100, 101, 102] and st.rows == [10, 11, 12]   # untouched
