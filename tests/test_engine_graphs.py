"""The engine's graph path on CPU: a fake graph adapter replays by re-running the captured
step over the static buffers, so bucketing, padding, compaction and fallbacks are exercised."""

from __future__ import annotations

import torch

from dflash2rt import get_backend
from dflash2rt.backend import TorchOpsBackend
from dflash2rt.engine.engine import Engine
from dflash2rt.engine.request import Request, SamplingParams
from dflash2rt.engine.policy.adaptive import AdaptivePolicy
from dflash2rt.api import measured_table
from dflash2rt.graphs.adapter import GraphCaptureError

from tiny_models import fixed_policy, oracle_pair, tiny_pair


class ReplayAdapter:
    name = "fake-graph"

    def __init__(self, fail=False):
        self.captures, self.replays, self.fail = 0, 0, fail

    def new_pool(self):
        return None

    def capture(self, fn, pool):
        if self.fail:
            raise GraphCaptureError("fake adapter refuses to capture")
        self.captures += 1
        fn()
        adapter = self

        class G:
            def replay(self_inner):
                adapter.replays += 1
                fn()
        return G()


def _backend(adapter):
    be = TorchOpsBackend("cpu-graphs", "cpu", (torch.float32, torch.float64))
    be.graph_adapter = adapter
    return be


def _reqs(temps, lens=(3, 9, 5), new=(5, 12, 8)):
    return [Request(tuple(range(1, 1 + n)), SamplingParams(max_new_tokens=m, temperature=t,
                                                           seed=2))
            for n, m, t in zip(lens, new, temps)]


def _tokens(outs):
    return [o.token_ids for o in outs]


def test_graphed_steps_equal_eager_with_padding_and_compaction():
    for pair in (tiny_pair("dflash2", block=4), oracle_pair(4)):
        for temps in ((0.0, 0.0, 0.0), (0.0, 1.0, 0.6)):
            adapter = ReplayAdapter()
            got, stats = Engine(pair, _backend(adapter)).generate(_reqs(temps), block_size=4)
            want, _ = Engine(pair, get_backend("cpu")).generate(_reqs(temps), block_size=4)
            assert _tokens(got) == _tokens(want)
            assert adapter.captures >= 4 and adapter.replays > 0    # buckets 4, 2, 1 × 2 graphs
            assert stats.fallbacks == [] and stats.syncs == stats.steps


def test_graphed_target_only_steps_equal_eager():
    """Target-only decoding is captured too (one graph per bucket), so graph-capable devices
    compare speculative and target-only decoding like for like."""
    pair = tiny_pair("dflash2", block=4)
    for temps in ((0.0, 0.0, 0.0), (0.0, 1.0, 0.6)):
        adapter = ReplayAdapter()
        got, stats = Engine(pair, _backend(adapter)).generate(_reqs(temps), spec=False)
        want, _ = Engine(pair, get_backend("cpu")).generate(_reqs(temps), spec=False)
        assert _tokens(got) == _tokens(want)
        assert adapter.captures >= 3 and adapter.replays > 0       # buckets 4, 2, 1
        assert stats.fallbacks == [] and stats.syncs == stats.steps and stats.capture_s > 0


def test_capture_failure_is_reported_and_output_unchanged():
    pair = tiny_pair("dflash2", block=4)
    got, stats = Engine(pair, _backend(ReplayAdapter(fail=True))).generate(_reqs((0.0,) * 3))
    want, _ = Engine(pair, get_backend("cpu")).generate(_reqs((0.0,) * 3))
    assert _tokens(got) == _tokens(want)
    assert stats.fallbacks and all("refuses to capture" in f for f in stats.fallbacks)


def test_every_run_reports_its_own_and_the_standing_fallbacks():
    """A capture refused again in a second run is in that run's stats too (not only the first);
    a standing fallback (reported when the backend was made) is in every run's stats; a run
    whose captures succeed does not inherit the other runs' capture failures."""
    pair = tiny_pair("dflash2", block=4)
    backend = _backend(ReplayAdapter(fail=True))
    backend.report_fallback("standing: example")
    engine = Engine(pair, backend)
    for _ in range(2):
        _, stats = engine.generate(_reqs((0.0,) * 3), block_size=4)
        assert stats.fallbacks[0] == "standing: example"
        assert any("refuses to capture" in f for f in stats.fallbacks[1:])
    backend.graph_adapter.fail = False
    _, stats = engine.generate(_reqs((0.0,) * 3), spec=False)
    assert stats.fallbacks == ["standing: example"]


