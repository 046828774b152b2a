"""The bucketed graph runner with a fake graph adapter (no GPU needed)."""

from __future__ import annotations

import pytest
import torch

from dflash2rt.errors import InvalidInputError
from dflash2rt.graphs.adapter import GraphCaptureError
from dflash2rt.graphs.runner import GraphRunner, bucket_for


class FakeGraph:
    def __init__(self, fn, log):
        self.fn, self.log = fn, log

    def replay(self):
        self.log.append("replay")
        self.fn()


class FakeAdapter:
    """Records the order of events; 'replays' by re-running the captured function."""

    name = "fake-graph"

    def __init__(self, fail_sizes=()):
        self.log, self.fail_sizes = [], set(fail_sizes)
        self.seen, self.bias = [], 0        # every body's inputs; added to the "slot" output

    def new_pool(self):
        return object()

    def capture(self, fn, pool):
        size = self.current
        if size in self.fail_sizes:
            self.log.append(f"refuse {size}")
            raise GraphCaptureError(f"fake capture refused for bucket {size}")
        self.log.append(f"capture {size}")
        fn()
        return FakeGraph(fn, self.log)


def make_runner(adapter, state, buckets=(1, 2, 4, 8)):
    """Body: scores = 2·x + slot; writes x into the shared per-request ``state`` at ``slot``
    for rows whose ``write`` flag is set (padded rows get write = False). Each run is given
    where to report its fallbacks (runners outlive runs)."""
    def make_inputs(size):
        adapter.current = size
        return {"x": torch.zeros(size), "slot": torch.zeros(size, dtype=torch.long),
                "write": torch.zeros(size, dtype=torch.bool)}

    def body(inp):
        adapter.log.append(f"body {inp['x'].shape[0]}")
        adapter.seen.append({n: t.clone() for n, t in inp.items()})
        idx = inp["slot"][inp["write"]]
        state.index_copy_(0, idx, inp["x"][inp["write"]])
        return {"score": 2 * inp["x"] + inp["slot"], "slot": inp["slot"] + adapter.bias,
                "written": inp["write"].clone()}

    return GraphRunner(adapter, buckets, make_inputs, body,
                       pad={"x": float("nan"), "slot": 0, "write": False})


def live(rows):
    return {"x": torch.arange(rows, dtype=torch.float32) + 10, "slot": torch.arange(rows),
            "write": torch.ones(rows, dtype=torch.bool)}


def test_bucket_choice_and_warm_up_before_capture():
    adapter, fallbacks, state = FakeAdapter(), [], torch.full((8,), -1.0)
    runner = make_runner(adapter, state)
    assert [bucket_for(n, runner.buckets) for n in (1, 2, 3, 4, 5, 8, 9)] == \
        [1, 2, 4, 4, 8, 8, None]
    out = runner.run(live(3), fallbacks.append)
    # warm-up ×2, capture (the fake runs the body), one checked replay whose outputs are used
    assert adapter.log == ["body 4", "body 4", "capture 4", "body 4", "replay", "body 4"]
    assert out["score"].tolist() == [20.0, 23.0, 26.0]
    runner.run(live(3), fallbacks.append)                       # captured once, replayed after
    assert adapter.log.count("capture 4") == 1 and adapter.log.count("replay") == 2
    assert not fallbacks


def test_padded_rows_never_touch_live_requests():
    adapter, fallbacks = FakeAdapter(), []
    state = torch.full((8,), -1.0)
    runner = make_runner(adapter, state)
    runner.run(live(3), fallbacks.append)
    # Slot 0 belongs to a live request; padded row 3 (slot pad 0) must not overwrite it.
    assert state.tolist()[:4] == [10.0, 11.0, 12.0, -1.0]
    assert torch.isnan(runner.state[4].inputs["x"][3])   # padding is inert, not stale data
    out = runner.run({"x": torch.tensor([7.0]), "slot": torch.tensor([5]),
                      "write": torch.tensor([True])}, fallbacks.append)
    assert out["score"].shape == (1,) and state[5] == 7.0 and state[0] == 10.0


