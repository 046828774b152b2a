"""``graphs.runner`` against its docstrings, with values written out by hand: a bucket's repr
and a runner's stats before any capture, the warm-up count (at least one eager run), the
message of a batch past the largest bucket, staging that writes nothing it need not (no
padding for a full bucket, nothing for a source that already is the static rows), and
``same_memory`` / ``first_difference`` on each of the properties they compare."""

from __future__ import annotations

import pytest
import torch

from dflash2rt.errors import InvalidInputError
from dflash2rt.graphs.runner import Bucket, GraphRunner, first_difference, same_memory

from fake_graphs import Rerun
from test_graph_runner import FakeAdapter, live, make_runner
from test_step_staging import _Writes


def test_a_new_bucket_shows_its_counters_and_no_tensors():
    b = Bucket(2, {"x": torch.zeros(2)})
    assert repr(b) == ("Bucket(size=2, graph=None, eager='', verified=False, fresh=None, "
                       "rows=0, replays=0, eager_runs=0, capture_s=0.0, warmup_s=0.0)")
    b.outputs, b.staged = {"y": torch.ones(2)}, {"x": torch.ones(2)}
    assert "tensor" not in repr(b)


def test_a_runner_before_any_capture_reports_nothing_spent():
    runner = make_runner(FakeAdapter(), torch.zeros(9))
    assert runner.capture_s == 0.0
    runner._new_bucket(4)
    assert runner.stats() == {4: {"captured": False, "verified": False, "fresh": None,
                                  "replays": 0, "eager": 0, "refused": None,
                                  "capture_ms": 0.0, "warmup_ms": 0.0}}
    runner.run(live(9), [].append)                # past the largest bucket: eager, no capture
    assert runner.capture_s == 0.0 and runner.stats()[4]["eager"] == 0


@pytest.mark.parametrize("warmup, runs", [(0, 1), (1, 1), (2, 2), (3, 3)])
def test_the_warm_up_runs_the_body_warmup_times_and_at_least_once(warmup, runs):
    adapter = FakeAdapter()
    runner = make_runner(adapter, torch.zeros(8), buckets=(4,))
    runner = GraphRunner(adapter, (4,), runner.make_inputs, runner.body, runner.pad,
                         warmup=warmup)
    runner.run(live(3), [].append)
    assert adapter.log == ["body 4"] * runs + ["capture 4", "body 4", "replay", "body 4"]


def test_a_batch_past_the_largest_bucket_names_that_bucket():
    fallbacks = []
    runner = make_runner(FakeAdapter(), torch.zeros(8), buckets=(1, 2, 4))
    runner.run(live(5), fallbacks.append)
    assert fallbacks == ["batch of 5 exceeds the largest graph bucket (4): ran eagerly"]


def test_a_step_without_live_inputs_is_refused_naming_the_runner():
    runner = make_runner(FakeAdapter(), torch.zeros(8), buckets=(1, 2, 4))
    runner.name = "verify"
    with pytest.raises(InvalidInputError, match="graph runner 'verify'.*got none"):
        runner.run({}, [].append)


def _sum_runner():
    return GraphRunner(Rerun(), (4,), lambda n: {"a": torch.zeros(n), "b": torch.zeros(n)},
                       lambda inp: {"out": inp["a"] + inp["b"]}, {"a": -1.0, "b": -2.0})


def test_a_full_bucket_is_staged_without_padding():
    runner = _sum_runner()
    runner.run({"a": torch.ones(4), "b": torch.ones(4)}, [].append)           # capture
    writes = _Writes()
    with writes:
        out = runner.run({"a": torch.full((4,), 3.0), "b": torch.ones(4)}, [].append)["out"]
    assert writes.n == 2 and out.tolist() == [4.0] * 4               # two copies, no fill
    writes = _Writes()
    with writes:
        out = runner.run({"a": torch.full((3,), 3.0), "b": torch.ones(3)}, [].append)["out"]
    assert writes.n == 4 and out.tolist() == [4.0] * 3               # copies and fills
    assert runner.state[4].inputs["a"][3] == -1.0 and runner.state[4].inputs["b"][3] == -2.0


def test_a_source_that_is_the_static_rows_is_not_staged():
    runner = _sum_runner()
    runner.run({"a": torch.ones(3), "b": torch.ones(3)}, [].append)           # capture
    static = runner.state[4].inputs
    static["a"][3] = 7.0                          # not the pad: staging a would overwrite it
    writes = _Writes()
    with writes:
        out = runner.run({"a": static["a"][:3], "b": torch.full((3,), 2.0)}, [].append)["out"]
    assert writes.n == 2 and out.tolist() == [3.0] * 3               # b's copy and fill only
    assert static["a"].tolist() == [1.0, 1.0, 1.0, 7.0] and static["b"][3] == -2.0


def test_same_memory_needs_storage_offset_shape_stride_and_dtype_equal():
    t = torch.arange(6.0)
    assert same_memory(t, t) and same_memory(t[:3], t[:3])          # two views, one memory
    assert not same_memory(t, t.clone())                             # storage
    assert not same_memory(t[1:4], t[:3])                            # offset
    assert not same_memory(t[:3], t[:2])                             # shape
    assert not same_memory(t.view(2, 3)[:, :2], t[:4].view(2, 2))    # stride
    assert not same_memory(t, t.view(torch.int32))                   # dtype
    meta = torch.zeros(3, device="meta")                             # storages at address 0
    assert same_memory(meta, meta) and not same_memory(meta, torch.zeros(3, device="meta"))


def test_first_difference_names_a_shape_difference_and_the_first_differing_key():
    want = {"a": torch.tensor([1, 2]), "b": torch.tensor([[0, 0], [0, 1]])}
    assert first_difference(want, {**want, "a": torch.tensor([1, 2, 3])}) == \
        "a: eager torch.int64 (2,), replay torch.int64 (3,)"
    got = {"a": torch.tensor([1, 2]), "b": torch.tensor([[0, 0], [5, 6]])}
    assert first_difference(want, got) == \
        "b: 2 of 4 values differ, first at [1, 0]: eager 0, replay 5"
    assert first_difference(want, {**got, "a": torch.tensor([0, 2])}) == \
        "a: 1 of 2 values differ, first at [0]: eager 1, replay 0"
    assert first_difference(want, {"b": want["b"]}) == "a missing from the replay's outputs"
    assert first_difference({}, got) == "" and first_difference(want, {**want, "c": 1}) == ""
