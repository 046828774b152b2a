"""The step-cost profiling pass (``dflash2rt.bench.profile``) against hand-computed splits: an
engine stand-in whose runner runs scripted step bodies through ``Runner.timer`` (each moves a fake
clock, tests/fake_clock.py, and a fake graph-capture counter), so each expected second is worked
out by hand: per body its seconds between two syncs, capture left out and kept apart, under the
clock dict it adds to; per pass draft / verify / host per decode step summed over the batches,
tau, steps and block sizes; a pass with no decode step all zeros; the runner's timer restored."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from dflash2rt.bench import measure, profile
from dflash2rt.bench.profile import profile_steps, synced_phases
from dflash2rt.engine.stats import RunStats

from fake_clock import Clock


class Runner:
    """``backend.device``, ``timer`` and ``capture_s`` as the engine's Runner has them."""

    def __init__(self, clock: Clock, log: list) -> None:
        self.backend = SimpleNamespace(device=torch.device("cpu"))
        self.timer = None
        self.captured = 2.0                      # capture seconds from before the pass
        self.clock, self.log = clock, log

    def capture_s(self) -> float:
        return self.captured

    def body(self, kind, block, clock_dict, seconds, captured=0.0, timed=True):
        def run():
            self.log.append(kind)
            self.clock.now += seconds
            self.captured += captured
            return kind
        if self.timer is None or not timed:
            return run()
        return self.timer(kind, block, clock_dict, run)


class Engine:
    """``generate`` runs one scripted run per call: its calibration bodies (a scratch dict),
    then its decode steps' bodies (the run's ``RunStats.time``), and returns its stats."""

    def __init__(self, runs) -> None:
        self.clock, self.log, self.calls = Clock(now=100.0), [], []
        self.runner = Runner(self.clock, self.log)
        self.runs = list(runs)

    def generate(self, reqs, spec, block_size):
        self.calls.append((reqs, spec, block_size))
        run = self.runs.pop(0)
        st = RunStats("spec" if spec else "target-only", "cpu", "cpu", block_size or 1)
        for kind, seconds, captured in run.get("scratch", ()):
            self.runner.body(kind, block_size, {}, seconds, captured)
        for step in run.get("steps", ()):
            for kind, seconds, captured in step:
                assert self.runner.body(kind, block_size, st.time, seconds, captured,
                                        run.get("timed", True)) == kind
            self.clock.now += 64.0                  # host work: outside every body
        st.steps = len(run.get("steps", ()))
        st.request_steps, st.committed = run.get("request_steps", 0), run.get("committed", 0)
        st.block_sizes = dict(run.get("block_sizes", {}))
        st.time["host"] = run.get("host", 0.0)
        return [[0]] * len(reqs), st


@pytest.fixture
def engine(monkeypatch):
    def make(runs):
        eng = Engine(runs)
        eng.clock.install(monkeypatch, profile)
        monkeypatch.setattr(measure, "sync", lambda device: eng.log.append(("sync", device.type)))
        return eng
    return make


SYNC = ("sync", "cpu")


def _split(got: dict) -> tuple[dict, dict]:
    """(the float entries, the rest): the floats compare with pytest.approx."""
    floats = {k: got[k] for k in ("draft", "verify", "host", "step", "tau")}
    return floats, {k: v for k, v in got.items() if k not in floats}
# batch 0 ends at its prefill (no decode step); batch 1: a calibration draft and verify on a
# scratch dict, then two steps (graph capture inside the first draft and the second verify);
# batch 2: one step
SPEC_RUNS = [
    {"host": 0.0},
    {"scratch": [("draft", 8.0, 0.0), ("verify", 16.0, 1.0)],
     "steps": [[("draft", 0.5, 0.25), ("verify", 1.0, 0.0)],
               [("draft", 0.25, 0.0), ("verify", 0.75, 0.5)]],
     "host": 0.125, "request_steps": 4, "committed": 10, "block_sizes": {4: 2}},
    {"steps": [[("draft", 0.5, 0.0), ("verify", 0.5, 0.0)]],
     "host": 0.375, "request_steps": 1, "committed": 3, "block_sizes": {4: 1}},
]


