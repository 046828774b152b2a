"""``Engine.generate`` (``engine/engine.py``) against its docstrings and RunStats' field comments,
with the engine's clock scripted (``fake_clock``): prefill, each step's capture, graphs and
catch-up, its host work and each calibration step move the clock by fixed, exactly representable
seconds, nothing else does, so every figure below is a hand sum, never a machine's speed:

- ``time``: prefill, graphs (each step's device seconds), catch-up and host (from the step's
  host start to its end) are the sums of what each step reported; ``wall_s`` is all of it;
- a step's seconds (``step_time`` and what the policy observes) exclude its capture; the policy
  observes them with the catch-up added and ends the call with the wall less calibration;
- calibration: ``calibration_steps`` / ``calibration_s`` count the trial steps, a probe of k rows
  runs the batch's first k rows (all of them for k >= the batch) under keys outside a
  request's key domain, and its host round trips are not the run's syncs;
- a target-only call reports block 1 and compiles / makes room for block 1 on a draftless pair;
  ``watermarked`` says whether a key was given; a memory note becomes a fallback, no note none;
  a candidate count is refused target-only only; ``on_finish(i)`` comes once, after request i's
  last ``on_tokens``; callbacks that are not callable are refused; an engine keeps the cost
  table it is given, else makes its own."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from dflash2rt import get_backend
from dflash2rt.engine import engine as engine_mod
from dflash2rt.engine.engine import Engine
from dflash2rt.engine.policy import Call, Policy
from dflash2rt.engine.policy.table import MeasuredTable
from dflash2rt.engine.request import Request, SamplingParams
from dflash2rt.errors import InvalidInputError
from dflash2rt.models.pair import ModelPair
from dflash2rt.watermark import WatermarkKey

from fake_clock import Clock
from tiny_models import tiny_pair

# seconds, all exact in binary so that every sum below is exact
PREFILL, DEVICE, CAPTURE, HOST, CATCH_UP, TRIAL = 8.0, 2.0, 64.0, 0.5, 4.0, 0.25
PROMPTS = [(1, 2, 3), (4, 5, 6, 7, 8), (9,)]


def _bucket(rows: int) -> int:
    """The next power of two >= rows, by counting up."""
    b = 1
    while b < rows:
        b *= 2
    return b


class Scripted(Policy):
    """A speculative policy with a fixed list of blocks (cycled); before step n it runs the
    probes ``probes[n]`` = [(k, block), ...] and records everything it is told."""

    def __init__(self, blocks, probes=None):
        self.blocks, self.probes = list(blocks), dict(probes or {})
        self.n, self.observed, self.ended, self.trials = 0, [], [], []

    def begin(self, requests):
        return Call(True, max(self.blocks), adaptive=True)

    def choose(self, live):
        for k, b in self.probes.get(self.n, ()):
            self.trials.append(live.probe(k)(b))
        b = self.blocks[self.n % len(self.blocks)]
        self.n += 1
        return b

    def observe(self, rows, block, accepted, seconds):
        self.observed.append((list(rows), block, seconds))

    def end(self, tokens=None, seconds=None):
        self.ended.append((tokens, seconds))


class Scripting:
    """The engine's clock and its runner's reported times scripted: prefill takes PREFILL, step
    k captures CAPTURE (k = 0 only) then runs DEVICE on the device, odd steps first catch up
    CATCH_UP over 3 positions, each drop of finished rows (the host work) takes HOST, a trial
    TRIAL. Records the steps and the trials' batches."""

    def __init__(self, engine: Engine, monkeypatch) -> None:
        self.clock = Clock().install(monkeypatch, engine_mod)
        self.steps, self.probed = [], []
        runner, clock = engine.runner, self.clock
        real_prefill, real_step, real_trial = runner.prefill, runner.step, runner.trial
        real_drop = engine_mod.drop_finished

        def prefill(st, prompts):
            host = real_prefill(st, prompts)
            clock.now += PREFILL
            return host

        def step(st, block, between=None):
            s = real_step(st, block, between)
            k, t0 = len(self.steps), clock.now
            cap = CAPTURE if k == 0 else 0.0
            clock.now += cap + DEVICE
            s = dataclasses.replace(s, t0=t0, host_t0=clock.now, device_s=DEVICE,
                                    capture_s=cap, catch_up_s=CATCH_UP if k % 2 else 0.0,
                                    deferred=3 if k % 2 else 0)
            self.steps.append(s)
            return s

        def trial(st, block, between=None, clock_dict=None):
            self.probed.append((list(st.rows), st.key.tolist(), block))
            real_trial(st, block, between)
            clock.now += TRIAL
            return TRIAL

        def drop(st, out):
            clock.now += HOST
            return real_drop(st, out)

        monkeypatch.setattr(runner, "prefill", prefill)
        monkeypatch.setattr(runner, "step", step)
        monkeypatch.setattr(runner, "trial", trial)
        monkeypatch.setattr(engine_mod, "drop_finished", drop)


