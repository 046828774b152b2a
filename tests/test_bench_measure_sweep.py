"""dflash2rt.bench.measure where a sweep found classes the other tests let through: a
Measurement's numbers from samples written out by hand (runs, rates, outputs, per-step times,
observed step costs, the empty measurement), fallbacks gathered once each, the warm-up seconds
and ``mean_ms`` on a scripted clock, ``sync`` only off the CPU, the documented seed and goal,
the request helpers' defaults, transformers greedy by default, ``engine_sample``'s seconds,
``warm_caches`` and ``resolve_backend``."""

from __future__ import annotations

import dataclasses
import types

import pytest
import torch

from dflash2rt.backend import TorchOpsBackend
from dflash2rt.bench import measure as bm
from dflash2rt.engine.request import RequestOutput, SamplingParams
from dflash2rt.engine.stats import RunStats
from fake_clock import Clock


def _stats(steps: int, fallbacks=(), step_time=None, **time) -> RunStats:
    st = RunStats("spec", "fake", "cpu", 4, steps=steps, fallbacks=list(fallbacks))
    st.time.update(time)
    st.step_time = step_time or {}
    return st


def test_runs_rates_outputs_of_two_timed_runs_of_two_samples():
    """Run 1: 4 + 4 tokens over 1 + 3 s (2 tok/s); run 2: 6 + 6 over 0.5 + 1.5 s (6 tok/s)."""
    s = [bm.Sample([[1]], 1.0, 4), bm.Sample([[2]], 3.0, 4), bm.Sample([[3]], 0.5, 6),
         bm.Sample([[4]], 1.5, 6)]
    m = bm.Measurement("x", samples=s, timed_runs=2)
    assert m.runs == [s[:2], s[2:]]
    assert m.rates == [2.0, 6.0] and m.tokens_per_s == 4.0
    assert m.outputs == [[3], [4]] and m.tokens == 6
    one = bm.Measurement("y", samples=s[:2], timed_runs=1)       # one run of two samples
    assert one.runs == [s[:2]] and one.rates == [2.0] and one.outputs == [[1], [2]]


def test_a_run_of_zero_seconds_has_no_rate():
    m = bm.Measurement("x", samples=[bm.Sample([[1]], 0.0, 4), bm.Sample([[2]], 2.0, 4)],
                       timed_runs=2)
    assert m.rates == [2.0] and m.tokens_per_s == 2.0


def test_an_empty_measurement_reports_zeros():
    m = bm.Measurement("x")
    assert m.as_dict() == {"tokens_per_s": 0.0, "tau": 0.0, "steps": 0.0,
                           "time_split_per_step_s": dict.fromkeys(bm.PHASES, 0.0),
                           "warmup_s": 0.0, "capture_s": 0.0, "fallbacks": []}
    assert m.tokens == 0 and m.outputs == [] and m.rates == []
    assert m.block_sizes == {} and m.observed_step_s == {}
    assert bm.Sample([[1]], 1.0, 1).capture_s == 0.0


def test_per_step_times_and_observed_step_costs():
    """Phase seconds over steps, the median over samples; a sample of 0 steps counts as 1;
    observed costs: the steps and seconds of every sample summed per (block, batch)."""
    a = _stats(2, draft=0.6, step_time={4: {1: [2, 0.5]}, 1: {1: [1, 0.25]}})
    b = _stats(4, draft=2.0, step_time={4: {1: [3, 1.0], 2: [1, 0.75]}})
    c = _stats(0, draft=0.5)
    m = bm.Measurement("x", samples=[bm.Sample([[0]], 1.0, 1, st) for st in (a, b, c)],
                       timed_runs=3)
    assert m.per_step("draft") == pytest.approx(0.5)       # median of 0.3, 0.5, 0.5
    assert m.steps == 2
    assert m.time_split_per_step_s["verify"] == 0.0
    assert m.observed_step_s == {"1": {"1": 0.25}, "4": {"1": 1.5 / 5, "2": 0.75}}


def test_fallbacks_gathered_once_each_in_order():
    runs = [bm.Sample([[0]], 1.0, 1, _stats(1, ("a", "b"))),
            bm.Sample([[0]], 1.0, 1, _stats(1, ("b", "c"))), bm.Sample([[0]], 1.0, 1)]
    m = bm.Measurement("x")
    m.add_fallbacks(runs)
    assert m.fallbacks == ["a", "b", "c"]
    other = bm.Measurement("y", fallbacks=["c", "d"])
    assert bm.all_fallbacks({"x": m, "y": other}) == ["a", "b", "c", "d"]