def test_spec_pass_per_step_split(engine):
    eng = engine(SPEC_RUNS)
    batches = [["a"], ("b", "c"), ["d"]]
    eng.runner.timer = None
    got = profile_steps(eng, batches, True, 4)
    draft = (0.5 - 0.25) + 0.25 + 0.5                    # capture left out; calibration too
    verify = 1.0 + (0.75 - 0.5) + 0.5
    host = 0.125 + 0.375
    floats, rest = _split(got)
    assert floats == pytest.approx({"draft": draft / 3, "verify": verify / 3, "host": host / 3,
                                    "step": (draft + verify + host) / 3, "tau": 13 / 5},
                                   rel=1e-12)
    assert rest == {"steps": 3, "block_sizes": {"4": 3}}
    assert eng.calls == [(["a"], True, 4), (["b", "c"], True, 4), (["d"], True, 4)]
    bodies = ["draft", "verify"] * 4
    assert eng.log == [e for kind in bodies for e in (SYNC, kind, SYNC)]
    assert eng.runner.timer is None


def test_target_only_pass_is_all_verify(engine):
    eng = engine([{"steps": [[("target-only", 0.5, 0.0)], [("target-only", 0.25, 0.125)]],
                   "host": 0.25, "request_steps": 2, "committed": 2, "block_sizes": {1: 2}}])
    got = profile_steps(eng, [["a"]], False)
    floats, rest = _split(got)
    assert floats == pytest.approx({"draft": 0.0, "verify": (0.5 + 0.125) / 2, "host": 0.125,
                                    "step": (0.625 + 0.25) / 2, "tau": 1.0}, rel=1e-12)
    assert rest == {"steps": 2, "block_sizes": {"1": 2}}
    assert eng.calls == [(["a"], False, None)]


def test_a_pass_without_decode_steps_is_all_zero(engine):
    eng = engine([{"host": 0.0}, {"host": 0.0}])
    assert profile_steps(eng, [["a"], ["b"]], True, 8) == {
        "draft": 0.0, "verify": 0.0, "host": 0.0, "step": 0.0, "steps": 0, "tau": 0.0,
        "block_sizes": {}}


def test_steps_that_bypass_the_timer_are_an_error(engine):
    eng = engine([{"steps": [[("draft", 0.5, 0.0), ("verify", 0.5, 0.0)]], "timed": False,
                   "request_steps": 1, "committed": 2, "block_sizes": {4: 1}}])
    with pytest.raises(RuntimeError, match="saw no step body of the run's decode steps"):
        profile_steps(eng, [["a"]], True, 4)


def test_synced_phases_keeps_each_clock_apart_and_runs_the_inner_timer(engine):
    """Per clock dict: draft (kind "draft") or verify (any other kind) seconds less the capture
    inside them, and the capture; a timer already set runs inside the syncs; restored after,
    even when a body raises."""
    eng = engine([])
    runner = eng.runner

    def inner(kind, block, clock, run):
        eng.log.append(("inner", kind, block))
        return run()
    runner.timer = inner
    mine, other, clocks = {}, {}, {}
    with synced_phases(runner, clocks):
        assert runner.body("draft", 4, mine, 0.5, 0.125) == "draft"
        runner.body("verify", 4, mine, 1.5, 0.0)
        runner.body("target-only", 1, other, 0.25, 0.0)
        runner.body("draft", 2, mine, 0.25, 0.0)
    assert runner.timer is inner
    assert clocks == {id(mine): (mine, {"draft": 0.625, "verify": 1.5, "capture": 0.125}),
                      id(other): (other, {"draft": 0.0, "verify": 0.25, "capture": 0.0})}
    assert clocks[id(mine)][0] is mine and not mine and not other
    assert eng.log[:4] == [SYNC, ("inner", "draft", 4), "draft", SYNC]

    def boom():
        raise ValueError("body failed")
    with pytest.raises(ValueError, match="body failed"):
        with synced_phases(runner, {}):
            runner.timer("draft", 4, {}, boom)
    assert runner.timer is inner
