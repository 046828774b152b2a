"""``train.op_timing`` against its definitions: ``recording_ops`` records the first n calls
(tensors as they were at the call) and leaves the backend as it found it; ``rotated`` by hand;
``time_ops`` on a stand-in backend whose calls move a scripted clock by exact (dyadic) seconds,
so every repeat count, fastest repeat, round, median and ratio is written out by hand."""

from __future__ import annotations

import contextlib

import pytest
import torch

from dflash2rt.train import op_timing

from fake_clock import Clock


class Recorded:
    """A backend with select / verify on its class: each returns its arguments."""

    def select(self, *args, **kwargs):
        return ("select", args, kwargs)

    def verify(self, *args, **kwargs):
        return ("verify", args, kwargs)


def test_recording_ops_records_the_first_n_calls_as_they_were():
    be = Recorded()
    calls = {"select": [], "verify": []}
    x = torch.tensor([1.0, 2.0])
    with op_timing.recording_ops(be, calls, 2):
        assert be.select(x, 3, top=1) == ("select", (x, 3), {"top": 1})
        x.add_(10)                                  # the engine updates its state in place
        be.select(x, 4)
        be.select(x, 5)                             # past n: not recorded
        be.verify(k=7)
    assert [(a[0].tolist(), a[1], kw) for a, kw in calls["select"]] == [
        ([1.0, 2.0], 3, {"top": 1}), ([11.0, 12.0], 4, {})]
    assert calls["verify"] == [((), {"k": 7})]
    assert "select" not in vars(be) and "verify" not in vars(be)   # the class's methods again
    assert be.select(1) == ("select", (1,), {})


def test_recording_ops_restores_instance_attributes_after_an_error():
    be = Recorded()
    own = lambda *a, **k: "own"                     # noqa: E731 - an instance's own attribute
    be.verify = own
    calls = {"select": [], "verify": []}
    with pytest.raises(RuntimeError):
        with op_timing.recording_ops(be, calls, 5):
            assert be.verify(1) == "own"
            raise RuntimeError("stop")
    assert vars(be)["verify"] is own and "select" not in vars(be)
    assert calls == {"select": [], "verify": [((1,), {})]}
    with op_timing.recording_ops(be, calls, 0):     # n = 0 records nothing
        be.select(2)
    assert calls["select"] == []


@pytest.mark.parametrize("items, i, want", [
    ([1, 2, 3], 0, [1, 2, 3]), ([1, 2, 3], 1, [2, 3, 1]), ([1, 2, 3], 2, [3, 1, 2]),
    ([1, 2, 3], 4, [2, 3, 1]), ((5, 6), 3, [6, 5]), ([], 3, []), ([7], 2, [7]),
])
def test_rotated(items, i, want):
    assert op_timing.rotated(items, i) == want


class Timed:
    """A backend whose ``op(k)`` moves ``clock`` by base[op, k] seconds plus the next scripted
    extra of (op, k) (0 when none is left), logging (op, k) per call."""

    def __init__(self, clock: Clock, base: dict, extra: dict) -> None:
        self.clock, self.base, self.extra = clock, base, {k: list(v) for k, v in extra.items()}
        self.log: list[tuple[str, int]] = []
        self.contexts = 0

    def _run(self, op: str, k: int) -> None:
        self.log.append((op, k))
        more = self.extra.get((op, k), [])
        self.clock.now += self.base[op, k] + (more.pop(0) if more else 0.0)

    def select(self, k):
        self._run("select", k)

    def verify(self, k):
        self._run("verify", k)

    @contextlib.contextmanager
    def run_context(self):
        self.contexts += 1
        yield


def _captured(ks):
    return {k: {"select": [((k,), {})], "verify": [((k,), {})]} for k in ks}


S = 2.0 ** -8                                     # dyadic seconds: the clock's sums are exact


