"""The load generator behind ``dflash2rt bench serve`` over stand-ins (no server, no model): the
output lengths, nearest-rank percentiles, a run's figures and a pooled row, ``drive`` under a
fake clock (what it sends, when it stops sending, its wall time without the reference's, its
patience), ``Offline`` over a fake engine, ``bench_serve``'s order of runs and references, and
both Markdown tables: every expected value worked out here by hand."""

from __future__ import annotations

import contextlib
import json
import random
import types

import pytest

import dflash2rt.prompts
import dflash2rt.engine.engine
from dflash2rt.serve import load

from fake_clock import Clock

NS = types.SimpleNamespace


# ---- output lengths and percentiles ---------------------------------------------------------

@pytest.mark.parametrize("spec, spread, values", [
    ("1:10", 4, [1, 4, 7, 10]),          # k * 9 / 3
    ("2:5", 3, [2, 4, 5]),               # 1.5 rounds to 2 (half to even)
    ("1:2", 3, [1, 1, 2]),               # 0.5 rounds to 0 (half to even)
    ("3:3", 4, [3, 3, 3, 3]),
    ("1:100", 2, [1, 100]),
    ("7:9", 1, [7]),                      # one length: the lowest
])
def test_a_range_of_lengths_is_spread_evenly_in_a_fixed_shuffled_order(spec, spread, values):
    got = load.output_lengths(spec, spread)
    assert sorted(got) == values
    order = list(values)
    random.Random(0).shuffle(order)       # the fixed order: the same for every run
    assert got == order
    assert [load.length_of(got, k) for k in range(2 * spread + 1)] == got * 2 + got[:1]


def test_one_length_is_every_requests():
    assert load.output_lengths("1", 1) == 1 and load.output_lengths("48", 5) == 48
    assert [load.length_of(7, k) for k in (0, 1, 99)] == [7, 7, 7]


@pytest.mark.parametrize("spec, spread", [
    ("0", 1), ("-3", 1), ("0:4", 2), ("5:4", 2), ("x", 1), ("1:", 2), (":4", 2),
    ("1:2:3", 2), ("", 1), ("4", 0), ("1:4", 0), ("1:4", -1)])
def test_a_bad_length_is_a_value_error_naming_the_forms(spec, spread):
    with pytest.raises(ValueError) as info:
        load.output_lengths(spec, spread)
    assert str(info.value) == f"--max-tokens takes N or LO:HI with 1 <= LO <= HI, got {spec!r}"


def test_percentiles_are_the_mean_and_nearest_ranks_in_milliseconds():
    assert load.percentiles([]) == {"mean": 0.0, "p50": 0.0, "p99": 0.0}
    assert load.percentiles([0.25]) == {"mean": 250.0, "p50": 250.0, "p99": 250.0}
    # 4 values: p50 is the 2nd smallest (rank ceil(2)), p99 the largest (rank ceil(3.96))
    assert load.percentiles([0.5, 0.125, 0.25, 1.0]) == {"mean": 468.75, "p50": 250.0,
                                                         "p99": 1000.0}
    # 200 values 1..200 ms: p50 rank 100, p99 rank 198
    xs = [k / 1000 for k in range(200, 0, -1)]
    got = load.percentiles(xs)
    assert got["p50"] == pytest.approx(100.0) and got["p99"] == pytest.approx(198.0)
    assert got["mean"] == pytest.approx(100.5)
    # 3 values: p50 rank ceil(1.5) = 2
    assert load.percentiles([3.0, 1.0, 2.0])["p50"] == 2000.0


# ---- a run's row, pooled rows ---------------------------------------------------------------

RAW = {"ttft": [0.5, 0.25], "tpot": [0.125], "itl": [0.25, 0.5, 1.5]}


