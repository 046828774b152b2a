"""The cost model (``dflash2rt bench --costs``): its arithmetic, and a measured run on a tiny pair."""

from __future__ import annotations

import math

import pytest
import torch

from dflash2rt import get_backend
from dflash2rt.bench.costs import alpha_for, expected_len, measure_costs, projected_table

from tiny_models import tiny_pair


def test_expected_length_and_its_inverse():
    assert expected_len(0.0, 8) == 1 and expected_len(1.0, 8) == 8
    assert math.isclose(expected_len(0.5, 3), 1 + 0.5 + 0.25)
    for tau, block in ((1.0, 16), (4.69, 8), (6.5, 16), (15.9, 16)):
        assert math.isclose(expected_len(alpha_for(tau, block), block), tau, rel_tol=1e-9)
    with pytest.raises(ValueError):
        alpha_for(9.0, 8)


def test_measured_costs_give_the_co_design_formula_per_row():
    pair = tiny_pair("dflash2", block=4)
    limit = pair.target.cfg.max_position_embeddings
    res = measure_costs(pair, get_backend("cpu"), blocks=(2, 4), contexts=(8, 16, limit),
                        batches=(1, 2), tau=3.0, tau_block=4, reps=1, log=lambda m: None)
    assert res["skipped_contexts"] == [limit]
    assert [(r["batch"], r["context"]) for r in res["rows"]] == [(1, 8), (1, 16), (2, 8), (2, 16)]
    alpha = res["acceptance"]["alpha"]
    for r in res["rows"]:
        assert r["t_target_s"] > 0 and set(r["blocks"]) == {2, 4}
        assert r["bytes_per_target_step"] > res["target_weight_bytes"]
        assert math.isclose(r["bandwidth_fraction"] * res["copy_bandwidth_gbps"],
                            r["bytes_per_target_step"] / r["t_target_s"] / 1e9)
        for b, v in r["blocks"].items():
            assert v["t_draft_s"] > 0 and v["t_verify_s"] > 0
            assert math.isclose(r["projected_speedup"][b], expected_len(alpha, b)
                                * r["t_target_s"] / (v["t_draft_s"] + v["t_verify_s"]))
    assert res["rows"][2]["bytes_per_target_step"] > res["rows"][0]["bytes_per_target_step"]
    assert "projected speedup" in projected_table(res)


def test_transformers_step_is_its_own_cached_forward_and_says_which_cache_ran(tmp_path,
                                                                            monkeypatch):
    """transformers' step is one forward of one token per row on its StaticCache after one
    prefill: the greedy tokens it ran equal generate()'s; a failing static cache is named."""
    pytest.importorskip("transformers", reason="the peer baseline needs transformers")
    import transformers
    from _hf_tiny import write_checkpoint

    from dflash2rt.bench.hf_baseline import hf_step
    from dflash2rt.bench.hf_baseline import HFGreedy

    hf = HFGreedy(write_checkpoint("qwen3", tmp_path / "ckpt"), dtype=torch.float64)
    r = hf_step(hf, batch=2, context=5, vocab=97, new=3)
    assert r["cache"] == "static" and r["t_step_s"] > 0 and r["t_prefill_s"] > 0
    want, _ = hf.generate(r["prompts"], 5)
    assert r["tokens"] == want
    def refuse(*args, **kwargs):
        raise ValueError("no static cache here")

    monkeypatch.setattr(transformers.StaticCache, "__init__", refuse)
    bad = hf_step(hf, batch=1, context=3, vocab=97, new=2)
    assert bad["cache"] == "dynamic (static failed: ValueError: no static cache here)"
    assert bad["tokens"] == hf.generate(bad["prompts"], 4)[0]


def test_fresh_placement_moves_both_caches_and_changes_no_step():
    """Before timed steps both sides' caches are copied to fresh memory: new buffers, the same
    contents and layout (ours head-major), and our step gives the same tokens after it."""
    from types import SimpleNamespace

    from dflash2rt.backend import Fallbacks
    from dflash2rt.bench.costs import fresh_placement
    from dflash2rt.engine.engine import Engine
    from dflash2rt.engine.request import Request, SamplingParams

    pair, backend = tiny_pair("dflash2", block=4), get_backend("cpu")
    prompts = [(3, 1, 4, 1, 5), (9, 2, 6, 5, 3)]
    reqs = [Request(p, SamplingParams(max_new_tokens=5)) for p in prompts]
    clock = {"draft": 0.0, "verify": 0.0}
    with Engine(pair, backend) as engine, torch.inference_mode(), backend.run_context():
        runner = engine.runner

        def start():
            st = runner.start(reqs, True, 4, None, Fallbacks().report, clock)
            runner.prefill(st, list(prompts))
            return st

        def run(st):
            return [runner.step(st, b).host for b in (1, 4)]

        before = run(start())
        st = start()
        old = st.target_storage
        peer = [SimpleNamespace(keys=torch.randn(1, 2, 7, 4), values=torch.randn(1, 2, 7, 4))
                for _ in range(3)]
        theirs = [(p.keys, p.values) for p in peer]
        fresh_placement(st, runner, peer)
        new = st.target_storage
        assert new is not old and new.side is old.side
        for a, b in zip((*old.k, *old.v), (*new.k, *new.v)):
            assert torch.equal(a, b) and a.data_ptr() != b.data_ptr() and a.stride() == b.stride()
        for p, (k, v) in zip(peer, theirs):
            assert torch.equal(p.keys, k) and p.keys.data_ptr() != k.data_ptr()
            assert torch.equal(p.values, v) and p.values.data_ptr() != v.data_ptr()
        for a in (*old.k, *old.v):
            a.zero_()                       # a step still reading the old buffers would change
        assert run(st) == before
        with pytest.raises(RuntimeError, match="hold the old cache storage"):
            fresh_placement(st, runner)