def test_a_copy_with_a_standing_fallback_reports_it_and_leaves_the_original_alone():
    """What tensor-parallel runs do to turn graphs off: the copy's runs report the added
    fallback after the backend's own; the original's runs do not."""
    pair = tiny_pair("dflash2", block=4)
    backend = _backend(ReplayAdapter())
    backend.report_fallback("standing: example")
    eager = backend.with_standing_fallback("graphs: off for this run")
    eager.graph_adapter = None
    assert backend.graph_adapter is not None
    assert eager.standing_fallbacks == ("standing: example", "graphs: off for this run")
    assert backend.standing_fallbacks == ("standing: example",)
    _, stats = Engine(pair, eager).generate(_reqs((0.0,) * 2), block_size=4)
    assert stats.fallbacks == ["standing: example", "graphs: off for this run"]
    _, stats = Engine(pair, backend).generate(_reqs((0.0,) * 2), block_size=4)
    assert "graphs: off for this run" not in stats.fallbacks


def test_graphs_are_kept_across_calls_and_released_by_close():
    """A later generate() that fits the caches replays the graphs captured before (no capture,
    capture_s 0, same tokens as eager); a batch that outgrows them releases the old graphs at
    once (refcount, no GC pass: a graph freed by the cyclic GC during a later capture
    invalidates that capture on CUDA), and close() releases the rest."""
    import gc
    import weakref

    made = []

    class Tracking(ReplayAdapter):
        def capture(self, fn, pool):
            g = super().capture(fn, pool)
            made.append(weakref.ref(g))
            return g

    pair, adapter = tiny_pair("dflash2", block=4), Tracking()
    want, _ = Engine(pair, get_backend("cpu")).generate(_reqs((0.0, 1.0, 0.6)), block_size=4)
    gc.disable()
    try:
        with Engine(pair, _backend(adapter)) as engine:
            _, first = engine.generate(_reqs((0.0, 1.0, 0.6)), block_size=4)
            captures = adapter.captures
            assert first.capture_s > 0 and first.step_s > 0
            got, again = engine.generate(_reqs((0.0, 1.0, 0.6)), block_size=4)
            assert _tokens(got) == _tokens(want)
            assert adapter.captures == captures and again.capture_s == 0
            old = list(made)
            engine.generate(_reqs((0.0,) * 5, lens=(3, 9, 5, 2, 4), new=(5, 12, 8, 3, 6)),
                            block_size=4)
            assert all(r() is None for r in old) and any(r() is not None for r in made)
        assert all(r() is None for r in made)
    finally:
        gc.enable()


def test_every_mode_shares_one_set_of_static_caches():
    """Spec at two block sizes and target-only capture over the same cache storage (one KV
    footprint per engine); switching modes keeps each mode's graphs (revisits capture nothing,
    target-only first included: its caches already hold the draft's), and every call still
    equals eager."""
    pair, adapter = tiny_pair("dflash2", block=4), ReplayAdapter()
    with Engine(pair, _backend(adapter)) as engine:
        ptrs, new_captures = set(), []
        for spec, block in ((False, None), (True, 4), (True, 3), (False, None), (True, 4)):
            before = adapter.captures
            got, _ = engine.generate(_reqs((0.0, 1.0, 0.6)), spec=spec, block_size=block)
            want, _ = Engine(pair, get_backend("cpu")).generate(_reqs((0.0, 1.0, 0.6)), spec=spec,
                                                   block_size=block)
            assert _tokens(got) == _tokens(want)
            ptrs.add(engine.runner.static[0].k[0].data_ptr())
            new_captures.append(adapter.captures - before)
        assert len(ptrs) == 1 and set(engine.runner.captured()) == {
            ("spec", 4), ("spec", 3), ("target-only",)}
        assert all(n > 0 for n in new_captures[:3]) and new_captures[3:] == [0, 0]
    assert engine.runner.static is None and not engine.runner.captured()


