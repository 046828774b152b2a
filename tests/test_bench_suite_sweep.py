"""The bench driver (``bench/suite.py``) with its measurements replaced by recorders: which
prompts, counts and contenders each stage gets, the JSON it assembles from their canned results
(the T = 1 τ, the capture seconds, the greedy check over every row, the transformers line),
``--temperatures`` parsing, the batch-1 merge worked out by hand (total tokens over total
seconds), and the two tables as exact text."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch

from dflash2rt.bench import suite
from dflash2rt.bench.measure import TEMPERATURES, Temperature
from dflash2rt.bench.suite import (heldout_prompts, merge_batch1, parse_temperatures,
                                   profile_table, rows_table, run_bench)
from dflash2rt.errors import InvalidInputError

T0, T07, T1 = TEMPERATURES


# --temperatures

@pytest.mark.parametrize("text, want", [
    ("0,0.7,1", [T0, T07, T1]),
    ("1", [T0, T1]),
    ("0.7", [T0, T07]),                                   # the named T = 0.7: top-p 0.95
    ("0", [T0]),
    ("", [T0]),
    (" 1 , ,0.5 ", [T0, T1, Temperature("T=0.5", 0.5, 1.0)]),
    ("1,1,0,1", [T0, T1]),                                # each once, T = 0 first
    ("0.7:1", [T0, Temperature("T=0.7 top-p 1", 0.7, 1.0)]),
    ("1:1", [T0, Temperature("T=1 top-p 1", 1.0, 1.0)]),
    ("2:0.5,2:0.5", [T0, Temperature("T=2 top-p 0.5", 2.0, 0.5)]),
    ("0:0.5", [T0, Temperature("T=0 top-p 0.5", 0.0, 0.5)]),
])
def test_parse_temperatures(text, want):
    assert list(parse_temperatures(text)) == want


@pytest.mark.parametrize("text", ["-0.5", "1:0", "1:1.0001", "inf", "1:-1"])
def test_parse_temperatures_outside_the_domain(text):
    with pytest.raises(InvalidInputError) as exc:
        parse_temperatures(text)
    assert str(exc.value) == (f"temperature {text!r}: T must be a finite number >= 0 and "
                              "top-p in (0, 1]")


def test_parse_temperatures_not_numbers():
    with pytest.raises(InvalidInputError) as exc:
        parse_temperatures("0, warm")
    assert str(exc.value) == "temperatures take T or T:TOP_P, comma-separated, got 'warm'"


# the batch-1 merge

def _run(tokens, target, spec, hf, tau, equal, draft, verify):
    return {"tokens": tokens, "target_only_tokens_per_s": target, "spec_tokens_per_s": spec,
            "hf_tokens_per_s": hf, "tau": tau, "greedy_equal": equal,
            "time_split_per_step_s": {"draft": draft, "verify": verify}}


def test_merge_batch1_is_total_tokens_over_total_seconds():
    """Prompt 0: 10 tokens at 5 / 10 / 2 tok/s (2, 1, 5 s); prompt 1: 30 tokens at 30 / 60 / 6
    (1, 0.5, 5 s); prompt 2: 20 tokens at 20 / 40 / 4 (1, 0.5, 5 s): 60 tokens in 4, 2 and
    15 s."""
    rows = [_run(10, 5.0, 10.0, 2.0, 2.0, True, 0.25, 0.5),
            _run(30, 30.0, 60.0, 6.0, 3.0, False, 0.5, 1.0),
            _run(20, 20.0, 40.0, 4.0, 4.0, False, 0.75, 3.0)]
    got = merge_batch1(rows)
    assert got["prompts"] == 3
    assert math.isclose(got["target_only_tokens_per_s"], 15.0, rel_tol=1e-15)
    assert math.isclose(got["spec_tokens_per_s"], 30.0, rel_tol=1e-15)
    assert math.isclose(got["hf_tokens_per_s"], 4.0, rel_tol=1e-15)
    assert got["tau"] == 3.0
    assert math.isclose(got["speedup_vs_target_only"], 2.0, rel_tol=1e-15)
    assert math.isclose(got["speedup_vs_hf"], 7.5, rel_tol=1e-15)
    assert math.isclose(got["efficiency"], 2.0 / 3.0, rel_tol=1e-15)
    assert got["greedy_equal"] is False and got["mismatched_prompts"] == [1, 2]
    assert got["time_split_per_step_s"] == {"draft": 0.5, "verify": 1.5}
    assert got["ar_tokens_per_s"] == got["target_only_tokens_per_s"]
    assert got["speedup_vs_ar"] == got["speedup_vs_target_only"]


def test_merge_batch1_without_transformers():
    rows = [_run(8, 4.0, 8.0, None, 2.0, True, 0.0, 1.0),
            _run(8, 4.0, 8.0, 3.0, 2.0, True, 0.0, 1.0)]
    got = merge_batch1(rows)
    assert got["hf_tokens_per_s"] is None and got["speedup_vs_hf"] is None
    assert got["greedy_equal"] is True and got["mismatched_prompts"] == []
    assert got["speedup_vs_target_only"] == 2.0 and got["efficiency"] == 1.0


def test_merge_batch1_of_one_prompt_is_that_prompt():
    got = merge_batch1([_run(12, 3.0, 6.0, 4.0, 2.5, False, 0.125, 0.375)])
    assert (got["prompts"], got["target_only_tokens_per_s"], got["spec_tokens_per_s"],
            got["hf_tokens_per_s"], got["tau"]) == (1, 3.0, 6.0, 4.0, 2.5)
    assert got["speedup_vs_target_only"] == 2.0 and got["speedup_vs_hf"] == 1.5
    assert got["efficiency"] == 0.8 and got["mismatched_prompts"] == [0]
    assert got["time_split_per_step_s"] == {"draft": 0.125, "verify": 0.375}


# run_bench with every stage a recorder

BLOCK = 8


def _compare(speedup, hf_speedup):
    return {"prompts": 3, "tau": 4.5, "target_only_tokens_per_s": 10.0,
            "spec_tokens_per_s": 10.0 * speedup, "hf_tokens_per_s": 5.0,
            "speedup_vs_target_only": speedup, "speedup_vs_hf": hf_speedup, "efficiency": 0.5,
            "time_split_per_step_s": {"draft": 0.25}, "greedy_equal": True}


def _measured_row(batch, temp, top_p, tau, equal):
    return {"batch": batch, "temperature_value": temp, "top_p": top_p, "greedy_equal": equal,
            "contenders": {"fixed": {"tau": tau}}}


class Rig:
    """run_bench's collaborators replaced; ``calls`` in order, canned results."""

    def __init__(self, monkeypatch, rows, hf_reason=None):
        self.calls, self.rows = [], rows
        self.backend = SimpleNamespace(name="fake", device=torch.device("cpu"))
        self.prompts = [(i, i + 1) for i in range(20)]
        rig = self

        class Engine:
            def __init__(self, pair, backend):
                rig.calls.append(("engine", pair, backend))
                self.backend = backend

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                rig.calls.append("engine closed")

        for name, fn in [
                ("Engine", Engine),
                ("resolve_backend", lambda b: self.calls.append(("resolve", b)) or self.backend),
                ("heldout_prompts",
                 lambda root, pair: self.calls.append(("heldout", root)) or self.prompts),
                ("hf_available", lambda: hf_reason),
                ("HFGreedy", lambda path, dtype, device: self.calls.append(
                    ("hf", path, dtype, device)) or "HF"),
                ("warm_caches", self.warm), ("measure_rows", self.measure),
                ("block_sweep", self.sweep)]:
            monkeypatch.setattr(suite, name, fn)

    def warm(self, engine, prompts, max_new, block):
        self.calls.append(("warm", list(prompts), max_new, block))
        return 0.5

    def measure(self, engine, by_batch, max_new, block, repeats, hf, temperatures, log):
        self.calls.append(("rows", {b: list(p) for b, p in by_batch.items()}, max_new, block,
                           repeats, hf, temperatures))
        return {"compare": {1: _compare(2.0, 1.5), 8: _compare(3.0, None)}, "rows": self.rows,
                "step_profile": {"rows": []}, "capture_s": {1: 0.25, 8: 0.75}}

    def sweep(self, prompts, engine, max_new, blocks, repeats, log):
        self.calls.append(("sweep", list(prompts), max_new, tuple(blocks), repeats))
        return [{"block_size": 2, "capture_s": 0.125}, {"block_size": 4, "capture_s": 0.375}]