def test_capture_failure_falls_back_to_eager_and_is_reported():
    adapter, fallbacks, state = FakeAdapter(fail_sizes={4}), [], torch.zeros(8)
    runner = make_runner(adapter, state)
    out = runner.run(live(3), fallbacks.append)
    assert out["score"].tolist() == [20.0, 23.0, 26.0]
    assert len(fallbacks) == 1 and "bucket 4" in fallbacks[0] and "refused" in fallbacks[0]
    runner.run(live(4), fallbacks.append)      # reported again (a later run's stats need it) ...
    assert fallbacks == [fallbacks[0]] * 2 and adapter.log.count("refuse 4") == 1  # not retried
    runner.run(live(2), fallbacks.append)                            # other buckets still graph
    assert "capture 2" in adapter.log


def test_batch_above_the_largest_bucket_runs_eagerly_and_is_reported():
    adapter, fallbacks, state = FakeAdapter(), [], torch.zeros(16)
    runner = make_runner(adapter, state, buckets=(1, 2))
    out = runner.run(live(5), fallbacks.append)
    assert out["score"].tolist() == [20.0, 23.0, 26.0, 29.0, 32.0]
    assert fallbacks and "exceeds the largest graph bucket" in fallbacks[0]


def test_replay_equals_eager_across_buckets():
    for rows in (1, 2, 3, 5, 8):
        adapter, fallbacks = FakeAdapter(), []
        graphed = make_runner(adapter, torch.zeros(8)).run(live(rows), fallbacks.append)
        eager = make_runner(FakeAdapter(fail_sizes={1, 2, 4, 8}), torch.zeros(8)).run(
            live(rows), [].append)
        assert torch.equal(graphed["score"], eager["score"])


def test_bad_buckets_raise():
    with pytest.raises(InvalidInputError):
        make_runner(FakeAdapter(), torch.zeros(1), buckets=(4, 2))


def test_failed_capture_gets_a_fresh_pool_and_close_releases_graphs():
    """A refused capture can leave its memory pool mid-recording (CUDA did: 'already recording
    to mempool_id' on the next capture), so later captures use a new pool; close() drops the
    graphs at once instead of leaving them to the cyclic GC."""
    import weakref

    adapter, fallbacks, state = FakeAdapter(fail_sizes={4}), [], torch.zeros(8)
    pools = []
    capture = adapter.capture
    adapter.capture = lambda fn, pool: (pools.append(pool), capture(fn, pool))[1]
    runner = make_runner(adapter, state)
    runner.run(live(1), fallbacks.append)
    runner.run(live(3), fallbacks.append)                 # bucket 4 refused
    runner.run(live(2), fallbacks.append)
    assert len(pools) == 3 and pools[0] is pools[1] and pools[2] is not pools[1]
    graphs = [weakref.ref(b.graph) for b in runner.state.values() if b.graph is not None]
    assert len(graphs) == 2 and runner.capture_s > 0
    runner.close()
    assert all(g() is None for g in graphs) and not runner.state


def test_no_gc_during_capture():
    import gc

    from dflash2rt.graphs.adapter import no_gc

    assert gc.isenabled()
    with no_gc():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError), no_gc():
        raise RuntimeError("capture failed")
    assert gc.isenabled()


class PerturbingAdapter(FakeAdapter):
    """A graph whose replay computes a different integer output than the eager body (as a
    miscaptured kernel would); ``raising`` replays raise instead."""

    def __init__(self, raising=False):
        super().__init__()
        self.raising = raising

    def capture(self, fn, pool):
        graph = super().capture(fn, pool)
        adapter = self

        class Perturbed(FakeGraph):
            def replay(self):
                if adapter.raising:
                    raise RuntimeError("illegal memory access (fake)")
                adapter.bias = 1
                try:
                    super().replay()
                finally:
                    adapter.bias = 0
        return Perturbed(graph.fn, graph.log)


def _counters(bucket: dict) -> dict:
    """A bucket's stats without its capture times (tests/test_graph_capture_time.py)."""
    return {k: v for k, v in bucket.items() if not k.endswith("_ms")}