def test_warmup_seconds_and_capture_on_a_scripted_clock(monkeypatch):
    clock = Clock().install(monkeypatch, bm)

    def run():
        clock.now += 5.0
        return [bm.Sample([[1]], 1.0, 2, capture_s=0.25)]
    m = bm.measure([bm.Contender("a", run)], 2)["a"]
    assert m.warmup_s == 5.0
    assert m.capture_s == 0.75                              # warm-up and two timed runs


def test_mean_ms_times_n_calls_and_the_closing_sync(monkeypatch):
    """fn takes 2 ms, sync 1 ms: the first call and first sync stay out of the window."""
    clock = Clock().install(monkeypatch, bm)
    events: list[str] = []

    def fn():
        events.append("fn")
        clock.now += 0.002

    def sync():
        events.append("sync")
        clock.now += 0.001
    assert bm.mean_ms(fn, sync, 4) == pytest.approx((4 * 2 + 1) / 4)
    assert events == ["fn", "sync", "fn", "fn", "fn", "fn", "sync"]


def test_sync_waits_only_off_the_cpu(monkeypatch):
    seen: list[torch.device] = []
    monkeypatch.setattr(torch.accelerator, "synchronize", seen.append)
    bm.sync(torch.device("cpu"))
    assert seen == []
    bm.sync(torch.device("cuda", 1))
    assert seen == [torch.device("cuda", 1)]


def test_documented_seed_and_goal_and_frozen_temperatures():
    """docs/benchmarks: prompt i seeded 1234 + i; sampled / greedy step goal <= 1.25."""
    reqs = bm.seeded_requests([(1,), (2,), (3,)], 5, bm.TEMPERATURES[1])
    assert [r.params.seed for r in reqs] == [1234, 1235, 1236]
    assert bm.SAMPLED_OVER_GREEDY_GOAL == 1.25
    t = bm.TEMPERATURES[0]
    assert {t: 1}[bm.Temperature("T=0", 0.0)] == 1                   # hashable, by value
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.temperature = 1.0                                         # type: ignore[misc]


def test_requests_default_to_greedy_seed_0_eos_ignored():
    (r,) = bm.requests([[5, 6]], 3)
    assert r.prompt_ids == (5, 6)
    assert r.params == SamplingParams(max_new_tokens=3, temperature=0.0, seed=0, ignore_eos=True)


def test_transformers_contender_is_greedy_without_a_temperature():
    calls: list[dict] = []

    class HF:
        def generate(self, prompts, max_new, **kw):
            calls.append(kw)
            return [[0] * max_new for _ in prompts], 2.0
    (s,) = bm.hf_contender(HF(), [(1, 2), (3,)], 3).run()
    assert calls == [{}] and (s.seconds, s.tokens, s.capture_s) == (2.0, 6, 0.0)


class _Engine:
    """generate(): 3 s wall, 1 s of it capture; records (spec, block size) per call."""

    def __init__(self, graphs: bool) -> None:
        self.backend = types.SimpleNamespace(graph_adapter=object() if graphs else None)
        self.calls: list[tuple] = []

    def generate(self, reqs, spec=True, block_size=None):
        self.calls.append((spec, block_size))
        st = RunStats("spec" if spec else "target-only", "fake", "cpu", block_size or 8)
        st.wall_s, st.capture_s, st.generated = 3.0, 1.0, 2 * len(reqs)
        return [RequestOutput(r.prompt_ids, [9, 9]) for r in reqs], st


def test_engine_sample_seconds_leave_capture_out():
    eng = _Engine(False)
    s = bm.engine_sample(eng, bm.requests([(1,), (2,)], 2), True, 4)
    assert (s.outputs, s.seconds, s.tokens, s.capture_s) == ([[9, 9], [9, 9]], 2.0, 4, 1.0)
    assert eng.calls == [(True, 4)]


def test_warm_caches_runs_each_mode_once_with_graphs_only():
    eng = _Engine(True)
    assert bm.warm_caches(eng, [(1, 2)], 2, 4) == 3.0
    assert eng.calls == [(False, None), (True, 4), (True, None)]
    eager = _Engine(False)
    assert bm.warm_caches(eager, [(1, 2)], 2, 4) == 0.0 and eager.calls == []


def test_resolve_backend_keeps_an_object_and_looks_up_a_name():
    b = TorchOpsBackend("mine", "cpu", (torch.float32,))
    assert bm.resolve_backend(b) is b
    assert bm.resolve_backend("cpu").name == "cpu"