def _pair():
    return SimpleNamespace(name="tiny", draft=SimpleNamespace(cfg=SimpleNamespace(
        block_size=BLOCK)), target=torch.nn.Linear(2, 2).to(torch.bfloat16))


ROWS = [_measured_row(1, 0.0, 1.0, 4.5, True), _measured_row(8, 1.0, 1.0, 9.0, None),
        _measured_row(1, 1.0, 0.95, 8.0, None), _measured_row(1, 1.0, 1.0, 5.0, None),
        _measured_row(8, 0.0, 1.0, 4.0, True)]


@pytest.mark.parametrize("n_prompts, repeats", [(2, 1), (12, 3)])
def test_run_bench_hands_each_stage_its_prompts_and_counts(monkeypatch, tmp_path, n_prompts,
                                                           repeats):
    rig = Rig(monkeypatch, ROWS)
    pair, logs = _pair(), []
    res = run_bench(pair, tmp_path, "be", max_new=6, repeats=repeats, blocks=(2, 4),
                    n_prompts=n_prompts, with_hf=True, log=logs.append,
                    temperatures=[T0, T1])
    p = rig.prompts
    assert rig.calls == [
        ("resolve", "be"), ("engine", pair, rig.backend), ("heldout", tmp_path),
        ("hf", tmp_path / "target", torch.bfloat16, torch.device("cpu")),
        ("warm", p[:8], 6, BLOCK),
        ("rows", {1: p[:n_prompts], 8: p[:8]}, 6, BLOCK, repeats, "HF", (T0, T1)),
        ("sweep", p[:min(4, n_prompts)], 6, (2, 4), max(1, repeats - 1)),
        "engine closed"]
    assert logs == ["batch 1 over 3 prompts: spec x2.00 vs target-only, x1.50 vs transformers"]
    assert res["capture_s"] == {"cache_sizing": 0.5, "batch1": 0.25, "batch8": 0.75,
                                "sweep": 0.5}
    assert res["hf_baseline"] == ("transformers generate(), same weights (bfloat16, cpu), "
                                  "eos_token_id=None (exactly 6 tokens), greedy at T=0, "
                                  "sampled (torch RNG seeded) otherwise")