def test_stats_count_captures_replays_and_eager_runs():
    adapter, fallbacks = FakeAdapter(fail_sizes={2}), []
    runner = make_runner(adapter, torch.zeros(8))
    assert runner.stats() == {}
    for rows in (3, 4, 1, 2, 2):
        runner.run(live(rows), fallbacks.append)
    st = runner.stats()
    assert list(st) == [1, 2, 4]
    assert _counters(st[4]) == {"captured": True, "verified": True, "fresh": True,
                                "replays": 2, "eager": 0, "refused": None}
    assert st[4]["capture_ms"] >= st[4]["warmup_ms"] >= 0
    assert st[1]["replays"] == 1 and st[1]["verified"]
    assert st[2]["captured"] is False and st[2]["replays"] == 0 and st[2]["eager"] == 2
    assert "bucket 2" in st[2]["refused"] and "refused" in st[2]["refused"]


def test_checked_replay_runs_from_the_warm_up_inputs():
    """Warm-up, capture and the checked replay all see the same static inputs (live rows and
    inert padding), so their idempotent side effects agree; the check replay's outputs are
    the step's result (no extra replay)."""
    adapter, state = FakeAdapter(), torch.full((8,), -1.0)
    runner = make_runner(adapter, state)
    out = runner.run(live(3), [].append)
    assert len(adapter.seen) == 4 and adapter.log.count("replay") == 1
    for inp in adapter.seen[1:]:
        for name, t in inp.items():
            assert torch.equal(t, adapter.seen[0][name]) or (
                name == "x" and torch.equal(t.nan_to_num(), adapter.seen[0][name].nan_to_num()))
    assert out["slot"].tolist() == [0, 1, 2] and state.tolist()[:4] == [10.0, 11.0, 12.0, -1.0]
    assert runner.stats()[4]["replays"] == 1


def test_replay_that_differs_from_eager_runs_eagerly_and_is_reported():
    adapter, fallbacks, state = PerturbingAdapter(), [], torch.zeros(8)
    runner = make_runner(adapter, state)
    out = runner.run(live(3), fallbacks.append)
    assert out["slot"].tolist() == [0, 1, 2]              # the eager result, not the replay's
    assert out["score"].tolist() == [20.0, 23.0, 26.0]
    assert len(fallbacks) == 1
    assert fallbacks[0].startswith("graph replay of bucket 4 differed from eager: slot: 4 of 4 "
                                   "values differ, first at [0]: eager 0, replay 1")
    assert fallbacks[0].endswith("running it eagerly")
    runner.run(live(4), fallbacks.append)
    assert fallbacks == [fallbacks[0]] * 2 and adapter.log.count("capture 4") == 1
    assert runner.state[4].graph is None and runner.state[4].eager_runs == 2
    st = runner.stats()[4]
    assert not st["captured"] and not st["verified"] and st["replays"] == 0
    assert st["refused"] == fallbacks[0]


def test_replay_that_raises_after_capture_runs_eagerly_and_is_reported():
    adapter, fallbacks = PerturbingAdapter(raising=True), []
    runner = make_runner(adapter, torch.zeros(8), buckets=(2,))
    assert runner.run(live(2), fallbacks.append)["slot"].tolist() == [0, 1]
    assert "graph replay of bucket 2 differed from eager: replay raised RuntimeError: " \
           "illegal memory access (fake)" in fallbacks[0]


def test_capture_raising_any_exception_is_a_reported_refusal():
    adapter, fallbacks = FakeAdapter(), []

    def capture(fn, pool):
        raise RuntimeError("operation not permitted when stream is capturing")
    adapter.capture = capture
    runner = make_runner(adapter, torch.zeros(8), buckets=(4,))
    runner.name = "verify greedy"
    assert runner.run(live(3), fallbacks.append)["score"].tolist() == [20.0, 23.0, 26.0]
    assert fallbacks == ["bucket 4 (verify greedy): fake-graph capture raised RuntimeError: "
                         "operation not permitted when stream is capturing; running it eagerly"]