def test_replayed_steps_are_timed_as_graphs():
    """A replaying step has no separate draft / select / verify phases: its time (launch and
    the wait at the one sync) is reported as "graphs"; eager steps never report it."""
    pair = tiny_pair("dflash2", block=4)
    for spec in (True, False):
        _, g = Engine(pair, _backend(ReplayAdapter())).generate(_reqs((0.0, 1.0, 0.6)), spec=spec)
        _, e = Engine(pair, get_backend("cpu")).generate(_reqs((0.0, 1.0, 0.6)), spec=spec)
        assert g.time["graphs"] > 0 and g.time["draft"] == g.time["select"] == \
            g.time["verify"] == 0
        assert e.time["graphs"] == 0 and e.time["verify"] > 0


def test_run_stats_say_which_buckets_were_captured_and_replayed():
    """stats.graphs: per graph and bucket the run used, its replays in that run (one per step
    and graph: the checked post-capture replay included), captured and verified."""
    pair = tiny_pair("dflash2", block=4)
    with Engine(pair, _backend(ReplayAdapter())) as engine:
        for _ in range(2):                                  # the second call replays kept graphs
            _, stats = engine.generate(_reqs((0.0, 0.0, 0.0)), block_size=4)
            assert set(stats.graphs) == {"draft greedy", "verify greedy"}
            for name, buckets in stats.graphs.items():
                assert 4 in buckets and set(buckets) <= {1, 2, 4}, name
                assert all(b["captured"] and b["verified"] and b["refused"] is None
                           and b["eager"] == 0 and b["replays"] > 0 for b in buckets.values())
                assert sum(b["replays"] for b in buckets.values()) == stats.steps
        _, stats = engine.generate(_reqs((0.0, 0.0, 0.0)), spec=False)
        assert set(stats.graphs) == {"target-only greedy"}
    _, eager = Engine(pair, get_backend("cpu")).generate(_reqs((0.0, 0.0, 0.0)))
    assert eager.graphs == {}


def test_run_stats_show_a_refused_capture():
    pair = tiny_pair("dflash2", block=4)
    _, stats = Engine(pair, _backend(ReplayAdapter(fail=True))).generate(_reqs((0.0,) * 3),
                                                                          block_size=4)
    buckets = stats.graphs["verify greedy"]
    assert all(not b["captured"] and b["replays"] == 0 and b["eager"] > 0
               and "refuses to capture" in b["refused"] for b in buckets.values())


