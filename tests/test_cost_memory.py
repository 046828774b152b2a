"""The cost bench's memory check (``bench/cost_memory.py``): a row that does not fit the memory
available is skipped before it allocates, with what it needed and what was free; and the
estimate is never below what a row really allocates (every torch allocation of a real row,
counted by the profiler, at small shapes of the synthetic Qwen3 layout)."""

from __future__ import annotations

import gc

import pytest
import torch

from dflash2rt import get_backend
from dflash2rt.bench import costs
from dflash2rt.bench.cost_memory import ours, row_memory, transformers
from dflash2rt.bench.costs import measure_costs, projected_table, step_costs
from dflash2rt.engine.engine import Engine
from dflash2rt.synth.in_memory import build_pair

BLOCKS = [1, 2, 4]


@pytest.fixture(scope="module")
def toy():
    """The toy Qwen3 shape in float32 (4 layers, 64 wide, 1,088 ids) and its config dict."""
    pair, built = build_pair("toy-qwen3", "cpu", torch.float32, seed=0, draft_layers=2)
    return pair, built["target_config"]


@pytest.fixture(scope="module")
def hf(toy):
    pytest.importorskip("transformers", reason="the peer baseline needs transformers")
    from dflash2rt.bench.hf_baseline import HFGreedy

    pair, config = toy
    Engine(pair, get_backend("cpu"))                  # the model pass before sharing
    return HFGreedy.on_weights(config, pair.target)[0]


def peak_bytes(fn) -> int:
    """The most bytes torch's CPU allocator held at once while ``fn`` ran, beyond what it
    held before (every allocation and free, in order, from the profiler)."""
    from torch.profiler import ProfilerActivity, profile

    gc.collect()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted((e for e in prof.profiler.kineto_results.events()
                     if e.name() == "[memory]" and e.device_type().name == "CPU"),
                    key=lambda e: e.start_ns())
    now = top = 0
    for e in events:
        now += e.nbytes()
        top = max(top, now)
    assert events, "the profiler recorded no allocation"
    return top


def test_a_row_that_does_not_fit_is_skipped_before_it_allocates(toy, monkeypatch):
    pair, _ = toy

    def refuse(*args, **kwargs):
        raise AssertionError("a skipped row ran")

    monkeypatch.setattr(costs, "step_costs", refuse)
    res = measure_costs(pair, get_backend("cpu"), blocks=(2,), contexts=(16, 64),
                        batches=(1,), tau=3.0, tau_block=4, reps=1, log=lambda m: None,
                        available=lambda device: 123_456)
    assert res["rows"] == [] and [(r["batch"], r["context"]) for r in res["skipped_rows"]] == \
        [(1, 16), (1, 64)]
    for r in res["skipped_rows"]:
        need = row_memory(pair, 1, r["context"], (1, 2), False, None)
        assert r["needed_bytes"] == need.needed > r["available_bytes"] == 123_456
        assert r["parts"] == need.parts and r["peak_at"] in need.phases
        assert "0.00 GB available on cpu" in r["reason"] and "lower the batch" in r["reason"]
    assert "a stand-in" in res["memory_check"]
    table = projected_table(res)
    assert "batch  1 context    16: skipped: needs" in table


def test_a_row_that_fits_only_without_transformers_says_so(toy, hf, monkeypatch):
    pair, _ = toy
    need = row_memory(pair, 2, 32, BLOCKS, False, 3)
    assert need.ours_alone < need.needed
    free = (need.ours_alone + need.needed) // 2
    monkeypatch.setattr(costs, "HFDecode", lambda *a, **k: pytest.fail("transformers ran"))
    res = measure_costs(pair, get_backend("cpu"), blocks=(2, 4), contexts=(32,), batches=(2,),
                        tau=3.0, tau_block=4, reps=1, hf=hf, log=lambda m: None,
                        available=lambda device: free)
    (skip,) = res["skipped_rows"]
    assert skip["needed_bytes"] == need.needed and skip["available_bytes"] == free
    assert "pass --no-hf" in skip["reason"]
    assert res["transformers_prefill_logits"] == "last row only (logits_to_keep=1)"


def test_our_caches_are_counted_exactly(toy):
    """The cache part is the bytes of the caches the runner makes for the row."""
    from dflash2rt.backend import Fallbacks
    from dflash2rt.engine.request import Request, SamplingParams

    pair, _ = toy
    reqs = [Request((1, 2, 3) * 10, SamplingParams(max_new_tokens=max(BLOCKS) + 1))
            for _ in range(3)]
    with Engine(pair, get_backend("cpu")) as engine:
        st = engine.runner.start(reqs, True, max(BLOCKS), None, Fallbacks().report, {})
        made = sum(t.numel() * t.element_size()
                   for c in (st.target_storage, st.draft_storage) for t in (*c.k, *c.v, *c.side))
    assert ours(pair, 3, 30, BLOCKS, False, False)["our K/V caches"] == made


@pytest.mark.parametrize("batch, context", [(1, 24), (3, 200)])
def test_the_estimate_is_not_below_what_our_row_allocates(toy, batch, context):
    pair, _ = toy
    backend = get_backend("cpu")
    Engine(pair, backend)
    used = peak_bytes(lambda: step_costs(pair, backend, batch, context, BLOCKS, reps=1))
    assert used <= max(row_memory(pair, batch, context, BLOCKS, False, None).phases.values())


@pytest.mark.parametrize("batch, context", [(1, 24), (3, 200)])
def test_the_estimate_is_not_below_what_a_row_with_transformers_allocates(toy, hf, batch,
                                                                          context):
    from dflash2rt.bench.hf_baseline import HFDecode

    pair, _ = toy
    backend = get_backend("cpu")
    vocab = pair.target.cfg.vocab_size

    def row():
        peer = HFDecode(hf, batch, context, vocab, 3)
        step_costs(pair, backend, batch, context, BLOCKS, reps=1, peer=peer)

    used = peak_bytes(row)
    assert used <= max(row_memory(pair, batch, context, BLOCKS, False, 3).phases.values())


@pytest.mark.parametrize("keeps_last", [True, False])
def test_the_estimate_is_not_below_what_transformers_prefill_allocates(toy, hf, keeps_last,
                                                                        monkeypatch):
    """With and without ``logits_to_keep`` (a transformers whose forward lacks it computes
    every row's logits): its cache and prefill stay within their parts."""
    from dflash2rt.bench import hf_baseline

    pair, _ = toy
    monkeypatch.setattr(hf_baseline, "keeps_last_logits", lambda model: keeps_last)
    for batch, context in ((1, 24), (3, 200)):
        dec: list = []
        used = peak_bytes(lambda: dec.append(
            hf_baseline.HFDecode(hf, batch, context, pair.target.cfg.vocab_size, 3)))
        assert dec[0].keep == ({"logits_to_keep": 1} if keeps_last else {})
        dec[0].step()
        dec[0].step()
        assert dec[0].result()["prefill_logits"].startswith(
            "last row" if keeps_last else "every row")
        part = transformers(pair.target.cfg, pair.dtype, batch, context, 3, keeps_last)
        assert used <= part["transformers' K/V cache"] + part["transformers' prefill"]
        layers = dec[0].kv_layers()
        held = sum(t.numel() * t.element_size() for x in layers for t in (x.keys, x.values))
        assert held * (len(layers) + 1) == part["transformers' K/V cache"] * len(layers)
