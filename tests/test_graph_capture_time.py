"""Each graph bucket's capture time in runner and run stats, timed on a fake clock."""

from __future__ import annotations

import torch

from dflash2rt.engine.engine import Engine
from dflash2rt.engine.mode import graph_delta, merge_graph_stats
from dflash2rt.graphs import runner as runner_module

from test_engine_graphs import ReplayAdapter, _backend, _reqs
from test_graph_runner import FakeAdapter, live, make_runner
from tiny_models import tiny_pair


class FakeClock:
    """``time.perf_counter`` that moves only when told: a body run costs 1 s, a capture 10 s
    (the fake adapter's capture also runs the body once), a replay 100 s."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


class TimedAdapter(FakeAdapter):
    def __init__(self, clock: FakeClock, **kw) -> None:
        super().__init__(**kw)
        self.clock = clock

    def capture(self, fn, pool):
        self.clock.now += 10.0
        graph = super().capture(fn, pool)
        inner = graph.replay

        def replay():
            self.clock.now += 100.0
            inner()
        graph.replay = replay
        return graph


def _timed_runner(monkeypatch, **kw):
    clock = FakeClock()
    monkeypatch.setattr(runner_module, "time", clock)
    adapter = TimedAdapter(clock, **kw)
    runner = make_runner(adapter, torch.zeros(8))
    body = runner.body

    def timed(inp):
        clock.now += 1.0
        return body(inp)
    runner.body = timed
    return runner, clock


def test_each_bucket_reports_its_own_capture_and_warm_up_time(monkeypatch):
    runner, clock = _timed_runner(monkeypatch)
    fallbacks = []
    runner.run(live(3), fallbacks.append)        # bucket 4: warm-up ×2, capture, checked replay
    st = runner.stats()
    assert st[4]["warmup_ms"] == 2000.0                          # two eager warm-up runs
    assert st[4]["capture_ms"] == 2000.0 + 10000.0 + 1000.0 + 100000.0 + 1000.0
    runner.run(live(3), fallbacks.append)        # a replay (and the fresh check): no capture
    assert runner.stats()[4]["capture_ms"] == st[4]["capture_ms"]
    runner.run(live(1), fallbacks.append)        # bucket 1: a capture of its own
    st = runner.stats()
    assert set(st) == {1, 4} and st[1]["capture_ms"] == st[4]["capture_ms"]
    assert runner.capture_s * 1e3 == st[1]["capture_ms"] + st[4]["capture_ms"]
    assert fallbacks == []


def test_a_refused_capture_still_reports_its_time(monkeypatch):
    runner, _ = _timed_runner(monkeypatch, fail_sizes={2})
    fallbacks = []
    runner.run(live(2), fallbacks.append)
    st = runner.stats()[2]
    assert st["captured"] is False and st["warmup_ms"] == 2000.0
    assert st["capture_ms"] == 2000.0 + 10000.0                 # warm-up + the refused capture
    assert len(fallbacks) == 1


def test_a_bucket_not_captured_yet_reports_zero():
    runner = make_runner(FakeAdapter(), torch.zeros(8))
    runner._new_bucket(8)
    assert runner.stats()[8]["capture_ms"] == 0.0 and runner.stats()[8]["warmup_ms"] == 0.0


def test_merging_block_sizes_keeps_the_longest_capture():
    part = {"captured": True, "verified": True, "fresh": True, "replays": 1, "eager": 0,
            "refused": None}
    a = {"verify greedy": {4: {**part, "capture_ms": 30.0, "warmup_ms": 20.0}}}
    b = {"verify greedy": {4: {**part, "capture_ms": 50.0, "warmup_ms": 5.0},
                           1: {**part, "capture_ms": 7.0, "warmup_ms": 1.0}}}
    got = merge_graph_stats([a, b])["verify greedy"]
    assert got[4]["capture_ms"] == 50.0 and got[4]["warmup_ms"] == 20.0
    assert got[4]["replays"] == 2 and got[1]["capture_ms"] == 7.0
    assert graph_delta({}, b)["verify greedy"][4]["capture_ms"] == 50.0


def test_run_stats_give_every_captured_bucket_its_capture_time():
    """A run's stats.graphs: every bucket the run captured has capture_ms ≥ warmup_ms > 0, and
    the sum over graphs and buckets is the run's capture_s; a later call that replays keeps
    reporting the buckets' capture times, with capture_s 0."""
    pair = tiny_pair("dflash2", block=4)
    with Engine(pair, _backend(ReplayAdapter())) as engine:
        _, first = engine.generate(_reqs((0.0, 1.0, 0.6)), block_size=4)
        buckets = [b for bs in first.graphs.values() for b in bs.values()]
        assert buckets and all(b["capture_ms"] >= b["warmup_ms"] > 0 for b in buckets)
        total = sum(b["capture_ms"] for b in buckets)
        assert abs(total - 1e3 * first.capture_s) <= 1e-6 * total
        _, again = engine.generate(_reqs((0.0, 1.0, 0.6)), block_size=4)
        assert again.capture_s == 0 and again.graphs
        for g, bs in again.graphs.items():
            for size, b in bs.items():
                assert b["capture_ms"] == first.graphs[g][size]["capture_ms"]
