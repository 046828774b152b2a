"""dflash2rt.bench.measure, the one measurement loop of bench, qualify and the training
evaluation: every contender warms up (untimed, same requests) before anything is timed, graph
capture stays out of timed seconds, and the deprecated ``ar`` JSON keys equal the new ones."""

from __future__ import annotations

import json

import pytest
import torch

from dflash2rt.bench import measure as bm
from dflash2rt.engine.request import RequestOutput
from dflash2rt.engine.stats import RunStats

from tiny_models import save_pair_dir, tiny_pair

WARM_S, TIMED_S = 100.0, 1.0


class FakeEngine:
    """Engine.generate stand-in: logs every call; the first call of each (mode, block, prompts)
    takes WARM_S seconds (0.5 s of it graph capture), later calls TIMED_S."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def generate(self, reqs, spec=True, block_size=None):
        key = (spec, block_size if spec else None, tuple(r.prompt_ids for r in reqs))
        first = key not in self.calls
        self.calls.append(key)
        n = reqs[0].params.max_new_tokens
        st = RunStats("spec" if spec else "target-only", "fake", "cpu", block_size or 1,
                      requests=len(reqs))
        st.steps = n // 2 if spec else n
        st.record_accepts([1 if spec else 0] * (st.steps * len(reqs)))
        st.generated = n * len(reqs)
        st.wall_s = WARM_S if first else TIMED_S
        st.capture_s = 0.5 if first else 0.0
        for k in st.time:
            st.time[k] = 0.01 * st.steps
        outs = [RequestOutput(r.prompt_ids, list(range(n))) for r in reqs]
        return outs, st


def test_measure_warms_every_contender_before_timing():
    log: list[tuple[str, int]] = []

    def contender(name):
        def run():
            log.append((name, sum(1 for x in log if x[0] == name)))   # (name, call index)
            call = log[-1][1]
            return [bm.Sample([[call]], WARM_S if call == 0 else TIMED_S, 10)]
        return bm.Contender(name, run)

    m = bm.measure([contender("a"), contender("b"), contender("c")], repeats=3)
    # every contender's first (warm-up) call comes before any contender's timed call
    assert log[:3] == [("a", 0), ("b", 0), ("c", 0)]
    assert [x[0] for x in log[3:]] == ["a", "b", "c"] * 3           # interleaved rounds
    for r in m.values():
        assert r.timed_runs == 3 and len(r.samples) == 3
        assert all(s.outputs != [[0]] for s in r.samples)          # the first call is untimed
        assert r.tokens_per_s == 10 / TIMED_S and r.warmup_s >= 0
    with pytest.raises(ValueError):
        bm.measure([contender("a"), contender("a")], 1)


def test_compare_times_no_first_call_and_reports_capture_apart():
    eng = FakeEngine()
    res = bm.compare([(1, 2, 3)], eng, None, 8, 4, 2, log=lambda m: None)
    # warm-up: one call per mode before any timed call, then 2 interleaved rounds
    assert [c[0] for c in eng.calls] == [False, True, False, True, False, True]
    assert res["target_only_tokens_per_s"] == 8 / TIMED_S                # WARM_S never timed
    assert res["spec_tokens_per_s"] == 8 / TIMED_S
    assert res["capture_s"] == {"target_only": 0.5, "spec": 0.5}
    assert res["tau"] == 2.0 and res["steps"] == 4 and res["greedy_equal"]
    assert set(res["time_split_per_step_s"]) == set(bm.PHASES)


def test_block_sweep_warms_every_block_size_before_timing():
    eng = FakeEngine()
    prompts, blocks = [(1, 2), (3, 4)], (2, 4, 8)
    rows = bm.block_sweep(prompts, eng, 8, blocks, 2, log=lambda m: None)
    n_modes = len(blocks) + 1
    warm = eng.calls[:n_modes * len(prompts)]
    assert len(set(warm)) == len(warm) == n_modes * len(prompts)       # each first call once
    assert {c[1] for c in warm if c[0]} == set(blocks)
    assert all(c in warm for c in eng.calls[len(warm):])                 # timed: all repeats
    assert len(eng.calls) == 3 * len(warm)
    assert [r["block_size"] for r in rows] == list(blocks)
    assert all(r["speedup_vs_target_only"] == 1.0 and r["capture_s"] == 1.0 for r in rows)


def test_deprecated_alias_keys_equal_the_new_keys():
    eng = FakeEngine()
    res = bm.compare([(1, 2, 3)], eng, None, 8, 4, 1, log=lambda m: None)
    rows = bm.block_sweep([(1, 2)], eng, 8, (2, 4), 1, log=lambda m: None)
    from dflash2rt.bench.suite import merge_batch1

    merged = merge_batch1([res, res])
    for d in (res, merged):
        assert d["ar_tokens_per_s"] == d["target_only_tokens_per_s"]
        assert d["speedup_vs_ar"] == d["speedup_vs_target_only"]
    for r in rows:
        assert r["speedup_vs_ar"] == r["speedup_vs_target_only"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    root = save_pair_dir(tmp_path_factory.mktemp("bench") / "model",
                         tiny_pair(dtype=torch.float32))
    (root / "heldout_prompts.json").write_text(json.dumps(["def f(x):", "import os"]))
    return root


def _cpu():
    from dflash2rt.registry import Registry

    return Registry.discover().select("cpu").backend


def test_run_bench_smoke_with_aliases(model_dir):
    """The bench end to end on a tiny pair (no transformers): JSON keys old and new agree."""
    from dflash2rt.api import resolve_model
    from dflash2rt.bench.suite import run_bench

    backend = _cpu()
    pair = resolve_model(model_dir, backend.device)
    res = run_bench(pair, model_dir, backend, max_new=6, repeats=1, blocks=(2, 4), n_prompts=1,
                    with_hf=False, log=lambda m: None)
    json.dumps(res)
    for d in (res, res["batch1"], res["batch8"]):
        assert d["ar_tokens_per_s"] == d["target_only_tokens_per_s"] > 0
        assert d["speedup_vs_ar"] == d["speedup_vs_target_only"] > 0
    assert [r["block_size"] for r in res["sweep"]] == [2, 4]
    assert set(res["capture_s"]) == {"cache_sizing", "batch1", "batch8", "sampled", "sweep"}
    assert res["tau"] >= 1 and res["tau_t1"] >= 1


def test_training_evaluation_measures_through_the_module(model_dir, monkeypatch):
    """train.evaluate.measure warms spec and target-only up before timing (via bench.measure)
    and keeps its old keys as aliases."""
    from dflash2rt.api import resolve_model
    from dflash2rt.train import evaluate

    seen = []
    real = bm.measure
    monkeypatch.setattr(evaluate, "measure_contenders",
                        lambda cs, repeats: seen.append([c.name for c in cs]) or real(cs, repeats))
    backend = _cpu()
    pair = resolve_model(model_dir, backend.device)
    prompts = [list(range(3, 9)), list(range(10, 15))]
    res = evaluate.measure(pair, backend, prompts, 6, 0.0)
    assert seen == [["spec", "target_only"]]
    assert res["target_tokens_per_s"] == res["target_only_tokens_per_s"] > 0
    assert res["speedup"] == res["speedup_vs_target_only"]
    assert res["tau"] >= 1 and sum(res["accept_hist"]) > 0 and "greedy_mismatches" in res
    sampled = evaluate.measure(pair, backend, prompts, 6, 1.0, baseline=False)
    assert "target_only_tokens_per_s" not in sampled and sampled["spec_tokens_per_s"] > 0