def _reqs(n=9, temps=(0.0, 1.0, 0.6), hook=None, keys=(0, 1, 2)):
    return [Request(p, SamplingParams(max_new_tokens=n, temperature=t, seed=4, ignore_eos=True,
                                      constraint=hook() if hook else None), key=k)
            for p, t, k in zip(PROMPTS, temps, keys)]


@pytest.fixture(scope="module")
def pair():
    return tiny_pair("dflash2", block=4, seed=1)


def _engine(pair, policy=None):
    engine = Engine(pair, get_backend("cpu"))
    engine.policy = policy
    return engine


def test_time_split_wall_and_step_seconds_are_the_scripted_sums(pair, monkeypatch):
    policy = Scripted([4, 1, 2])
    engine = _engine(pair, policy)
    s = Scripting(engine, monkeypatch)
    out, stats = engine.generate(_reqs(), spec=True)
    n = len(s.steps)
    assert n == stats.steps == stats.syncs and n >= 4
    catch = sum(CATCH_UP for k in range(n) if k % 2)
    assert stats.time["prefill"] == PREFILL
    assert stats.time["graphs"] == n * DEVICE
    assert stats.time["catch_up"] == catch
    assert stats.time["host"] == n * HOST
    assert stats.draft_deferred == 3 * (n // 2)
    assert stats.wall_s == PREFILL + HOST + CAPTURE + n * (DEVICE + HOST)
    assert stats.calibration_steps == 0 and stats.calibration_s == 0.0
    want: dict = {}
    for st in s.steps:                                   # capture excluded, catch-up too
        cell = want.setdefault(st.block, {}).setdefault(_bucket(len(st.rows)), [0, 0.0])
        cell[0] += 1
        cell[1] += DEVICE + HOST
    assert stats.step_time == want
    assert policy.observed == [(st.rows, st.block, DEVICE + HOST + (CATCH_UP if k % 2 else 0.0))
                               for k, st in enumerate(s.steps)]
    generated = sum(len(o.token_ids) for o in out)
    assert generated == stats.generated == 3 * 9
    assert policy.ended == [(generated, stats.wall_s)]


def test_calibration_counts_its_steps_and_is_out_of_the_seconds_the_policy_ends_with(
        pair, monkeypatch):
    policy = Scripted([4, 2], probes={0: [(1, 2), (3, 4)], 2: [(2, 4), (5, 2), (2, 2)]})
    engine = _engine(pair, policy)
    s = Scripting(engine, monkeypatch)
    _, stats = engine.generate(_reqs(), spec=True)
    n, m = len(s.steps), 5
    assert policy.trials == [TRIAL] * m
    assert stats.calibration_steps == m and stats.calibration_s == m * TRIAL
    assert stats.wall_s == PREFILL + HOST + CAPTURE + n * (DEVICE + HOST) + m * TRIAL
    assert policy.ended == [(3 * 9, stats.wall_s - m * TRIAL)]
    assert stats.steps == n and stats.syncs == n             # trials are not decode syncs
    assert stats.step_time == {b: {_bucket(3): [sum(1 for x in s.steps if x.block == b),
                                                sum(DEVICE + HOST for x in s.steps
                                                    if x.block == b)]}
                               for b in {x.block for x in s.steps}}


def test_a_probe_runs_the_first_k_rows_under_keys_no_request_has(pair, monkeypatch):
    keys = (7, 2**32 - 1, 0)
    policy = Scripted([2], probes={0: [(1, 2), (2, 4), (3, 2), (4, 2), (8, 4)]})
    engine = _engine(pair, policy)
    s = Scripting(engine, monkeypatch)
    _, stats = engine.generate(_reqs(keys=keys), spec=True)
    assert [(rows, b) for rows, _, b in s.probed] == [
        ([0], 2), ([0, 1], 4), ([0, 1, 2], 2), ([0, 1, 2], 2), ([0, 1, 2], 4)]
    for rows, got, _ in s.probed:
        assert len(got) == len(rows)
        for row, key in zip(rows, got):
            assert not 0 <= key < 2**32 and key != keys[row]
    assert s.steps[0].rows == [0, 1, 2]                      # the batch itself is unchanged
    assert stats.calibration_steps == 5


class AllowAll:
    """A generic (host) constraint hook that allows every token: host masks, no effect."""

    def __init__(self, vocab: int) -> None:
        self.vocab = vocab

    def initial(self):
        return 0

    def allowed(self, state):
        return torch.from_numpy(np.ones(self.vocab, bool))

    def advance(self, state, token):
        return state + 1


def test_calibration_round_trips_of_a_host_hook_are_not_the_runs_syncs(pair, monkeypatch):
    vocab = pair.target.cfg.vocab_size
    got = {}
    for name, probes in (("plain", {}), ("probed", {0: [(3, 4)], 1: [(2, 2), (3, 4)]})):
        policy = Scripted([4, 1, 2], probes)
        engine = _engine(pair, policy)
        s = Scripting(engine, monkeypatch)
        _, stats = engine.generate(_reqs(hook=lambda: AllowAll(vocab)), spec=True)
        spec_steps = sum(1 for x in s.steps if x.block >= 2)
        assert stats.syncs == stats.steps + spec_steps, name
        got[name] = (stats.steps, stats.syncs, stats.constraint_host_masks)
        monkeypatch.undo()
    assert got["probed"] == got["plain"] and got["plain"][2] > 0


def _spy(engine, monkeypatch):
    """Records the blocks compiled ahead and the room the runner's caches are made with."""
    seen = {"compiled": [], "room": []}
    real_start = engine.runner.start

    def run(blocks, report):
        seen["compiled"].append(tuple(blocks))
        return 0.0, {}

    def start(requests, spec, room, *a, **k):
        seen["room"].append(room)
        return real_start(requests, spec, room, *a, **k)
    monkeypatch.setattr(engine.compiler, "run", run)
    monkeypatch.setattr(engine.runner, "start", start)
    return seen


@pytest.mark.parametrize("block_size", [None, 1, 3])
def test_a_target_only_call_reports_block_1_and_a_draftless_pair_makes_room_for_1(
        pair, monkeypatch, block_size):
    for p, room in ((pair, 4 if block_size is None else block_size),
                    (ModelPair(pair.target, None), 1 if block_size is None else block_size)):
        engine = Engine(p, get_backend("cpu"))
        seen = _spy(engine, monkeypatch)
        _, stats = engine.generate(_reqs(n=3), spec=False, block_size=block_size)
        assert stats.mode == "target-only" and stats.block_size == 1
        assert set(stats.block_sizes) == {1}
        assert seen == {"compiled": [(1,)], "room": [room]}, p.draft is None
        monkeypatch.undo()


@pytest.mark.parametrize("block", [2, 3])
def test_a_fixed_speculative_call_reports_and_compiles_its_block(pair, monkeypatch, block):
    engine = Engine(pair, get_backend("cpu"))
    seen = _spy(engine, monkeypatch)
    _, stats = engine.generate(_reqs(n=3), spec=True, block_size=block)
    assert stats.mode == "spec" and stats.block_size == block
    assert seen == {"compiled": [(block,)], "room": [block]}


@pytest.mark.parametrize("spec", [False, True])
def test_watermarked_says_whether_a_key_was_given(pair, spec):
    engine = Engine(pair, get_backend("cpu"))
    kw = dict(spec=spec, block_size=4 if spec else None)
    _, plain = engine.generate(_reqs(n=3), **kw)
    _, marked = engine.generate(_reqs(n=3), watermark=WatermarkKey(bytes(range(32))), **kw)
    assert plain.watermarked is False and marked.watermarked is True


def test_a_watermark_that_is_not_a_key_is_refused(pair):
    engine = Engine(pair, get_backend("cpu"))
    for bad in (bytes(range(32)), "key", 7):
        with pytest.raises(InvalidInputError, match="WatermarkKey"):
            engine.generate(_reqs(n=2), spec=False, watermark=bad)


def test_a_memory_note_is_a_fallback_and_no_note_is_none(pair, monkeypatch):
    engine = Engine(pair, get_backend("cpu"))
    monkeypatch.setattr(engine_mod, "memory_note", lambda device: None)
    _, quiet = engine.generate(_reqs(n=2), spec=False)
    assert all(isinstance(f, str) and f for f in quiet.fallbacks), quiet.fallbacks
    note = "free memory of cpu estimated: a test's note"
    monkeypatch.setattr(engine_mod, "memory_note", lambda device: note)
    _, noted = engine.generate(_reqs(n=2), spec=False)
    assert noted.fallbacks.count(note) == 1
    assert [f for f in noted.fallbacks if f != note] == quiet.fallbacks


def test_a_candidate_count_is_refused_target_only_and_taken_speculating(pair):
    engine = Engine(pair, get_backend("cpu"))
    reqs = [Request((1, 2, 3), SamplingParams(max_new_tokens=3, num_candidates=2))]
    with pytest.raises(InvalidInputError, match="num_candidates=2"):
        engine.generate(reqs, spec=False)
    out, stats = engine.generate(reqs, spec=True, block_size=4)
    assert len(out[0].token_ids) == 3 and stats.mode == "spec"
    plain = [Request((1, 2, 3), SamplingParams(max_new_tokens=3))]
    assert len(engine.generate(plain, spec=False)[0][0].token_ids) == 3


@pytest.mark.parametrize("spec", [False, True])
def test_on_finish_is_called_once_per_request_after_its_last_tokens(pair, spec):
    engine = Engine(pair, get_backend("cpu"))
    events = []
    reqs = [Request(p, SamplingParams(max_new_tokens=n, ignore_eos=True))
            for p, n in zip(PROMPTS, (2, 7, 4))]
    out, _ = engine.generate(reqs, spec=spec, block_size=4 if spec else None,
                             on_tokens=lambda i, ids: events.append(("tokens", i, list(ids))),
                             on_finish=lambda i: events.append(("finish", i)))
    for i, o in enumerate(out):
        mine = [e for e in events if e[1] == i]
        assert mine[-1] == ("finish", i) and mine.count(("finish", i)) == 1
        assert [t for e in mine[:-1] for t in e[2]] == o.token_ids
    for bad in (3, "finish"):
        with pytest.raises(InvalidInputError, match="on_finish"):
            engine.generate(reqs, spec=spec, block_size=4 if spec else None, on_finish=bad)


def test_on_tokens_that_is_not_callable_is_refused(pair):
    engine = Engine(pair, get_backend("cpu"))
    for bad in (3, "tokens"):
        with pytest.raises(InvalidInputError, match="on_tokens"):
            engine.generate(_reqs(n=2), spec=False, on_tokens=bad)


def test_an_engine_keeps_the_table_it_is_given_else_makes_its_own(pair):
    table = MeasuredTable()
    assert Engine(pair, get_backend("cpu"), table).table is table
    a, b = Engine(pair, get_backend("cpu")), Engine(pair, get_backend("cpu"))
    assert isinstance(a.table, MeasuredTable) and a.table is not b.table