def test_a_runs_figures():
    row = load._figures(3, 4, 2.0, 10, 8.0, 12.0, RAW)
    assert row == {"concurrency": 3, "requests": 4, "wall_s": 2.0, "requests_per_s": 2.0,
                   "output_tokens_per_s": 5.0, "output_tokens": 10,
                   "ttft_ms": {"mean": 375.0, "p50": 250.0, "p99": 500.0},
                   "tpot_ms": {"mean": 125.0, "p50": 125.0, "p99": 125.0},
                   "itl_ms": {"mean": 750.0, "p50": 500.0, "p99": 1500.0},
                   "drafts": 8.0, "accepted": 12.0, "raw": RAW, "acceptance_length": 2.5}
    assert load._figures(1, 1, 0.5, 3, 0.0, 0.0, RAW)["acceptance_length"] == 1.0   # no drafts
    assert load._figures(1, 1, 0.5, 3, 1.0, 0.0, RAW)["acceptance_length"] == 1.0


def test_rounds_pool_into_one_row_over_their_summed_wall_time_and_counters():
    one = load._figures(2, 4, 2.0, 10, 8.0, 12.0, RAW)
    two = load._figures(2, 2, 3.0, 5, 2.0, 13.0, {"ttft": [0.75], "tpot": [], "itl": [0.125]})
    got = load.pooled([one, two])
    assert got == {"concurrency": 2, "requests": 6, "wall_s": 5.0, "requests_per_s": 1.2,
                   "output_tokens_per_s": 3.0, "output_tokens": 15,
                   "ttft_ms": {"mean": 500.0, "p50": 500.0, "p99": 750.0},
                   "tpot_ms": {"mean": 125.0, "p50": 125.0, "p99": 125.0},
                   "itl_ms": {"mean": 593.75, "p50": 250.0, "p99": 1500.0},
                   "drafts": 10.0, "accepted": 25.0, "acceptance_length": 3.5, "rounds": 2}
    assert one["raw"] is RAW and "raw" in one                     # the rounds' rows are kept


def test_the_counters_are_the_last_field_even_with_a_space_in_a_label(monkeypatch):
    text = ('dflash2rt:spec_decode_num_drafts_total{model_name="my model"} 12.0\n'
            'dflash2rt:spec_decode_num_accepted_tokens_total{model_name="a b c"} 40.5\n'
            'dflash2rt:spec_decode_num_drafts_totalx 99.0\n')
    asked = []
    monkeypatch.setattr(load.httpx, "get", lambda url, timeout: asked.append(url) or NS(
        text=text))
    assert load._spec_counters("http://srv") == {"drafts": 12.0, "accepted_tokens": 40.5}
    assert asked == ["http://srv/metrics"]


# ---- drive, under a fake clock --------------------------------------------------------------

class Net:
    """The clients' connections, their selector and the clock in one. A request for n tokens
    sent at s is answered with n text chunks at s + 1, s + 1.5, ... and its usage and [DONE]
    0.25 s after the last: it ends at s + 1.25 + (n - 1) / 2 (``never``: it is never
    answered; ``late``: request number -> its end, in seconds after it was sent). The first
    read of an ended answer reads part of it (not yet an answer); the second, the rest.
    ``reference``: seconds each reference call takes."""

    def __init__(self, late: dict | None = None, never: bool = False) -> None:
        self.clock, self.late, self.never = Clock(100.0), late or {}, never
        self.conns, self.sent, self.closed = [], [], False
        self.selects: list[float] = []

    @property
    def t(self) -> float:
        return self.clock.now

    @t.setter
    def t(self, now: float) -> None:
        self.clock.now = now

    # the selector
    def select(self, timeout: float) -> list:
        self.selects.append(timeout)
        busy = [c for c in self.conns if c.end is not None]
        if busy and not self.never:
            c = min(busy, key=lambda c: c.end)
            if c.end <= self.t + timeout:
                self.t = c.end
                return [(NS(data=c), 1)]
        self.t += timeout
        return []

    def close(self) -> None:
        self.closed = True

    def connection(self, base: str, sel: "Net") -> "Conn":
        assert sel is self and base == "http://srv"
        conn = Conn(self)
        self.conns.append(conn)
        return conn