def test_time_ops_counts_each_calls_fastest_repeat_and_the_fastest_round(monkeypatch):
    """min_s 8 S, max_repeats 6: select k=4 (S per call) repeats 6 (8 capped), select k=8
    (2 S) 4, verify k=4 (4 S) 2, verify k=8 (32 S > 0.1 s) once. Extras: a slow first repeat
    (left out by the fastest repeat), a round slow in every repeat (left out by the fastest
    round, in the median), slow single runs (verify k=8 in rounds 1 and 2: the paired ratio's
    median is 16 while the fastest rounds' ratio is 8)."""
    clock = Clock(now=0.0).install(monkeypatch, op_timing)
    base = {("select", 4): S, ("select", 8): 2 * S, ("verify", 4): 4 * S, ("verify", 8): 32 * S}
    extra = {("select", 4): [0.0, 8 * S] + [0.0] * 5 + [S / 2] * 6,   # untimed, round 0, 1
             ("select", 8): [0.0] + [0.0] * 4 * 2 + [2 * S] * 4,       # round 2 slow
             ("verify", 4): [0.0, 0.0, 1.0],                          # round 0's 2nd repeat
             ("verify", 8): [0.0, 0.0, 32 * S, 32 * S]}               # rounds 1, 2
    be = Timed(clock, base, extra)
    out = op_timing.time_ops(be, _captured([4, 8]), 3, min_s=8 * S, max_repeats=6)
    ms = 1e3 * S
    want_rounds = {(4, "select"): [ms, 1.5 * ms, ms], (8, "select"): [2 * ms, 2 * ms, 4 * ms],
                   (4, "verify"): [4 * ms] * 3, (8, "verify"): [32 * ms, 64 * ms, 64 * ms]}
    reps = {(4, "select"): 6, (8, "select"): 4, (4, "verify"): 2, (8, "verify"): 1}
    assert list(out) == [4, 8]
    for k in (4, 8):
        for op in ("select", "verify"):
            rounds = want_rounds[k, op]
            first = want_rounds[4, op]
            row = out[k]
            assert row[f"{op}_ms_rounds"] == rounds, (k, op)
            assert row[f"{op}_ms"] == min(rounds)
            assert row[f"{op}_ms_median"] == sorted(rounds)[1]
            assert row[f"{op}_vs_first_k"] == min(rounds) / min(first)
            assert row[f"{op}_vs_first_k_paired"] == sorted(
                a / b for a, b in zip(rounds, first))[1]
            assert row[f"{op}_repeats"] == reps[k, op]
            assert be.log.count((op, k)) == 1 + 3 * reps[k, op]
    assert out[8]["select_vs_first_k_paired"] == 2.0 and out[8]["verify_vs_first_k"] == 8.0
    assert out[8]["verify_vs_first_k_paired"] == 16.0 and out[8]["verify_ms_median"] == 64 * ms
    assert be.contexts == 1
    # untimed pass (each K, select then verify), then the rounds with the K order rotated
    firsts = [k for i, (op, k) in enumerate(be.log)
              if i == 0 or be.log[i - 1] != (op, k)]
    assert firsts == [4, 4, 8, 8] + [4, 4, 8, 8] + [8, 8, 4, 4] + [4, 4, 8, 8]


def test_time_ops_repeat_counts_at_their_bounds(monkeypatch):
    """Defaults min_s 0.02, max_repeats 20: a call of exactly 0.1 s still repeats (twice; only
    one over 0.1 s runs once), one of S runs ⌊0.02 / S⌋ = 5 times, an instant one 20 times; a
    K's seconds per call are the mean over its recorded calls. A first K timed at 0 s in every
    round gives the paired ratio of the unpaired one (no round to pair), not an error."""
    clock = Clock(now=0.0).install(monkeypatch, op_timing)
    base = {("select", 1): 0.1, ("verify", 1): 0.0, ("select", 2): S, ("verify", 2): 0.25}
    be = Timed(clock, base, {})
    captured = {1: {"select": [((1,), {})], "verify": [((1,), {}), ((1,), {})]},
                2: {"select": [((2,), {})] * 3, "verify": [((2,), {})]}}
    out = op_timing.time_ops(be, captured, 1)
    assert [out[k][f"{op}_repeats"] for k in (1, 2) for op in ("select", "verify")] == \
        [2, 20, 5, 1]
    assert be.log.count(("verify", 1)) == 2 * (1 + 20)
    assert be.log.count(("select", 2)) == 3 * (1 + 5)
    assert out[2]["select_ms"] == 1e3 * S and out[2]["verify_ms"] == 250.0
    assert out[1]["verify_ms"] == 0.0
    assert out[2]["verify_vs_first_k"] == out[2]["verify_vs_first_k_paired"] == 0.25 / 1e-12
    assert out[2]["select_vs_first_k"] == pytest.approx(S / 0.1, rel=1e-9)
    assert out[2]["select_vs_first_k_paired"] == out[2]["select_vs_first_k"]


def test_time_ops_counts_an_instant_call_as_one_nanosecond(monkeypatch):
    """A call the clock times at 0 s fills ``min_s`` at 1 ns a run: min_s 10 ns → 10 repeats."""
    clock = Clock(now=0.0).install(monkeypatch, op_timing)
    be = Timed(clock, {("select", 1): 0.0, ("verify", 1): 0.0}, {})
    out = op_timing.time_ops(be, _captured([1]), 1, min_s=1e-8, max_repeats=100)
    assert out[1]["select_repeats"] == out[1]["verify_repeats"] == 10