class WrongArgmax(torch.overrides.TorchFunctionMode):
    """Replays "miscompiled": every argmax returns the next index."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in (torch.argmax, torch.Tensor.argmax):
            dim = (kwargs or {}).get("dim", args[1] if len(args) > 1 else -1)
            out = (out + 1) % args[0].shape[dim]
        return out


def test_replay_that_differs_from_eager_is_caught_after_capture():
    """The post-capture check replays once and compares the discrete outputs with the eager
    warm-up: a differing bucket runs eagerly (tokens unchanged) and is reported."""
    pair = tiny_pair("dflash2", block=4)

    class Differing(ReplayAdapter):
        def capture(self, fn, pool):
            fn()

            class G:
                def replay(self_inner):
                    with WrongArgmax():
                        fn()
            return G()

    got, stats = Engine(pair, _backend(Differing())).generate(_reqs((0.0,) * 3))
    want, _ = Engine(pair, get_backend("cpu")).generate(_reqs((0.0,) * 3))
    assert _tokens(got) == _tokens(want)
    assert stats.fallbacks and all("differed from eager" in f for f in stats.fallbacks)
    assert any(f.startswith("graph replay of bucket 4 (draft greedy) differed from eager: draft:")
               for f in stats.fallbacks), stats.fallbacks
    assert all(b["eager"] > 0 and b["replays"] == 0 and not b["verified"]
               for buckets in stats.graphs.values() for b in buckets.values())


def test_graph_vs_eager_counts_replays_and_names_eager_buckets():
    from dflash2rt.engine.compare import graph_vs_eager

    pair = tiny_pair("dflash2", block=4)
    ok = graph_vs_eager(pair, _backend(ReplayAdapter()), lambda: _reqs((0.0, 1.0, 0.6)))
    assert ok["equal"] and ok["graph_replays"] > 0 and ok["graph_eager_buckets"] == []
    refused = graph_vs_eager(pair, _backend(ReplayAdapter(fail=True)),
                             lambda: _reqs((0.0, 1.0, 0.6)))
    assert refused["equal"] and refused["graph_replays"] == 0    # equal proves nothing here
    assert refused["graph_eager_buckets"] and \
        all("refuses to capture" in b for b in refused["graph_eager_buckets"])


def test_adaptive_decoding_replays_equal_eager():
    """Adaptive runs capture a graph set per block size used (1: a target-only step that keeps
    the draft's context), all over the one set of static caches; with a replica of the graph
    engine's policy (its call's cost table and acceptance pool) the eager engine chooses the
    same sizes and samples the same tokens. The schedule is measured but learns nothing
    between calls (``track=0``), so whatever the timings, the first call calibrates (and
    captures) every candidate at every bucket the batch passes through and plans no call
    target-only."""
    for pair in (tiny_pair("dflash2", block=4), oracle_pair(4)):
        adapter = ReplayAdapter()
        with Engine(pair, _backend(adapter)) as engine:
            engine.policy = AdaptivePolicy.measured(
                pair.draft.cfg.block_size, measured_table(pair, engine.backend.device), track=0)
            engine.generate(_reqs((0.0, 1.0, 0.6)))                  # calibrates, captures
            captures = adapter.captures
            got, stats = engine.generate(_reqs((0.0, 1.0, 0.6)))
            assert adapter.captures == captures and stats.calibration_steps == 0
            assert {k[1] for k in engine.runner.captured()} == {1, 2, 4, 8}
            replica = engine.policy.replica()
        eager = Engine(pair, get_backend("cpu"))
        eager.policy = replica
        want, wstats = eager.generate(_reqs((0.0, 1.0, 0.6)))
        assert _tokens(got) == _tokens(want) and stats.block_sizes == wstats.block_sizes
        assert stats.adaptive and stats.fallbacks == [] and stats.syncs == stats.steps
        kinds = {"target-only greedy", "target-only sampled"} if 1 in stats.block_sizes else set()
        if set(stats.block_sizes) - {1}:
            kinds |= {"draft greedy", "verify greedy", "draft sampled", "verify sampled"}
        assert stats.graphs and set(stats.graphs) <= kinds    # names as fixed runs', blocks summed
        assert all(s["replays"] > 0 and s["eager"] == 0 and s["captured"]
                   for buckets in stats.graphs.values() for s in buckets.values())
        assert sum(s["replays"] for n, buckets in stats.graphs.items() if n != "draft greedy"
                   and n != "draft sampled" for s in buckets.values()) == stats.steps


def test_every_graph_of_an_engine_captures_into_one_pool():
    """Adaptive runs use a runner per (body, sampling mode, block size): every capture takes
    the engine's one pool, and every replayed bucket was compared with eager on fresh inputs
    before its replays counted as verified."""
    class Pools(ReplayAdapter):
        def __init__(self):
            super().__init__()
            self.made, self.used = [], set()

        def new_pool(self):
            self.made.append(object())
            return self.made[-1]

        def capture(self, fn, pool):
            self.used.add(id(pool))
            return super().capture(fn, pool)

    pair, adapter = tiny_pair("dflash2", block=4), Pools()
    with Engine(pair, _backend(adapter)) as engine:
        engine.policy = fixed_policy(4)
        for temps in ((0.0, 1.0, 0.6), (0.0, 0.0, 0.0)):
            engine.generate(_reqs(temps))
        _, stats = engine.generate(_reqs((0.0, 0.0, 0.0)), spec=False)
        runners = [r for rs in engine.runner.captured().values() for r in rs.values()]
        assert len(runners) >= 4 and adapter.captures >= 8
        assert len(adapter.made) == 1 and adapter.used == {id(adapter.made[0])}
        assert all(r.pool is runners[0].pool for r in runners)
        assert all(b.fresh is not False for r in runners for b in r.state.values())
    assert stats.fallbacks == []
