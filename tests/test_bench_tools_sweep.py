"""``dflash2rt bench TOOL`` end to end with each tool's measurement replaced by a recorder: the
defaults every tool passes on, the arguments it derives, what it prints on stdout / stderr, the
JSON it writes and its exit code, all written out here by hand."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest

import dflash2rt.api
import dflash2rt.bench.ablation
import dflash2rt.bench.launches
import dflash2rt.bench.sampling
import dflash2rt.bench.step_profile
import dflash2rt.bench.suite
import dflash2rt.bench.watermark
import dflash2rt.bundled
import dflash2rt.engine.engine
import dflash2rt.models.pair
import dflash2rt.qualify.tp_equivalence
import dflash2rt.registry
import dflash2rt.train.corpus
import dflash2rt.train.heldout
from dflash2rt.cli import bench_tools, build_parser, main

from fake_clock import Readings


def _args(*argv: str):
    return build_parser().parse_args(["bench", *argv])


@pytest.mark.parametrize("argv, want", [
    (["heldout"], dict(model="stdlib-code", backend="cpu", max_new_tokens=128)),
    (["sampling"], dict(model="stdlib-code", backend="cpu", max_new_tokens=64, prompts=8,
                        repeats=3)),
    (["watermark"], dict(model="stdlib-code", backend=None, docs=200, lengths="32,64,128,256",
                         temperatures="1.0,0.7", null_texts=1000, keys=5, batch=16,
                         block_size=None, seed=0)),
    (["tp-equivalence"], dict(model="stdlib-code", prompts=4, max_new_tokens=64, tp=2,
                              block_size=None, token_prompts=False)),
    (["ablation"], dict(model="stdlib-code", backend="cpu", max_new_tokens=None, repeats=None,
                        prompts=None, temperatures="0,0.7,1", batches="1,8", blocks="4,8",
                        mixed_lengths=False, quick=False)),
    (["step-profile"], dict(model="stdlib-code", backend="cuda", launches=False, rows=1,
                            blocks="8", dtype="float32")),
])
def test_each_tools_defaults(argv, want):
    args = _args(*argv)
    assert {k: getattr(args, k) for k in want} == want
    assert args.json is False and args.json_out is None


class Rec:
    """A stand-in measurement: records its arguments, returns ``result``."""

    def __init__(self, result=None):
        self.calls, self.result = [], result

    def __call__(self, *a, **kw):
        self.calls.append((a, kw))
        return self.result


def _backend(name="cpu", device="cpu", graph_adapter=None):
    return types.SimpleNamespace(name=name, device=device, graph_adapter=graph_adapter)


def _registry(monkeypatch, backend):
    picked = []

    class Reg:
        def select(self, name):
            picked.append(name)
            return types.SimpleNamespace(backend=backend)

    monkeypatch.setattr(dflash2rt.registry.Registry, "discover", staticmethod(lambda: Reg()))
    return picked


def test_emit_writes_indent_1_json_to_the_file_and_stdout_only_when_asked(tmp_path, capsys):
    res = {"a": [1, 2], "p": Path("x")}
    text = '{\n "a": [\n  1,\n  2\n ],\n "p": "x"\n}'
    out = tmp_path / "r.json"
    ns = types.SimpleNamespace
    assert bench_tools._emit(ns(json=False, json_out=str(out)), res) == 0
    assert out.read_text(encoding="utf-8") == text + "\n" and capsys.readouterr().out == ""
    assert bench_tools._emit(ns(json=True, json_out=None), res) == 0
    assert capsys.readouterr().out == text + "\n"
    assert bench_tools._emit(ns(json=False, json_out=None), res) == 0
    assert capsys.readouterr().out == ""


def test_heldout_loads_the_pairs_target_and_draft_directories(tmp_path, monkeypatch, capsys):
    loads, ev = Rec("PAIR"), Rec({"tau": 3.5})
    monkeypatch.setattr(dflash2rt.bundled, "model_dir", lambda m: tmp_path / m)
    monkeypatch.setattr(dflash2rt.bundled, "heldout_ids", lambda root: [[1, 2]])
    monkeypatch.setattr(dflash2rt.models.pair, "load_pair", loads)
    monkeypatch.setattr(dflash2rt.train.heldout, "evaluate_heldout", ev)
    assert main(["bench", "heldout", "--model", "m", "--json", "--max-new-tokens", "5"]) == 0
    assert loads.calls == [((tmp_path / "m" / "target", tmp_path / "m" / "draft"), {})]
    (pair, backend, ids, n, log), _ = ev.calls[0]
    assert (pair, backend, ids, n, log) == ("PAIR", "cpu", [[1, 2]], 5, bench_tools._log)
    assert json.loads(capsys.readouterr().out) == {"tau": 3.5}


def test_the_log_goes_to_stderr_alone(capsys):
    bench_tools._log("step 3")
    out = capsys.readouterr()
    assert (out.out, out.err) == ("", "step 3\n")


def test_sampling_takes_the_first_prompts_and_the_engine(monkeypatch, capsys):
    backend = _backend()
    _registry(monkeypatch, backend)
    monkeypatch.setattr(dflash2rt.api, "resolve_model", lambda m, dev: ("pair", m, dev))
    monkeypatch.setattr(dflash2rt.bundled, "model_dir", lambda m: "dir/" + m)
    monkeypatch.setattr(dflash2rt.bench.suite, "heldout_prompts",
                        lambda root, pair: [f"p{i}" for i in range(20)])

    class Eng:
        def __init__(self, pair, b):
            self.pair, self.backend = pair, b

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    bench = Rec({"ok": 1})
    monkeypatch.setattr(dflash2rt.engine.engine, "Engine", Eng)
    monkeypatch.setattr(dflash2rt.bench.sampling, "sampling_bench", bench)
    assert main(["bench", "sampling"]) == 0
    (eng, prompts, n, repeats, log), _ = bench.calls[0]
    assert eng.pair == ("pair", "stdlib-code", "cpu") and eng.backend is backend
    assert prompts == [f"p{i}" for i in range(8)] and (n, repeats) == (64, 3)
    assert capsys.readouterr().out == ""


def test_watermark_cuts_prompts_of_16_to_64_tokens_and_parses_its_lists(monkeypatch, capsys):
    backend = _backend("cpu")
    picked = _registry(monkeypatch, backend)
    tok = types.SimpleNamespace(encode=lambda text: [len(text)])
    pair = types.SimpleNamespace(name="P", tokenizer=tok)
    monkeypatch.setattr(dflash2rt.api, "resolve_model", lambda m, dev: pair)
    corpus = types.SimpleNamespace(heldout=[("a", "xy"), ("b", "xyz")])
    monkeypatch.setattr(dflash2rt.train.corpus, "load_corpus", lambda: corpus)
    cut = Rec([{"prompt_ids": [7]}, {"prompt_ids": [8, 9]}])
    monkeypatch.setattr(dflash2rt.train.corpus, "cut_prompts", cut)
    seen = {}

    def bench(eng, prompts, heldout_ids, cfg, log):
        seen.update(prompts=prompts, heldout=list(heldout_ids), cfg=cfg)
        return {"false_positives": {"fp": 0}, "power": 1}

    monkeypatch.setattr(dflash2rt.engine.engine, "Engine", lambda p, b: ("E", p, b))
    monkeypatch.setattr(dflash2rt.bench.watermark, "watermark_bench", bench)
    assert main(["bench", "watermark", "--lengths", "8,24", "--temperatures", "0.5",
                 "--docs", "3", "--seed", "4", "--json"]) == 0
    assert picked == [None]
    (heldout, encode, docs, lo, hi, seed), _ = cut.calls[0]
    assert (heldout, docs, lo, hi, seed) == (corpus.heldout, 3, 16, 64, 4) and encode is tok.encode
    assert seen["prompts"] == [[7], [8, 9]] and seen["heldout"] == [[2], [3]]
    cfg = seen["cfg"]
    assert (list(cfg.lengths), list(cfg.temperatures), cfg.null_texts, cfg.keys, cfg.batch,
            cfg.block_size, cfg.seed) == ([8, 24], [0.5], 1000, 5, 16, None, 4)
    out = capsys.readouterr()
    assert json.loads(out.out) == {"model": "P", "backend": "cpu",
                                   "false_positives": {"fp": 0}, "power": 1}
    assert out.err == '{"fp": 0}\n'


@pytest.mark.parametrize("token_prompts", [False, True])
def test_tp_equivalence_prompts_and_its_elapsed_time(monkeypatch, capsys, token_prompts):
    import time

    texts = ["a" * 100, "bc", "d", "e", "f"]
    monkeypatch.setattr(dflash2rt.bundled, "bundled_path", lambda name: "root/" + name)
    monkeypatch.setattr(dflash2rt.bundled, "heldout",
                        lambda root: [{"prompt": t} for t in texts])
    res = types.SimpleNamespace(summary=lambda: "all equal", tensor_parallel="tp 3 ranks",
                                to_dict=lambda: {"equal": True})
    tp = Rec(res)
    monkeypatch.setattr(dflash2rt.qualify.tp_equivalence, "tp_equivalence", tp)
    monkeypatch.setattr(time, "monotonic", Readings(100.0, 142.4))
    argv = ["bench", "tp-equivalence", "--prompts", "2", "--tp", "3", "--json"]
    assert main(argv + (["--token-prompts"] if token_prompts else [])) == 0
    want = [[97] * 96, [98, 99]] if token_prompts else ["a" * 100, "bc"]
    assert tp.calls == [(("stdlib-code", want, 64, 3, None), {})]
    out = capsys.readouterr()
    assert out.err == "all equal\n  tp 3 ranks; 42s\n"
    assert json.loads(out.out) == {"equal": True}


def _ablation(monkeypatch, backend):
    """`bench ablation` over ``backend`` with the pair "PAIR", the prompts ["q"], the table
    "TABLE" and its measurement recorded (returned; it gives {"rows": []})."""
    _registry(monkeypatch, backend)
    monkeypatch.setattr(dflash2rt.api, "resolve_model", lambda m, dev: "PAIR")
    monkeypatch.setattr(dflash2rt.bundled, "model_dir", lambda m: "dir")
    monkeypatch.setattr(dflash2rt.bench.suite, "heldout_prompts", lambda root, pair: ["q"])
    measure = Rec({"rows": []})
    monkeypatch.setattr(dflash2rt.bench.ablation, "measure_ablation", measure)
    monkeypatch.setattr(dflash2rt.bench.ablation, "ablation_table", lambda res: "TABLE")
    return measure


@pytest.mark.parametrize("quick, want", [(False, (128, 3, 8)), (True, (8, 1, 1))])
def test_ablation_fills_unset_counts_from_its_defaults(monkeypatch, capsys, quick, want):
    backend = _backend()
    measure = _ablation(monkeypatch, backend)
    assert main(["bench", "ablation", "--batches", "1,2", "--blocks", "3"]
                + (["--quick"] if quick else [])) == 0
    (pair, prompts, b, n, repeats, count, temps, batches, blocks, log), kw = measure.calls[0]
    assert (pair, prompts, b, (n, repeats, count)) == ("PAIR", ["q"], backend, want)
    assert [(t.temperature, t.top_p) for t in temps] == [(0.0, 1.0), (0.7, 0.95), (1.0, 1.0)]
    assert (batches, blocks, kw) == ([1, 2], [3], {"mixed_lengths": False})
    assert capsys.readouterr().out == "TABLE\n"


def test_ablation_keeps_counts_given_and_prints_json_not_the_table(monkeypatch, capsys):
    measure = _ablation(monkeypatch, _backend())
    assert main(["bench", "ablation", "--max-new-tokens", "5", "--repeats", "2", "--prompts",
                 "4", "--json", "--mixed-lengths"]) == 0
    (_, _, _, n, repeats, count, *_), kw = measure.calls[0]
    assert (n, repeats, count, kw) == (5, 2, 4, {"mixed_lengths": True})
    assert json.loads(capsys.readouterr().out) == {"rows": [], "quick": False}


@pytest.mark.parametrize("as_json", [False, True])
def test_step_profile_launches(monkeypatch, capsys, as_json):
    import torch

    _registry(monkeypatch, _backend("triton"))
    loads = Rec("PAIR")
    monkeypatch.setattr(dflash2rt.api, "resolve_model", loads)
    count = Rec({"step": 3})
    monkeypatch.setattr(dflash2rt.bench.launches, "count_launches", count)
    monkeypatch.setattr(dflash2rt.bench.launches, "launches_text", lambda r: f"TEXT {r}")
    assert main(["bench", "step-profile", "--launches", "--blocks", "4,8", "--dtype", "bfloat16"]
                + (["--json"] if as_json else [])) == 0
    assert loads.calls == [(("stdlib-code", "cpu", torch.bfloat16), {})]
    [((pair, backend, blocks), kw)] = count.calls
    assert (pair, backend.name, blocks, kw) == ("PAIR", "triton", [4, 8], {"rows": 1})
    out = capsys.readouterr().out
    want = {"backend": "triton", "dtype": "bfloat16", "rows": 1, "launches": {"step": 3}}
    assert (json.loads(out) == want) if as_json else (out == "TEXT {'step': 3}\n")


def test_step_profile_without_graphs_says_so_and_exits_1(monkeypatch, capsys):
    _registry(monkeypatch, _backend("cpu", graph_adapter=None))
    prof = Rec({})
    monkeypatch.setattr(dflash2rt.bench.step_profile, "step_profile", prof)
    assert main(["bench", "step-profile", "--backend", "cpu"]) == 1
    out = capsys.readouterr()
    assert (out.out, out.err) == ("", "cpu captures no graphs: nothing to profile\n")
    assert prof.calls == []


@pytest.mark.parametrize("as_json", [False, True])
def test_step_profile_of_a_graphing_backend(monkeypatch, capsys, as_json):
    import torch

    backend = _backend("cuda", device="cuda:0", graph_adapter=object())
    _registry(monkeypatch, backend)
    loads = Rec("PAIR")
    monkeypatch.setattr(dflash2rt.api, "resolve_model", loads)
    prof = Rec({"split": 1})
    monkeypatch.setattr(dflash2rt.bench.step_profile, "step_profile", prof)
    monkeypatch.setattr(dflash2rt.bench.step_profile, "step_profile_text", lambda r: "PROFILE")
    assert main(["bench", "step-profile"] + (["--json"] if as_json else [])) == 0
    assert loads.calls == [(("stdlib-code", "cuda:0", torch.float32), {})]
    assert prof.calls == [(("PAIR", backend), {})]
    out = capsys.readouterr().out
    assert (json.loads(out) == {"split": 1}) if as_json else (out == "PROFILE\n")


@pytest.mark.parametrize("argv, message", [
    (["watermark", "--lengths", "8,x"], "--lengths takes integers, comma-separated, got '8,x'"),
    (["watermark", "--lengths", "8,"], "--lengths takes integers, comma-separated, got '8,'"),
    (["watermark", "--temperatures", "1.0,hot"],
     "--temperatures takes numbers, comma-separated, got '1.0,hot'"),
    (["ablation", "--batches", "1,a"], "--batches takes integers, comma-separated, got '1,a'"),
    (["ablation", "--blocks", "4.5"], "--blocks takes integers, comma-separated, got '4.5'"),
    (["step-profile", "--launches", "--blocks", "4,8x"],
     "--blocks takes integers, comma-separated, got '4,8x'"),
])
def test_a_list_that_is_not_numbers_is_a_typed_error(monkeypatch, capsys, argv, message):
    _registry(monkeypatch, _backend())
    monkeypatch.setattr(dflash2rt.api, "resolve_model", lambda *a: "PAIR")
    monkeypatch.setattr(dflash2rt.bundled, "model_dir", lambda m: "dir")
    monkeypatch.setattr(dflash2rt.bench.suite, "heldout_prompts", lambda root, pair: ["q"])
    for module, name in ((dflash2rt.bench.watermark, "watermark_bench"),
                         (dflash2rt.bench.ablation, "measure_ablation"),
                         (dflash2rt.bench.launches, "count_launches"),
                         (dflash2rt.train.corpus, "load_corpus")):
        monkeypatch.setattr(module, name, lambda *a, **k: pytest.fail("measured"))
    assert main(["bench", *argv]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err == f"dflash2rt: error: InvalidInputError: {message}\n"
