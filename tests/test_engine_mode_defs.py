"""The decode step's mode against its documented contract: graph counters' per-run arithmetic
(``graph_delta``, ``merge_graph_stats``) against hand-written values field by field, static
inputs and pads against the documented inert values, and the step's wiring (bodies, clock,
timer, reports, runners) against fake bodies with scripted seconds."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from dflash2rt.engine import mode as mode_module
from dflash2rt.engine import stages
from dflash2rt.engine.bodies import StepOut
from dflash2rt.engine.extensions import EAGER_PROCS
from dflash2rt.engine.mode import (CONSTANTS, DRAFTED, Mode, graph_delta,
                                   merge_graph_stats)

NOISE_NAMES = ("walk", "accept", "residual", "bonus")


# ---- graph_delta ------------------------------------------------------------------------------
def _s(replays, eager, **kw):
    return {"captured": True, "verified": True, "fresh": True, "replays": replays,
            "eager": eager, "refused": None, "capture_ms": 7.0, "warmup_ms": 3.0, **kw}


def test_delta_subtracts_replays_and_eager_runs_and_keeps_the_rest_from_after():
    before = {"g": {1: _s(3, 1), 2: _s(5, 0), 4: _s(2, 2)}}
    after = {"g": {1: _s(7, 1, captured=False), 2: _s(5, 4), 4: _s(2, 2), 8: _s(1, 0)},
             "h": {1: _s(0, 2, refused="x")}}
    got = graph_delta(before, after)
    assert got == {"g": {1: _s(4, 0, captured=False),        # replays only
                         2: _s(0, 4),                          # eager only
                         8: _s(1, 0)},                         # a bucket new to the run
                   "h": {1: _s(0, 2, refused="x")}}            # a graph new to the run
    # a bucket the run did not use is left out, and so is a graph with no used bucket
    assert graph_delta(after, after) == {}
    assert graph_delta({}, {}) == {}


def test_delta_of_each_counter_alone():
    for r, e in ((1, 0), (0, 1)):
        assert graph_delta({"g": {4: _s(10, 10)}}, {"g": {4: _s(10 + r, 10 + e)}}) == \
            {"g": {4: _s(r, e)}}
    assert graph_delta({"g": {4: _s(10, 10)}}, {"g": {4: _s(10, 10)}}) == {}


# ---- merge_graph_stats ------------------------------------------------------------------------
def _m(**kw):
    base = {"captured": True, "verified": True, "fresh": None, "replays": 0, "eager": 0,
            "refused": None, "capture_ms": 0.0, "warmup_ms": 0.0}
    return {**base, **kw}


def _merge2(a, b):
    return merge_graph_stats([{"g": {4: a}}, {"g": {4: b}}])["g"][4]


def test_merge_keeps_a_single_part_as_it_is():
    part = {"g": {4: _m(replays=3, fresh=False)}, "h": {1: _m(eager=2)}}
    assert merge_graph_stats([part]) == part
    assert merge_graph_stats([]) == {}


@pytest.mark.parametrize("field", ["captured", "verified"])
def test_merge_holds_captured_and_verified_only_when_every_part_does(field):
    for a in (True, False):
        for b in (True, False):
            assert _merge2(_m(**{field: a}), _m(**{field: b}))[field] is (a and b), (a, b)


def test_merge_fresh_ignores_parts_that_do_not_know_and_joins_the_others():
    table = {(None, None): None, (None, True): True, (None, False): False,
             (True, None): True, (False, None): False, (True, True): True,
             (True, False): False, (False, True): False, (False, False): False}
    for (a, b), want in table.items():
        assert _merge2(_m(fresh=a), _m(fresh=b))["fresh"] is want, (a, b)


def test_merge_sums_counts_keeps_the_first_refusal_and_the_longest_stall():
    got = _merge2(_m(replays=3, eager=1, refused=None, capture_ms=5.0, warmup_ms=2.0),
                  _m(replays=4, eager=6, refused="late", capture_ms=4.0, warmup_ms=3.0))
    assert (got["replays"], got["eager"], got["refused"]) == (7, 7, "late")
    assert (got["capture_ms"], got["warmup_ms"]) == (5.0, 3.0)
    assert _merge2(_m(refused="first"), _m(refused="second"))["refused"] == "first"
    assert _merge2(_m(refused="first"), _m(refused=None))["refused"] == "first"
    assert _merge2(_m(refused=None), _m(refused=None))["refused"] is None
    three = merge_graph_stats([{"g": {4: _m(replays=1, eager=10)}}] * 3)["g"][4]
    assert (three["replays"], three["eager"]) == (3, 30)


def test_merge_reads_a_missing_time_as_zero():
    a, b = _m(), _m(capture_ms=0.25, warmup_ms=0.5)
    del a["capture_ms"], a["warmup_ms"]
    got = _merge2(a, b)
    assert (got["capture_ms"], got["warmup_ms"]) == (0.25, 0.5)
    got = _merge2(b, a)
    assert (got["capture_ms"], got["warmup_ms"]) == (0.25, 0.5)
    c = dict(a)
    got = _merge2(a, c)
    assert (got["capture_ms"], got["warmup_ms"]) == (0.0, 0.0)


def test_merge_keeps_graphs_and_buckets_apart():
    got = merge_graph_stats([{"g": {1: _m(replays=1)}, "h": {1: _m(replays=10)}},
                             {"g": {2: _m(replays=100)}, "h": {1: _m(replays=1000)}}])
    assert {n: {s: d["replays"] for s, d in b.items()} for n, b in got.items()} == \
        {"g": {1: 1, 2: 100}, "h": {1: 1010}}


# ---- static inputs and pads -------------------------------------------------------------------
# Padded rows are inert (module docstring): greedy, length 0, committing nothing (live False);
# sampling parameters at their "off" values (SamplingBatch: temperature 0, top_k 0, top_p 1).
INERT = {"greedy": True, "lens": 0, "live": False, "temperature": 0.0, "top_k": 0,
         "top_p": 1.0}
DTYPES = {"anchor": torch.int64, "lens": torch.int64, "seed": torch.int64,
          "key": torch.int64, "temperature": torch.float32, "top_k": torch.int64,
          "top_p": torch.float32, "greedy": torch.bool, "live": torch.bool}


def test_buckets_are_the_powers_of_two_up_to_32():
    assert mode_module.BUCKETS == tuple(2 ** i for i in range(6))
    assert CONSTANTS == {"seed", "key", "temperature", "top_k", "top_p", "greedy", "live"}


class _Ext:
    graph_label = "marked"

    @classmethod
    def static_inputs(cls, key, size, device):
        return {"ext_state": torch.full((size, key), 9, device=device)}

    @classmethod
    def pads(cls):
        return {"ext_state": -1}


def _bodies(block, calls=None, clock=None, costs=None):
    """Fake StepBodies: each body appends its call, advances ``clock`` by its cost and returns
    tensors named after it."""
    calls = [] if calls is None else calls

    def body(kind):
        def run(inp, sampled, ctx_len, host=None, graphed=()):
            calls.append((kind, inp, sampled, ctx_len, host, graphed))
            if clock is not None:
                clock.now += costs[kind]
            r = 3
            if kind == "draft":
                return {"draft": torch.full((r, 2), 5), "lens": torch.full((r,), 40),
                        "anchor": torch.full((r,), 41)}
            return {"accept_len": torch.arange(r), "tokens": torch.ones(r, 1, dtype=torch.long),
                    "flags": torch.zeros(r, dtype=torch.long), "lens": torch.full((r,), 2),
                    "anchor": torch.full((r,), 8), "extra": torch.zeros(1)}
        return run
    return SimpleNamespace(block=block, pair="pair", storage=(torch.zeros(1), None),
                           backend=SimpleNamespace(implementation={"attention": "x"}),
                           draft=body("draft"), verify=body("verify"),
                           target_only=body("target-only"))


def test_pads_are_the_documented_inert_values():
    pads = Mode._pads("draft")
    assert set(pads) == set(DTYPES)
    for name, value in INERT.items():
        assert pads[name] == value and type(pads[name]) is type(value), name
    ver = Mode._pads("verify", ((_Ext, 2),))
    assert ver["ext_state"] == -1
    # the draft's outputs and the noise: any value is inert there (the runner returns rows
    # [:R] only); each has a pad
    assert set(ver) == set(pads) | {"ext_state", "draft", "cand", "q", "draft_bad",
                                    "lattice_bad", "pos", *NOISE_NAMES}
    assert "draft" not in Mode._pads("target-only") and "ext_state" not in pads


def test_static_inputs_hold_the_pads_in_their_shapes_and_dtypes(monkeypatch):
    monkeypatch.setattr(stages, "selector_params", lambda pair: SimpleNamespace(top_k=3))
    m = Mode(_bodies(block=5), adapter=None)
    for kind in ("draft", "target-only", "verify"):
        out = m.static_inputs(kind, ((_Ext, 2),), 4)
        for name, dtype in DTYPES.items():
            assert out[name].shape == (4,) and out[name].dtype == dtype, (kind, name)
        for name, value in INERT.items():
            assert out[name].eq(value).all(), (kind, name)
        assert out["ext_state"].shape == (4, 2) and out["ext_state"].eq(9).all()
        if kind != "verify":
            assert "draft" not in out
    out = m.static_inputs("verify", (), 4)
    g, k = 4, 3                                                  # gamma = block - 1
    shapes = {"draft": (4, g), "cand": (4, g, k), "q": (4, g, k), "draft_bad": (4,),
              "lattice_bad": (4,), "bonus": (4,), "pos": (4, g + 1), "walk": (4, g),
              "accept": (4, g), "residual": (4, g)}
    for name, shape in shapes.items():
        assert tuple(out[name].shape) == shape, name
    for name in ("draft", "cand", "pos"):
        assert out[name].dtype == torch.int64, name
    for name in ("draft_bad", "lattice_bad"):
        assert out[name].dtype == torch.bool, name


def test_verify_reads_the_draft_outputs_in_place_only_where_that_draft_graph_was_captured(
        monkeypatch):
    monkeypatch.setattr(stages, "selector_params", lambda pair: SimpleNamespace(top_k=3))
    m = Mode(_bodies(block=3), adapter=None)
    outs = {n: torch.full((2,), 7) for n in DRAFTED}
    captured = SimpleNamespace(graph=object(), outputs=outs)
    refused = SimpleNamespace(graph=None, outputs=outs)
    m.runners[("draft", True, ())] = SimpleNamespace(state={2: captured, 4: refused})
    got = m.static_inputs("verify", (), 2, drafted=True)
    assert all(got[n] is outs[n] for n in DRAFTED)
    for size, drafted, exts in ((4, True, ()), (8, True, ()), (2, False, ()),
                                (2, None, ()), (2, True, ((_Ext, 1),))):
        got = m.static_inputs("verify", exts, size, drafted=drafted)
        assert not any(got[n] is outs.get(n) for n in DRAFTED), (size, drafted, exts)
        assert got["draft"].eq(0).all()


# ---- the step ---------------------------------------------------------------------------------
class FakeClock:
    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        return self.now


class _RowExt:
    graph_label = "wm"

    def __init__(self, said):
        self.said = said

    def reports(self, kind, implementation):
        return [f"{self.said} {kind} {sorted(implementation)}"]

    def graph_key(self):
        return ("k", self.said)

    def graph_inputs(self):
        return {f"ext_{self.said}": torch.zeros(3)}

    @classmethod
    def pads(cls):
        return {"ext_pad": 0}


def _state(sampled=True, eager_only=False, extensions=()):
    sampling = SimpleNamespace(any_sampled=sampled, temperature=torch.zeros(3),
                               top_k=torch.zeros(3), top_p=torch.ones(3),
                               greedy=torch.ones(3, dtype=torch.bool))
    return SimpleNamespace(sampling=sampling, eager_only=eager_only, extensions=extensions,
                           host_lens=[3, 7, 5], anchor=torch.arange(3), lens=torch.arange(3),
                           seed=torch.zeros(3), key=torch.zeros(3),
                           live=torch.ones(3, dtype=torch.bool))


@pytest.fixture
def fake_clock(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(mode_module, "time", clock)
    return clock


def test_a_target_only_step_runs_one_body_timed_as_verify(fake_clock):
    calls = []
    m = Mode(_bodies(None, calls, fake_clock, {"target-only": 3.0}), adapter=None)
    st, reports = _state(sampled=False), []
    clock = {}
    out = m.step(st, reports.append, clock)
    assert [c[0] for c in calls] == ["target-only"]
    kind, inp, sampled, ctx_len, host, _ = calls[0]
    assert (sampled, ctx_len, host) == (False, 7, st)           # ctx_len: the longest row
    assert inp["lens"] is st.lens and inp["live"] is st.live
    assert clock == {"verify": 3.0} and reports == []
    assert type(out) is StepOut and out.tokens.shape == (3, 1)
    clock = {"draft": 1.0, "verify": 20.0}
    m.step(st, reports.append, clock)
    assert clock == {"draft": 1.0, "verify": 23.0}


def test_a_speculative_step_drafts_then_verifies_with_the_drafts_outputs(fake_clock):
    calls, between = [], []
    m = Mode(_bodies(4, calls, fake_clock, {"draft": 2.0, "verify": 5.0}), adapter=None)
    st, clock = _state(sampled=True), {}
    out = m.step(st, print, clock, between=lambda d: between.append((d, len(calls))))
    assert [c[0] for c in calls] == ["draft", "verify"]
    assert len(between) == 1 and between[0][1] == 1            # after the draft, before verify
    drafted = between[0][0]
    assert drafted["draft"].eq(5).all()
    vin = calls[1][1]
    assert vin["lens"] is drafted["lens"] and vin["anchor"] is drafted["anchor"]  # the draft's
    assert vin["draft"] is drafted["draft"] and vin["seed"] is st.seed
    assert calls[0][1]["lens"] is st.lens
    assert all(c[2] is True and c[3] == 7 and c[4] is st for c in calls)
    assert clock == {"draft": 2.0, "verify": 5.0}
    assert out.accept_len.tolist() == [0, 1, 2] and out.logprobs is None


def test_the_timer_hook_sees_each_body_with_the_steps_block(fake_clock):
    seen = []

    def timer(kind, block, clock, run):
        seen.append((kind, block, clock))
        return run()
    for block, kinds in ((None, ["target-only"]), (4, ["draft", "verify"])):
        seen.clear()
        m = Mode(_bodies(block, None, fake_clock, {"draft": 0, "verify": 0, "target-only": 0}),
                 adapter=None)
        clock = {}
        m.step(_state(), print, clock, timer=timer)
        assert [s[0] for s in seen] == kinds
        assert all(s[1] == (block or 1) and s[2] is clock for s in seen)


def test_extension_reports_and_the_eager_report(fake_clock):
    costs = {"draft": 0, "verify": 0, "target-only": 0}
    exts = (_RowExt("a"), _RowExt("b"))
    for adapter, eager_only, eager_said in ((None, False, False), (None, True, False),
                                            (object(), True, True)):
        reports = []
        m = Mode(_bodies(4, None, fake_clock, costs), adapter=adapter)
        m.step(_state(eager_only=eager_only, extensions=exts), reports.append, {})
        want = []
        for kind in ("draft", "verify"):
            want += [f"a {kind} ['attention']", f"b {kind} ['attention']"]
            want += [EAGER_PROCS] if eager_said else []
        assert reports == want, (adapter, eager_only)


class _Recorder:
    """Stands in for GraphRunner: records how it was made and what it ran."""

    made = []

    def __init__(self, adapter, buckets, make_inputs, body, pad, name="", pool=None,
                 constants=frozenset()):
        self.args = dict(adapter=adapter, buckets=buckets, make_inputs=make_inputs,
                         body=body, pad=pad, name=name, pool=pool, constants=constants)
        self.ran, self.closed, self.capture_s, self.name = [], 0, 0.0, name
        _Recorder.made.append(self)

    def run(self, inp, report):
        self.ran.append(inp)
        return {"accept_len": torch.zeros(3, dtype=torch.long), "tokens": torch.zeros(3, 1),
                "flags": torch.zeros(3), "lens": torch.zeros(3), "anchor": torch.zeros(3),
                "draft": torch.zeros(3, 2)}

    def stats(self):
        return {1: {"name": self.name}}

    def close(self):
        self.closed += 1


def test_graphed_steps_go_through_one_runner_per_body_mode_and_extensions(monkeypatch,
                                                                          fake_clock):
    monkeypatch.setattr(mode_module, "GraphRunner", _Recorder)
    monkeypatch.setattr(_Recorder, "made", [])
    calls, adapter, pool = [], object(), object()
    m = Mode(_bodies(4, calls, fake_clock, {"draft": 1.0, "verify": 1.0}), adapter, pool)
    clock = {}
    ext = _RowExt("w")
    m.step(_state(sampled=True), print, clock)
    m.step(_state(sampled=True), print, clock)
    m.step(_state(sampled=False), print, clock)
    m.step(_state(sampled=False, extensions=(ext,)), print, clock)
    assert calls == [] and clock == {}                           # no eager body ran
    assert sorted(m.runners, key=str) == sorted(
        [("draft", True, ()), ("verify", True, ()), ("draft", False, ()),
         ("verify", False, ()), ("draft", False, ((_RowExt, ("k", "w")),)),
         ("verify", False, ((_RowExt, ("k", "w")),))], key=str)
    names = [r.args["name"] for r in _Recorder.made]
    assert names == ["draft sampled", "verify sampled", "draft greedy", "verify greedy",
                     "draft greedy wm", "verify greedy wm"]
    assert [len(r.ran) for r in _Recorder.made] == [2, 2, 1, 1, 1, 1]
    assert "ext_w" in _Recorder.made[5].ran[0]
    for r in _Recorder.made:
        a = r.args
        assert a["adapter"] is adapter and a["pool"] is pool
        assert a["buckets"] == (1, 2, 4, 8, 16, 32) and a["constants"] == CONSTANTS
    verify_sampled = _Recorder.made[1].args
    assert verify_sampled["pad"] == Mode._pads("verify")
    assert verify_sampled["make_inputs"].keywords == {"drafted": True}
    assert _Recorder.made[3].args["make_inputs"].keywords == {"drafted": False}
    assert _Recorder.made[0].args["pad"] == Mode._pads("draft")
    # the captured body: the mode's body with no host facts, its graphed extension classes
    _Recorder.made[5].args["body"]({"x": 1})
    assert calls[-1][0] == "verify" and calls[-1][2:] == (False, None, None, (_RowExt,))
    _Recorder.made[0].args["body"]({"x": 1})
    assert calls[-1][0] == "draft" and calls[-1][2:] == (True, None, None, ())
    for r in _Recorder.made:
        r.capture_s = 0.5 * (1 + _Recorder.made.index(r))
    assert m.capture_s == 0.5 * (1 + 2 + 3 + 4 + 5 + 6)
    assert m.graph_stats() == {n: {1: {"name": n}} for n in names}
    made = list(_Recorder.made)
    m.close()
    assert m.runners == {} and [r.closed for r in made] == [1] * 6
