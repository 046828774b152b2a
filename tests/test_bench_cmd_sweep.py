"""Plain ``dflash2rt bench`` and ``bench --costs`` with the measurements replaced by recorders:
the flags' defaults, which combinations of --shape / --model / --costs are refused, the pair,
τ and transformers baseline the cost model gets, the summary lines and the JSON, written out
here by hand (a fake clock for the build time)."""

from __future__ import annotations

import json
import types

import pytest
import torch

import dflash2rt.api
import dflash2rt.bench.costs
import dflash2rt.bench.hf_baseline
import dflash2rt.bench.suite
import dflash2rt.bundled
import dflash2rt.engine.engine
import dflash2rt.models.hf_loader
import dflash2rt.synth.in_memory
from dflash2rt.bundled import bundled_path
from dflash2rt.cli import build_parser, main
from dflash2rt.registry import Registry

from fake_clock import Readings

BACKEND = types.SimpleNamespace(name="cpu", device="dev")


@pytest.fixture
def rig(monkeypatch, tmp_path):
    """Registry, model paths and loading scripted; ``log`` records every call."""
    log = {}
    picked = []

    class Reg:
        def select(self, name):
            picked.append(name)
            return types.SimpleNamespace(backend=BACKEND)

    monkeypatch.setattr(Registry, "discover", classmethod(lambda cls: Reg()))
    monkeypatch.setattr(dflash2rt.bundled, "model_dir", lambda m: tmp_path / m)
    monkeypatch.setattr(dflash2rt.api, "resolve_model",
                        lambda path, dev, dtype: ("PAIR", path, dev, dtype))
    log["picked"], log["root"] = picked, tmp_path
    return log


def test_defaults():
    a = build_parser().parse_args(["bench"])
    got = (a.backend, a.model, a.max_new_tokens, a.dtype, a.repeats, a.prompts, a.blocks,
           a.no_hf, a.temperatures, a.costs, a.contexts, a.batches, a.reps, a.tau, a.shape,
           a.layers, a.draft_layers, a.seed, a.json, a.json_out, a.tool)
    assert got == (None, None, 128, "float32", 3, 8, "2,4,8,16", False, "0,0.7,1",
                   False, "128,2048,8192", "1,8", 3, None, None, None, None, None, False, None,
                   None)


def test_a_published_shape_is_a_choice_of_costs():
    for shape in ("qwen3-8b", "toy-qwen3"):
        assert build_parser().parse_args(["bench", "--shape", shape]).shape == shape


def _result(tau_t1=1.5, hf=2.0):
    return {"tau": 4.25, "tau_t1": tau_t1, "block_size": 8, "speedup_vs_target_only": 1.5,
            "speedup_vs_hf": hf, "efficiency": 0.75, "greedy_equal_all": True,
            "hf_baseline": "1.0 tok/s", "capture_s": {"a": 0.5, "b": 0.25},
            "step_profile": {"p": 1}}


def _bench(monkeypatch, result):
    calls = []

    def run_bench(*a):
        calls.append(a)
        return result

    monkeypatch.setattr(dflash2rt.bench.suite, "run_bench", run_bench)
    monkeypatch.setattr(dflash2rt.bench.suite, "rows_table", lambda res: "ROWS")
    monkeypatch.setattr(dflash2rt.bench.suite, "profile_table", lambda prof: f"PROFILE {prof}")
    return calls


def test_bench_text(rig, monkeypatch, capsys):
    calls = _bench(monkeypatch, _result())
    assert main(["bench", "--no-hf", "--blocks", "2,4", "--dtype", "bfloat16"]) == 0
    [(pair, path, backend, n, repeats, blocks, prompts, with_hf, log, temps)] = calls
    root = rig["root"] / "stdlib-code"
    assert (pair, path, backend) == (("PAIR", root, "dev", torch.bfloat16), root, BACKEND)
    assert (n, repeats, blocks, prompts, with_hf, log) == (128, 3, (2, 4), 8, False, print)
    assert [t.temperature for t in temps] == [0.0, 0.7, 1.0]
    assert rig["picked"] == [None]
    assert capsys.readouterr().out == (
        "\nROWS\n\nPROFILE {'p': 1}\n\ntau 4.25 (T=0), 1.50 (T=1), batch 1, block 8; "
        "speedup x1.50 vs target-only, x2.00 vs transformers; efficiency 0.75; greedy spec == "
        "target-only (every prompt, fixed and adaptive, batch 1 and 8): True\n"
        "transformers: 1.0 tok/s\ngraph capture / compile (untimed warm-up runs): 0.75 s\n")