def test_run_bench_reads_up_to_eight_prompts_beyond_n(monkeypatch, tmp_path):
    """heldout_prompts' list is cut to max(n_prompts, 8) before any stage sees it."""
    rig = Rig(monkeypatch, ROWS)
    rig.prompts = [(i,) for i in range(6)]
    run_bench(_pair(), tmp_path, None, max_new=4, repeats=2, blocks=(2,), n_prompts=5,
              with_hf=False, log=lambda m: None, temperatures=[T0])
    assert [c for c in rig.calls if c[0] == "rows"][0][1] == {1: rig.prompts[:5],
                                                              8: rig.prompts}


def test_run_bench_json(monkeypatch, tmp_path):
    rig = Rig(monkeypatch, ROWS, hf_reason="transformers is not installed")
    logs: list = []
    res = run_bench(_pair(), tmp_path, None, max_new=6, repeats=2, blocks=(2, 4), n_prompts=3,
                    with_hf=True, log=logs.append, temperatures=[T0, T1])
    assert not any(c[0] == "hf" for c in rig.calls)
    assert [c for c in rig.calls if c[0] == "rows"][0][5] is None
    assert logs == ["batch 1 over 3 prompts: spec x2.00 vs target-only"]
    batch1 = _compare(2.0, 1.5)
    want = {
        "model": "tiny", "backend": "fake", "device": "cpu", "block_size": BLOCK,
        "max_new_tokens": 6, "tau": 4.5, "tau_t1": 5.0,
        "target_only_tokens_per_s": 10.0, "spec_tokens_per_s": 20.0, "hf_tokens_per_s": 5.0,
        "speedup_vs_target_only": 2.0, "speedup_vs_hf": 1.5, "efficiency": 0.5,
        "time_split_per_step_s": {"draft": 0.25}, "greedy_equal": True,
        "greedy_equal_all": True, "rows": ROWS, "step_profile": {"rows": []},
        "batch1": batch1, "batch8": _compare(3.0, None),
        "sweep": [{"block_size": 2, "capture_s": 0.125}, {"block_size": 4, "capture_s": 0.375}],
        "capture_s": {"cache_sizing": 0.5, "batch1": 0.25, "batch8": 0.75, "sweep": 0.5},
        "requests": "seeded SamplingParams(temperature, top_p, seed=1234 + prompt index, "
                    "ignore_eos=True): the same seeds for every contender; exactly 6 new "
                    "tokens per prompt on every side",
        "hf_baseline": "transformers is not installed",
        "assisted_generation": "not measured: transformers' assisted generation needs an "
                               "autoregressive draft LM; the bundled draft is a DFlash2 "
                               "block draft, which transformers cannot run",
        "ar_tokens_per_s": 10.0, "speedup_vs_ar": 2.0}
    assert res == want
    json.dumps(res)