def test_only_discrete_outputs_are_compared():
    from dflash2rt.graphs.runner import discrete, first_difference

    out = {"tok": torch.tensor([[1, 2], [3, 4]]), "bad": torch.tensor([False, True]),
           "q": torch.tensor([0.5, 0.25])}
    want = discrete(out)
    assert set(want) == {"tok", "bad"} and want["tok"] is not out["tok"]
    assert first_difference(want, {**out, "q": out["q"] + 1}) == ""
    assert first_difference(want, {**out, "tok": torch.tensor([[1, 2], [3, 5]])}) == \
        "tok: 1 of 4 values differ, first at [1, 1]: eager 4, replay 5"
    assert first_difference(want, {**out, "bad": torch.tensor([True, True])}).startswith(
        "bad: 1 of 2 values differ, first at [0]: eager False, replay True")
    assert "missing" in first_difference(want, {"tok": out["tok"]})
    assert first_difference(want, {**out, "tok": out["tok"].int()}) == \
        "tok: eager torch.int64 (2, 2), replay torch.int32 (2, 2)"


class BakingAdapter(FakeAdapter):
    """A capture that bakes its inputs in: replay restores the outputs the capture computed,
    whatever the static inputs hold now (what a graph that read an input at capture time
    would do)."""

    def capture(self, fn, pool):
        self.log.append(f"capture {self.current}")
        fn()
        runner = self.runner
        baked = {size: {n: t.clone() for n, t in b.outputs.items()}
                 for size, b in runner.state.items()}
        size = self.current

        class Baked(FakeGraph):
            def replay(self):
                self.log.append("replay")
                for n, t in runner.state[size].outputs.items():
                    t.copy_(baked[size][n])
        return Baked(fn, self.log)


def test_a_capture_that_baked_its_inputs_is_caught_on_fresh_inputs():
    """The post-capture check replays the capture's own inputs (a baked graph passes it); the
    first replay on the next inputs is compared with eager, fails, and the bucket runs
    eagerly from then on, reported, with the eager outputs as that step's."""
    adapter, fallbacks, state = BakingAdapter(), [], torch.zeros(8)
    runner = make_runner(adapter, state)
    adapter.runner = runner
    first = runner.run(live(3), fallbacks.append)
    assert first["score"].tolist() == [20.0, 23.0, 26.0] and fallbacks == []
    assert runner.stats()[4]["verified"] and runner.stats()[4]["fresh"] is None
    fresh = live(3)
    fresh["x"] += 100
    fresh["slot"] += 2                                   # discrete outputs change with it
    out = runner.run(fresh, fallbacks.append)
    assert out["score"].tolist() == [222.0, 225.0, 228.0]              # eager, not the baked
    assert len(fallbacks) == 1 and fallbacks[0].startswith(
        "graph replay of bucket 4 differed from eager on fresh inputs: ")
    st = runner.stats()[4]
    assert st["fresh"] is False and not st["captured"] and st["eager"] == 1
    assert runner.run(fresh, fallbacks.append)["score"].tolist() == [222.0, 225.0, 228.0]
    assert fallbacks == [fallbacks[0]] * 2


def test_a_good_capture_is_compared_once_on_fresh_inputs():
    adapter, fallbacks = FakeAdapter(), []
    runner = make_runner(adapter, torch.zeros(8))
    for k in range(3):
        inp = live(3)
        inp["x"] += k
        runner.run(inp, fallbacks.append)
    bodies = adapter.log.count("body 4")
    # warm-up x2, capture, checked replay; replay + the fresh check's eager run; replay (the
    # fake adapter's replay runs the body)
    assert bodies == 2 + 1 + 1 + 2 + 1
    assert _counters(runner.stats()[4]) == {"captured": True, "verified": True, "fresh": True,
                                            "replays": 3, "eager": 0, "refused": None}


def test_runners_share_one_pool_and_a_failed_capture_renews_it():
    from dflash2rt.graphs.runner import SharedPool

    adapter = FakeAdapter(fail_sizes={2})
    pool = SharedPool(adapter)
    first = pool.handle
    a, b = (make_runner(adapter, torch.zeros(8)) for _ in "ab")
    a.pool = b.pool = pool
    handles = []
    real = adapter.capture

    def capture(fn, p):
        handles.append(p)
        return real(fn, p)
    adapter.capture = capture
    a.run(live(3), [].append)
    b.run(live(1), [].append)
    assert handles == [first, first]
    b.run(live(2), [].append)                             # refused: a new pool for the next
    assert pool.renewed == 1 and pool.handle is not first
    a.run(live(8), [].append)
    assert handles[-1] is pool.handle