class Conn:
    def __init__(self, net: Net) -> None:
        self.net, self.end, self.events, self.closed, self.reads = net, None, [], False, 0

    def send(self, path: str, body: dict) -> None:
        assert path == "/v1/completions" and self.end is None
        k, s, n = len(self.net.sent), self.net.t, body["max_tokens"]
        self.net.sent.append((s, body))
        self.end = s + self.net.late.get(k, 1.25 + (n - 1) / 2)
        self.events = [(s + 1 + i / 2, json.dumps({"choices": [{"text": "t"}]}))
                       for i in range(n)]
        self.events.append((self.end, json.dumps({"choices": [], "usage": {
            "completion_tokens": n}})))
        self.events.append((self.end, "[DONE]"))
        self.reads = 0

    def read(self, now: float) -> bool:
        assert now == self.end == self.net.t
        self.reads += 1
        if self.reads == 1:
            return False
        self.end = None
        return True

    def raise_for_status(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def net(monkeypatch):
    """``load``'s connections, selector and clock faked; /metrics counting 4 drafts and 6
    accepted tokens over each run."""
    box: list[Net] = []

    def make(**kw) -> Net:
        n = Net(**kw)
        box.append(n)
        counters = iter([{"drafts": 10.0, "accepted_tokens": 30.0},
                         {"drafts": 14.0, "accepted_tokens": 36.0}])
        monkeypatch.setattr(load, "SSEConnection", n.connection)
        monkeypatch.setattr(load, "selectors", NS(DefaultSelector=lambda: n))
        n.clock.install(monkeypatch, load)
        monkeypatch.setattr(load, "_spec_counters", lambda base: next(counters))
        return n
    return make


def _body(prompt: str, n: int) -> dict:
    return {"model": "m", "prompt": prompt, "stream": True, "max_tokens": n, "temperature": 0,
            "ignore_eos": True, "stream_options": {"include_usage": True}}


def test_drive_keeps_each_client_busy_until_the_requests_are_sent(net):
    n = net()
    row = load.drive("http://srv", "m", ["p0", "p1"], 2, 3, [2, 4], 1000.0)
    # request 0 (2 tokens) 100 -> 101.75; request 1 (4 tokens) 100 -> 102.75; request 2 goes
    # on the first client free, at 101.75, and ends at 103.5
    assert n.sent == [(100.0, _body("p0", 2)), (100.0, _body("p1", 4)),
                      (101.75, _body("p0", 2))]
    assert row["raw"] == {"ttft": [1.0, 1.0, 1.0], "tpot": [0.75, 1.75 / 3, 0.75],
                          "itl": [0.5, 0.5, 0.5, 0.5, 0.5]}
    assert row["wall_s"] == 3.5 and row["requests"] == 3 and row["output_tokens"] == 8
    assert row["requests_per_s"] == 3 / 3.5 and row["output_tokens_per_s"] == 8 / 3.5
    assert (row["drafts"], row["accepted"], row["acceptance_length"]) == (4.0, 6.0, 2.5)
    assert row["concurrency"] == 2 and "paired" not in row
    assert [c.closed for c in n.conns] == [True, True] and n.closed
    assert set(n.selects) == {1.0}


def test_drive_sends_nothing_more_once_the_time_limit_has_passed(net):
    n = net()               # one client, 1.75 s a request: at 101.75 the limit has passed
    row = load.drive("http://srv", "m", ["p"], 1, 10, 2, 1.75)
    assert [s for s, _ in n.sent] == [100.0] and row["requests"] == 1
    n = net()
    row = load.drive("http://srv", "m", ["p"], 1, 10, 2, 1.875)
    assert [s for s, _ in n.sent] == [100.0, 101.75] and row["requests"] == 2
    assert row["wall_s"] == 3.5


def test_the_references_time_counts_neither_in_the_wall_time_nor_against_the_limit(net):
    n = net()
    asked = []

    def reference(k: int) -> float:
        asked.append((k, n.t))
        n.t += 10.0                        # the reference takes 10 s
        return 0.5 + k

    # requests of 1, 2, 2 tokens: 1.25, 1.75, 1.75 s; the one-token request has no TPOT and
    # no reference; the limit, 3.25 s, passes only after the third request was sent
    row = load.drive("http://srv", "m", ["p"], 1, 3, [1, 2, 2], 3.25, reference=reference)
    assert [s for s, _ in n.sent] == [100.0, 101.25, 113.0]
    assert asked == [(1, 103.0), (2, 114.75)]
    assert row["paired"] == [(0.75, 1.5), (0.75, 2.5)]
    assert row["wall_s"] == 1.25 + 1.75 + 1.75 and row["requests"] == 3
    with pytest.raises(ValueError, match="a per-request reference needs concurrency 1"):
        load.drive("http://srv", "m", ["p"], 2, 3, 2, 10.0, reference=reference)


def test_drive_waits_for_a_slow_request_up_to_its_patience(net, monkeypatch):
    monkeypatch.setattr(load, "PATIENCE_S", 6.0)
    n = net(late={0: 6.0})                 # 6 s after it was sent it is still in time
    assert load.drive("http://srv", "m", ["p"], 1, 1, 2, 1.0)["wall_s"] == 6.0
    n = net(late={0: 9.0})                 # a time limit beyond the patience is the patience
    assert load.drive("http://srv", "m", ["p"], 1, 1, 2, 9.0)["wall_s"] == 9.0
    n = net(late={0: 7.5})
    with pytest.raises(TimeoutError) as info:
        load.drive("http://srv", "m", ["p"], 1, 1, 2, 1.0)
    assert str(info.value) == "a request went unanswered for 6 s" and n.t == 107.0
    n = net(never=True)
    with pytest.raises(TimeoutError) as info:
        load.drive("http://srv", "m", ["p"], 2, 4, 2, 8.0)
    assert str(info.value) == "a request went unanswered for 8 s" and n.t == 109.0
    assert [c.closed for c in n.conns] == [True, True] and n.closed


# ---- Offline, over a fake engine ------------------------------------------------------------

class FakeEngine:
    def __init__(self, pair, backend, table) -> None:
        self.made, self.calls, self.closed = (pair, backend, table), [], False
        self.stats = NS(wall_s=1.5, time={"prefill": 0.25}, generated=6, tokens_per_s=123.0)

    def generate(self, reqs, spec, block):
        self.calls.append((reqs, spec, block))
        return "outputs", self.stats

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def offline(monkeypatch):
    monkeypatch.setattr(dflash2rt.prompts, "encode_prompts",
                        lambda pair, prompts: [(len(p), 1) for p in prompts])
    monkeypatch.setattr(dflash2rt.engine.engine, "Engine", FakeEngine)


@pytest.mark.parametrize("block, spec, fixed", [
    (1, False, None), (2, True, 2), (8, True, 8), (None, True, None)])
def test_offline_runs_the_servers_mode(offline, block, spec, fixed):
    with load.Offline("pair", "be", block, ["ab", "c"], 4, table="tbl") as off:
        assert (off.spec, off.block) == (spec, fixed)
        assert off.engine.made == ("pair", "be", "tbl")
        off.static(1)
        assert off.engine.calls[0][1:] == (spec, fixed)
    assert off.engine.closed


def test_offline_requests_and_figures(offline):
    with load.Offline("pair", "be", 8, ["ab", "c"], [3, 9, 5]) as off:
        eng = off.engine
        assert eng.made == ("pair", "be", None)
        off.warm(4)
        assert [len(reqs) for reqs, _, _ in eng.calls] == [1, 4]
        reqs = eng.calls[1][0]
        assert [r.prompt_ids for r in reqs] == [(2, 1), (1, 1), (2, 1), (1, 1)]
        assert [r.params.max_new_tokens for r in reqs] == [3, 9, 5, 3]
        assert [r.key for r in reqs] == [0, 1, 2, 3]
        assert all(r.params.ignore_eos and r.params.temperature == 0 for r in reqs)
        assert off.alone(4) == 1.25 / 5                 # decode seconds per later token
        (r,), _, _ = eng.calls[-1]
        assert (r.key, r.prompt_ids, r.params.max_new_tokens) == (4, (2, 1), 9)
        assert off.static(3) == 123.0 and len(eng.calls[-1][0]) == 3
        for generated in (2, 1, 0):                     # no later token: over one
            eng.stats.generated = generated
            assert off.alone(0) == 1.25


# ---- bench_serve, over fake servers, runs and references ------------------------------------

def _row(c: int, k: int) -> dict:
    """Run k's row at concurrency c (k counts every run of the bench)."""
    return {"concurrency": c, "requests": 2, "wall_s": 2.0, "output_tokens": 8 * c + k,
            "drafts": 4.0, "accepted": 2.0 + k,
            "raw": {"ttft": [0.5 * c], "tpot": [0.25], "itl": [0.125 * k]},
            "output_tokens_per_s": 100.0 * c + k, "tpot_ms": {"mean": 10.0 + k},
            "acceptance_length": 1.5}


class Bench:
    """What ``bench_serve`` did, in order."""

    def __init__(self, monkeypatch, one_token: bool = False) -> None:
        self.one_token = one_token              # every request 1 token: none has a TPOT
        self.log: list = []
        self.lines: list[str] = []
        self.runs = 0
        self.static_values = iter([200.0, 300.0, 220.0, 260.0, 400.0, 500.0, 100.0, 300.0])
        monkeypatch.setattr(load, "drive", self.drive)

    def drive(self, base, model, prompts, c, requests, max_tokens, time_limit,
              reference=None):
        self.log.append(("drive", base, model, tuple(prompts), c, requests, max_tokens,
                         time_limit, reference is not None))
        if requests == 2 and c == 1 and reference is None:
            return {"warm-up": True}
        row = _row(c, self.runs)
        self.runs += 1
        if reference is not None:
            row["paired"] = [] if self.one_token else [(0.02, reference(0)),
                                                       (0.04, reference(1))]
        return row

    @contextlib.contextmanager
    def start(self, name: str):
        self.log.append(("start", name))
        yield NS(base=f"http://{name}", model=f"model-{name}")
        self.log.append(("stop", name))

    def baseline(self, name: str) -> "Bench":
        self.log.append(("baseline", name))
        self.name = name
        return self

    def __enter__(self) -> "Bench":
        return self

    def __exit__(self, *exc) -> None:
        self.log.append(("baseline closed", self.name))

    def warm(self, batch: int) -> None:
        self.log.append(("warm", batch))

    def alone(self, k: int) -> float:
        self.log.append(("alone", k))
        return 0.01 * (k + 1)                  # 0.01, 0.02: mean 0.015

    def static(self, batch: int) -> float:
        self.log.append(("static", batch))
        return next(self.static_values)


def test_bench_serve_runs_each_contender_in_rounds_beside_its_references(monkeypatch):
    b = Bench(monkeypatch)
    res = load.bench_serve(b.start, b.baseline, ["p"], [1, 4], 6, 5, 30.0, b.lines.append,
                           contenders=("spec", "target-only"), rounds=2)
    per = []
    for name in ("spec", "target-only"):
        run = ("drive", f"http://{name}", f"model-{name}", ("p",))
        per += [("start", name), ("baseline", name), (*run, 1, 2, 5, 30.0, False), ("warm", 4)]
        for _ in range(2):
            per += [(*run, 1, 6, 5, 30.0, True), ("alone", 0), ("alone", 1),
                    ("static", 4), (*run, 4, 6, 5, 30.0, False), ("static", 4)]
        per += [("baseline closed", name), ("stop", name)]
    assert b.log == per
    # runs 0..7: spec c=1 (0, 2), c=4 (1, 3); target-only c=1 (4, 6), c=4 (5, 7)
    ratio = 0.03 / 0.015
    spec, target = res["offline"]["spec"], res["offline"]["target-only"]
    assert spec["batch"] == 4 and spec["tpot_ms"] == pytest.approx([15.0, 15.0])
    assert spec["tpot_ratio"] == pytest.approx([ratio, ratio])
    assert spec["tokens_per_s"] == [250.0, 240.0]
    assert spec["throughput_ratio"] == [401.0 / 250.0, 403.0 / 240.0]
    assert spec["tokens_per_s_median"] == 245.0
    assert spec["throughput_ratio_median"] == pytest.approx((401 / 250 + 403 / 240) / 2)
    assert spec["tpot_ms_median"] == pytest.approx(15.0)
    assert target["tokens_per_s"] == [450.0, 200.0]
    assert target["throughput_ratio"] == [405.0 / 450.0, 407.0 / 200.0]
    rows = res["rows"]
    assert [(r["server"], r["concurrency"], r["rounds"]) for r in rows] == [
        ("spec", 1, 2), ("spec", 4, 2), ("target-only", 1, 2), ("target-only", 4, 2)]
    assert rows[1]["output_tokens"] == 33 + 35 and rows[1]["wall_s"] == 4.0
    assert rows[1]["accepted"] == 3.0 + 5.0 and rows[1]["acceptance_length"] == 2.0
    assert rows[2]["itl_ms"]["mean"] == pytest.approx(1e3 * 0.125 * 5)
    assert "paired" not in rows[0]
    assert b.lines[:2] == [
        "spec         c=  1: 100.0 tok/s, TPOT mean 10.00 ms, acceptance length 1.50; "
        "run() alone 15.00 ms/token, paired ratio 2.000",
        "spec         c=  4: 401.0 tok/s, TPOT mean 11.00 ms, acceptance length 1.50; "
        "run() static 250.0 tok/s"]
    assert b.lines[7] == ("target-only  c=  4: 407.0 tok/s, TPOT mean 17.00 ms, acceptance "
                          "length 1.50; run() static 200.0 tok/s")
    assert len(b.lines) == 8


def test_bench_serve_at_one_concurrency_both_references_apply(monkeypatch):
    b = Bench(monkeypatch)
    res = load.bench_serve(b.start, b.baseline, ["p"], [1], 6, 5, 30.0, b.lines.append,
                           contenders=("spec",), rounds=1)
    assert [e[0] for e in b.log if e[0] in ("static", "alone")] == [
        "static", "alone", "alone", "static"]
    off = res["offline"]["spec"]
    assert off["tokens_per_s"] == [250.0] and off["throughput_ratio"] == [100.0 / 250.0]
    assert b.lines == ["spec         c=  1: 100.0 tok/s, TPOT mean 10.00 ms, acceptance "
                       "length 1.50; run() alone 15.00 ms/token, paired ratio 2.000; run() "
                       "static 250.0 tok/s"]


def test_bench_serve_without_concurrency_1_has_no_tpot_reference(monkeypatch):
    b = Bench(monkeypatch)
    res = load.bench_serve(b.start, b.baseline, ["p"], [2, 8], 6, 5, 30.0, b.lines.append,
                           contenders=("adaptive",))
    assert sum(e[0] == "drive" for e in b.log) == 1 + 3 * 2          # three rounds by default
    off = res["offline"]["adaptive"]
    assert off["tpot_ratio"] == [] and "tpot_ratio_median" not in off
    assert off["batch"] == 8 and len(off["tokens_per_s"]) == 3
    assert b.log.count(("warm", 8)) == 1


def test_bench_serve_at_one_token_a_request_has_no_tpot_reference(monkeypatch):
    """Requests of one token have no TPOT, so nothing to pair at concurrency 1: the TPOT
    references stay empty (the targets table shows dashes) and the rest goes on."""
    b = Bench(monkeypatch, one_token=True)
    res = load.bench_serve(b.start, b.baseline, ["p"], [1, 4], 6, 1, 30.0, b.lines.append,
                           contenders=("spec",), rounds=2)
    off = res["offline"]["spec"]
    assert off["tpot_ms"] == off["tpot_ratio"] == [] and "tpot_ratio_median" not in off
    assert off["tokens_per_s"] == [250.0, 240.0] and ("alone", 0) not in b.log
    assert b.lines[0] == "spec         c=  1: 100.0 tok/s, TPOT mean 10.00 ms, acceptance " \
                         "length 1.50"
    assert "paired" not in res["rows"][0]
    assert load.targets(res).splitlines()[2] == \
        "| spec | 250.00 | – | – | 17.0 | 245.0 | 1.64 (1.60–1.68) |"


# ---- the tables -----------------------------------------------------------------------------

def _res() -> dict:
    trio = {"mean": 1.25, "p50": 2.0, "p99": 3.75}
    rows = [{"server": "spec", "concurrency": 1, "requests": 5, "requests_per_s": 2.5,
             "output_tokens_per_s": 40.25, "ttft_ms": trio, "tpot_ms": {**trio, "mean": 9.125},
             "itl_ms": trio, "acceptance_length": 3.5},
            {"server": "spec", "concurrency": 8, "requests": 16, "requests_per_s": 12.0,
             "output_tokens_per_s": 300.75, "ttft_ms": trio, "tpot_ms": trio,
             "itl_ms": trio, "acceptance_length": 3.25},
            {"server": "spec", "concurrency": 4, "requests": 8, "requests_per_s": 8.0,
             "output_tokens_per_s": 200.0, "ttft_ms": trio, "tpot_ms": trio,
             "itl_ms": trio, "acceptance_length": 3.0}]
    off = {"spec": {"tpot_ms_median": 4.5, "tpot_ratio": [2.0, 1.5, 3.0],
                    "tokens_per_s_median": 250.5, "throughput_ratio": [1.25, 0.75]}}
    return {"rows": rows, "offline": off}


def test_the_rows_table():
    head = ("| server | concurrency | requests | req/s | output tok/s | TTFT mean / p50 / p99 ms "
            "| TPOT mean / p50 / p99 ms | ITL mean / p50 / p99 ms | acceptance length |\n"
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
    assert load.markdown(_res()) == head + (
        "| spec | 1 | 5 | 2.50 | 40.2 | 1.2 / 2.0 / 3.8 | 9.1 / 2.0 / 3.8 | 1.2 / 2.0 / 3.8 "
        "| 3.50 |\n"
        "| spec | 8 | 16 | 12.00 | 300.8 | 1.2 / 2.0 / 3.8 | 1.2 / 2.0 / 3.8 | 1.2 / 2.0 / 3.8 "
        "| 3.25 |\n"
        "| spec | 4 | 8 | 8.00 | 200.0 | 1.2 / 2.0 / 3.8 | 1.2 / 2.0 / 3.8 | 1.2 / 2.0 / 3.8 "
        "| 3.00 |\n")
    assert load.markdown({"rows": []}) == head


def test_the_targets_table_takes_concurrency_1_and_the_largest():
    assert load.targets(_res()) == (
        "| server | TPOT c=1 mean ms | run() alone ms/token | ratio (range) | output tok/s at "
        "the largest c | run() static batch tok/s | ratio (range) |\n"
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n"
        "| spec | 9.12 | 4.50 | 2.00 (1.50–3.00) | 300.8 | 250.5 | 1.00 (0.75–1.25) |\n")