def test_run_bench_without_transformers_by_choice(monkeypatch, tmp_path):
    rig = Rig(monkeypatch, ROWS)
    res = run_bench(_pair(), tmp_path, None, max_new=6, repeats=2, blocks=(2,), n_prompts=3,
                    with_hf=False, log=lambda m: None, temperatures=[T0])
    assert res["hf_baseline"] == "disabled (--no-hf)"
    assert not any(c[0] == "hf" for c in rig.calls)


@pytest.mark.parametrize("rows, tau_t1, equal_all", [
    ([_measured_row(1, 0.0, 1.0, 4.5, True), _measured_row(8, 1.0, 1.0, 9.0, None)], None,
     True),
    ([_measured_row(1, 0.0, 1.0, 4.5, True), _measured_row(1, 0.7, 1.0, 3.0, None)], None,
     True),
    ([_measured_row(1, 0.0, 1.0, 4.5, True), _measured_row(8, 0.0, 1.0, 4.5, False),
      _measured_row(1, 1.0, 1.0, 2.5, None)], 2.5, False),
    ([_measured_row(1, 0.0, 1.0, 4.5, None)], None, True),
])
def test_the_t1_tau_and_the_greedy_check_over_rows(monkeypatch, tmp_path, rows, tau_t1,
                                                   equal_all):
    """tau_t1: the fixed block's τ of the batch-1, T = 1, top-p 1 row (None without one);
    greedy_equal_all: every row that checked (not None) was equal."""
    Rig(monkeypatch, rows)
    res = run_bench(_pair(), tmp_path, None, max_new=6, repeats=2, blocks=(2,), n_prompts=3,
                    with_hf=False, log=lambda m: None, temperatures=[T0])
    assert res["tau_t1"] == tau_t1 and res["greedy_equal_all"] is equal_all


@pytest.mark.parametrize("temperatures", [[], [T1], [T1, T0]])
def test_run_bench_needs_t0_first(monkeypatch, tmp_path, temperatures):
    rig = Rig(monkeypatch, ROWS)
    with pytest.raises(ValueError, match=r"the bench's first temperature must be T = 0"):
        run_bench(_pair(), tmp_path, None, temperatures=temperatures, log=lambda m: None)
    assert rig.calls == []


@pytest.mark.parametrize("blocks", [(2,), (16, 2)])
def test_run_bench_takes_blocks_from_two(monkeypatch, tmp_path, blocks):
    rig = Rig(monkeypatch, ROWS)
    run_bench(_pair(), tmp_path, None, max_new=1, repeats=1, blocks=blocks, n_prompts=1,
              with_hf=False, log=lambda m: None, temperatures=[T0])
    assert [c for c in rig.calls if c[0] == "sweep"][0][3] == blocks


def test_run_bench_defaults(monkeypatch, tmp_path):
    """max_new 64, 3 repeats, blocks 2, 4, 8, 16, 8 prompts, transformers compared, the three
    temperatures."""
    rig = Rig(monkeypatch, ROWS)
    run_bench(_pair(), tmp_path, log=lambda m: None)
    p = rig.prompts
    assert rig.calls[0] == ("resolve", None)
    assert ("rows", {1: p[:8], 8: p[:8]}, 64, BLOCK, 3, "HF", TEMPERATURES) in rig.calls
    assert ("sweep", p[:4], 64, (2, 4, 8, 16), 2) in rig.calls