def test_bench_text_without_t1_or_transformers(rig, monkeypatch, capsys):
    _bench(monkeypatch, _result(tau_t1=None, hf=None))
    assert main(["bench", "--model", "m"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[5] == ("tau 4.25 (T=0), batch 1, block 8; speedup x1.50 vs target-only, "
                        "efficiency 0.75; greedy spec == target-only (every prompt, fixed and "
                        "adaptive, batch 1 and 8): True")


def test_bench_json_to_stdout_and_file_logs_to_stderr(rig, monkeypatch, capsys, tmp_path):
    calls = _bench(monkeypatch, {"tau": 2})
    out = tmp_path / "r.json"
    assert main(["bench", "--model", "m", "--json", "--json-out", str(out)]) == 0
    [(pair, path, *_, with_hf, log, _)] = calls
    assert path == rig["root"] / "m" and with_hf is True
    assert out.read_text() == '{\n  "tau": 2\n}\n'
    assert capsys.readouterr().out == '{\n  "tau": 2\n}\n'
    log("progress")
    assert capsys.readouterr().err == "progress\n"


@pytest.mark.parametrize("argv, message", [
    (["--layers", "2", "--seed", "1"], "--layers sizes the in-memory pair of --shape; pass "
                                       "--shape NAME with it"),
    (["--draft-layers", "2"], "--draft-layers sizes the in-memory pair of --shape; pass "
                              "--shape NAME with it"),
    (["--seed", "0"], "--seed sizes the in-memory pair of --shape; pass --shape NAME with it"),
    (["--shape", "toy-qwen3"], "--shape builds a pair for the cost model only: add --costs, or "
                               "pass a checkpoint with --model"),
    (["--shape", "toy-qwen3", "--costs", "--model", "m"],
     "--shape and --model are exclusive: the cost model runs on the in-memory pair of --shape "
     "or on the checkpoint of --model"),
])
def test_shape_flags_out_of_place_are_refused(rig, argv, message):
    with pytest.raises(SystemExit) as exc:
        main(["bench", *argv])
    assert exc.value.code == message and rig["picked"] == []


def _costs(monkeypatch):
    calls = []

    def measure_costs(pair, backend, **kw):
        calls.append((pair, backend, kw))
        return {"rows": 1}

    monkeypatch.setattr(dflash2rt.bench.costs, "measure_costs", measure_costs)
    monkeypatch.setattr(dflash2rt.bench.costs, "projected_table", lambda res: "PROJECTED")
    return calls


@pytest.mark.parametrize("seed, want", [([], 0), (["--seed", "3"], 3)])
def test_costs_on_a_shape_with_the_bundled_tau(rig, monkeypatch, capsys, seed, want):
    import time

    calls = _costs(monkeypatch)
    built = []

    def build_pair(*a):
        built.append(a)
        return "SHAPED", {"target_layers": 2, "draft_layers": 1, "target_config": {"c": 1}}

    monkeypatch.setattr(dflash2rt.synth.in_memory, "build_pair", build_pair)
    monkeypatch.setattr(time, "perf_counter", Readings(10.0, 12.25))
    assert main(["bench", "--costs", "--no-hf", "--shape", "toy-qwen3", "--layers", "2",
                 "--blocks", "4", "--contexts", "16,32", "--batches", "2", *seed]) == 0
    assert built == [("toy-qwen3", "dev", torch.float32, want, 2, None)]
    report = json.loads((bundled_path("stdlib-code") / "train_report.json").read_text())
    tau, block = report["eval_greedy"]["tau"], report["eval_greedy"]["block_size"]
    source = (f"in memory, seeded (no checkpoint): toy-qwen3, seed {want}, 2 target layers, "
              "1 draft layers")
    assert calls == [("SHAPED", BACKEND, dict(blocks=[4], contexts=[16, 32], batches=[2],
                                              tau=tau, tau_block=block, reps=3, hf=None,
                                              log=print))]
    assert capsys.readouterr().out == \
        f"pair {source}: built on dev in float32 in 2.2 s\nPROJECTED\n"


def test_costs_on_a_checkpoint_against_transformers(rig, monkeypatch, capsys, tmp_path):
    calls = _costs(monkeypatch)
    engines, configs = [], []
    monkeypatch.setattr(dflash2rt.bench.hf_baseline, "hf_available", lambda: None)
    monkeypatch.setattr(dflash2rt.engine.engine, "Engine", lambda p, b: engines.append((p, b)))
    monkeypatch.setattr(dflash2rt.models.hf_loader, "read_config",
                        lambda path: configs.append(path) or {"cfg": 1})

    class HF:
        @classmethod
        def on_weights(cls, config, target):
            return ("HF", config, target), 7

    monkeypatch.setattr(dflash2rt.bench.hf_baseline, "HFGreedy", HF)
    pair = types.SimpleNamespace(target="T")
    monkeypatch.setattr(dflash2rt.api, "resolve_model", lambda path, dev, dtype: pair)
    out = tmp_path / "c.json"
    assert main(["bench", "--costs", "--model", "m", "--tau", "3.5", "--json", "--json-out",
                 str(out)]) == 0
    root = rig["root"] / "m"
    assert configs == [root / "target"] and engines == [(pair, BACKEND)]
    [(p, b, kw)] = calls
    assert (kw["tau"], kw["tau_block"], kw["hf"], kw["blocks"]) == \
        (3.5, 16, ("HF", {"cfg": 1}, "T"), [2, 4, 8, 16])
    want = {"rows": 1, "pair": f"checkpoint: {root}",
            "transformers_weights": "shared: 7 tensors (its model built from the config on the "
                                    "meta device)"}
    text = json.dumps(want, indent=2) + "\n"
    captured = capsys.readouterr()
    assert captured.out == text and out.read_text() == text
    assert captured.err == "transformers reads our 7 weight tensors (shared, not copied)\n"


def test_costs_without_transformers_installed_says_to_pass_no_hf(rig, monkeypatch):
    monkeypatch.setattr(dflash2rt.bench.hf_baseline, "hf_available", lambda: "not installed")
    with pytest.raises(SystemExit) as exc:
        main(["bench", "--costs"])
    assert exc.value.code == ("--costs compares with transformers, which is unavailable "
                              "(not installed); pass --no-hf to measure ours alone")
