"""The op micro-benchmarks of ``qualify`` (``qualify.microbench``) with a scripted clock and a
stand-in backend that records what each op is called with: the median of the timed calls after
one untimed call (the device synced after each), the inputs each op gets at the model's shapes
(seeded, float32), the bytes each op moves, its latency, achieved and peak bandwidth and their
ratio, and the peak looked up in the vendors given. Expected shapes, byte counts and rows are
written out by hand for hidden 8, vocab 32, block 4, 3 taps, 2 groups, top-K 4, rank 2."""

from __future__ import annotations

import types

import pytest
import torch

from dflash2rt.qualify import microbench
from dflash2rt.ops.selector import SelectorParams
from fake_clock import Clock

NS = types.SimpleNamespace
SHAPES = {"hidden": 8, "vocab": 32, "block": 4, "taps": 3, "groups": 2, "top_k": 4, "rank": 2}
CPU = torch.device("cpu")


def test_time_is_the_median_of_the_timed_calls_after_one_untimed_call(monkeypatch):
    clock = Clock(now=0.0).install(monkeypatch, microbench)
    durations = iter([64.0, 1.0, 8.0, 2.0, 16.0, 4.0])
    synced: list = []
    monkeypatch.setattr(microbench, "sync", synced.append)

    def fn():
        clock.now += next(durations)

    assert microbench._time(fn, CPU, 5) == 4.0
    assert synced == [CPU] * 6
    assert next(durations, None) is None


def test_time_of_an_even_count_is_the_mean_of_the_middle_two(monkeypatch):
    clock = Clock(now=0.0).install(monkeypatch, microbench)
    durations = iter([100.0, 2.0, 8.0])
    monkeypatch.setattr(microbench, "sync", lambda d: None)
    assert microbench._time(lambda: setattr(clock, "now", clock.now + next(durations)),
                            CPU, 2) == 5.0


def test_peak_bandwidth_asks_only_the_vendors_given_and_takes_the_first_that_knows():
    none = NS(peak_bandwidth=lambda name: None)
    one = NS(peak_bandwidth=lambda name: {"Card A": 100.0}.get(name))
    two = NS(peak_bandwidth=lambda name: {"Card A": 999.0, "Card B": 50.0}.get(name))
    assert microbench.peak_bandwidth("Card A", [none, one, two]) == 100.0
    assert microbench.peak_bandwidth("Card B", [none, one, two]) == 50.0
    assert microbench.peak_bandwidth("Card C", [none, one, two]) is None
    assert microbench.peak_bandwidth("Card A", []) is None


class Backend:
    """Records each op's arguments; ``select`` answers a distinct result per call."""

    device = CPU

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.first_x = None

    def conv_prepare(self, x, base, delta, b):
        if self.first_x is None:
            self.first_x = x.clone()
        self.calls.append(("conv", tuple(x.shape), tuple(base.shape), tuple(delta.shape), b,
                           x.dtype, base.dtype, delta.dtype))

    def select(self, logits, proj, anchor, cb, cb2, params, sampling, walk):
        n = sum(c[0] == "select" for c in self.calls)
        self.calls.append(("select", tuple(logits.shape), tuple(proj.shape), anchor.tolist(),
                           anchor.dtype, tuple(cb.shape), cb2 is cb, params,
                           sampling.temperature.tolist(), sampling.top_k.tolist(),
                           sampling.top_p.tolist(), tuple(walk.shape), logits.dtype))
        return NS(draft=f"draft{n}", candidates=f"cand{n}", q=f"q{n}")

    def verify(self, vlogits, draft, candidates, q, sampling, noise, check=True):
        self.calls.append(("verify", tuple(vlogits.shape), draft, candidates, q,
                           sampling.temperature.tolist(), tuple(noise.walk.shape), check))


def _run(monkeypatch, peak, **kw):
    seen: list = []

    def fake_time(fn, device, reps):
        seen.append((device, reps))
        fn()
        return 0.5

    monkeypatch.setattr(microbench, "_time", fake_time)
    monkeypatch.setattr(microbench, "peak_bandwidth", lambda name: {"Card A": peak}.get(name))
    be = Backend()
    rows = microbench.op_benchmarks(be, SHAPES, (1, 2), "Card A", **kw)
    return be, rows, seen


def test_each_op_gets_the_model_shapes(monkeypatch):
    be, _, seen = _run(monkeypatch, 100.0)
    f32, i64 = torch.float32, torch.int64
    params = SelectorParams(4, 1.0, None)
    expect = []
    for r, first in ((1, 0), (2, 3)):          # three selects a batch, numbered throughout
        sel = ("select", (r, 3, 32), (r, 3, 2), [0] * r, i64, (32, 2), True, params)
        greedy = sel + ([0.0] * r, [0] * r, [1.0] * r, (r, 3), f32)
        g, s = first, first + 1
        expect += [greedy, sel + ([1.0] * r, [0] * r, [1.0] * r, (r, 3), f32),
                   ("conv", (4 * r, 8), (3, 8), (4 * r, 3, 2), 4, f32, f32, f32), greedy,
                   ("verify", (r, 4, 32), f"draft{g}", f"cand{g}", f"q{g}", [0.0] * r, (r, 3),
                    False),
                   ("verify", (r, 4, 32), f"draft{s}", f"cand{s}", f"q{s}", [1.0] * r, (r, 3),
                    False)]
    assert be.calls == expect
    assert seen == [(CPU, 10)] * 8


def test_inputs_are_seeded(monkeypatch):
    be, _, _ = _run(monkeypatch, 100.0)
    gen = torch.Generator().manual_seed(0)
    assert torch.equal(be.first_x, torch.randn(4, 8, generator=gen))


def test_repetitions_are_passed_on(monkeypatch):
    _, _, seen = _run(monkeypatch, 100.0, reps=3)
    assert seen == [(CPU, 3)] * 8


def test_rows_give_bytes_latency_and_bandwidth_against_the_peak(monkeypatch):
    _, rows, _ = _run(monkeypatch, 100.0)
    nbytes = [("conv", 1, 448), ("select", 1, 576), ("verify_greedy", 1, 512),
              ("verify_sampled", 1, 1536), ("conv", 2, 800), ("select", 2, 1152),
              ("verify_greedy", 2, 1024), ("verify_sampled", 2, 3072)]
    assert [(r["op"], r["batch"], r["bytes"]) for r in rows] == nbytes
    for row, (_, _, b) in zip(rows, nbytes):
        assert set(row) == {"op", "batch", "latency_us", "bytes", "achieved_gbps",
                            "peak_gbps", "fraction_of_peak"}
        assert row["latency_us"] == pytest.approx(500_000.0, rel=1e-12)
        assert row["achieved_gbps"] == pytest.approx(b * 2e-9, rel=1e-12)
        assert row["peak_gbps"] == 100.0
        assert row["fraction_of_peak"] == pytest.approx(b * 2e-11, rel=1e-12)


def test_rows_without_a_known_peak_have_no_fraction(monkeypatch):
    _, rows, _ = _run(monkeypatch, None)
    assert [(r["peak_gbps"], r["fraction_of_peak"]) for r in rows] == [(None, None)] * 8
    assert rows[0]["achieved_gbps"] == pytest.approx(448 * 2e-9, rel=1e-12)