def test_heldout_prompts_are_the_files_texts_tokenised(tmp_path):
    (tmp_path / "heldout_prompts.json").write_text(json.dumps(["ab", {"prompt": "c"}]))
    pair = SimpleNamespace(tokenizer=SimpleNamespace(encode=lambda s: [ord(c) for c in s]))
    assert heldout_prompts(tmp_path, pair) == [(97, 98), (99,)]


# the tables

def _contender(rate, speedup=None, tau=None):
    c = {"tokens_per_s": rate, "speedup_vs_target_only": speedup}
    if tau is not None:
        c["tau"] = tau
    return c


def test_rows_table_text():
    res = {"block_size": 8, "rows": [
        {"temperature": "T=0", "batch": 1, "greedy_equal": True, "contenders": {
            "target_only": _contender(100.0), "fixed": _contender(250.25, 2.5025, 4.5),
            "adaptive": {**_contender(300.0, 3.0, 5.25), "block_sizes": {4: 3, 8: 7},
                         "target_only_calls": 2, "calls": 5},
            "hf": _contender(50.0, 0.5)}},
        {"temperature": "T=1", "batch": 8, "greedy_equal": False, "mismatched_prompts": [0, 3],
         "contenders": {
             "target_only": _contender(80.5), "fixed": _contender(120.0, None, None),
             "adaptive": {**_contender(90.0, 1.125, 2.0), "block_sizes": {2: 1},
                          "target_only_calls": 0, "calls": 1},
             "hf": _contender(40.0, 0.5)}}]}
    head = (" " * 28 + f"{'target-only tok/s':>17}" + f"{'block-8 tok/s (x) tau':>29}"
            + f"{'adaptive tok/s (x) tau':>29}" + f"{'transformers tok/s (x)':>29}")
    assert rows_table(res).split("\n") == [
        head,
        f"{'T=0, batch 1':28}" + "            100.0" + "         250.2 (x 2.50)  4.50"
        + "         300.0 (x 3.00)  5.25" + "          50.0 (x 0.50)      ",
        f"{'T=1, batch 8':28}" + "             80.5" + "         120.0 (x 0.00)      "
        + "          90.0 (x 1.12)  2.00" + "          40.0 (x 0.50)      "
        + "  greedy spec != target-only: [0, 3]",
        "adaptive blocks chosen (block size: steps): T=0, b1: {4: 3, 8: 7} (2 of 5 calls "
        "planned target-only); T=1, b8: {2: 1}"]


def test_rows_table_of_target_only_and_nothing():
    assert rows_table({"rows": []}) == "no rows measured" == rows_table({})
    res = {"rows": [{"temperature": "T=0", "batch": 1,
                     "contenders": {"target_only": _contender(7.0)}}]}
    assert rows_table(res).split("\n") == [" " * 28 + "target-only tok/s",
                                           f"{'T=0, batch 1':28}" + "              7.0"]


def test_profile_table_text():
    prof = {"rows": [{"temperature": "T=0", "batch": 1, "contender": "fixed", "draft": 0.001,
                      "verify": 0.0025, "host": 0.0005, "step": 0.004}],
            "sampled_over_greedy": [
                {"block_size": 8, "temperature": "T=1", "batch": 1, "ratio": 1.125},
                {"block_size": 8, "temperature": "T=1", "batch": 8, "ratio": 0.5}],
            "goal_sampled_over_greedy": 1.25}
    assert profile_table(prof).split("\n") == [
        "per-step cost, ms (separate profiling pass, device synced between phases):",
        " " * 28 + "   contender    draft   verify     host     step",
        f"{'T=0, batch 1':28}" + "       fixed    1.000    2.500    0.500    4.000",
        "sampled / greedy spec step cost (block 8, goal <= 1.25): T=1 b1 x1.12, T=1 b8 x0.50"]
    assert profile_table({"rows": prof["rows"]}).split("\n") == \
        profile_table(prof).split("\n")[:3]
    assert profile_table({}) == "step profile: not measured"
    one = {**prof, "sampled_over_greedy": [{"block_size": 4, "temperature": "T=0.7 top-p 0.95",
                                            "batch": 8, "ratio": 2.0}]}
    assert profile_table(one).split("\n")[3] == \
        "sampled / greedy spec step cost (block 4, goal <= 1.25): T=0.7 top-p 0.95 b8 x2.00"
