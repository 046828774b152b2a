"""`dflash2rt run` against its flags, output and streaming written out by hand: run()'s call."""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import types

import pytest
import torch

import dflash2rt.api
import dflash2rt.metrics
import dflash2rt.registry
from dflash2rt.bundled import bundled_path
from dflash2rt.cli import run_cmd, run_progress
from dflash2rt.errors import InvalidInputError, SamplingParamsError
from dflash2rt.models.tokenizer import load_tokenizer
from dflash2rt.watermark import WatermarkKey


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    run_cmd.add_parser(p.add_subparsers())
    return p.parse_args(["run", *argv])


class CharTok:
    """Token id = code point; 0xFFFD decodes to the replacement character."""

    def encode(self, text):
        return [ord(c) for c in text]

    def decode(self, ids):
        return "".join(chr(i) for i in ids)


def _ids(text):
    return [ord(c) for c in text]


class Result:
    def __init__(self, texts, reasons, stats="S"):
        self.texts, self.stats = texts, stats
        self.outputs = [types.SimpleNamespace(finish_reason=r) for r in reasons]

    def as_dict(self):
        return {"texts": self.texts, "stats": self.stats}


class Rig:
    """run()'s collaborators scripted: every call lands in ``log``."""

    def __init__(self, monkeypatch, texts=("out",), reasons=("length",), tokenizer=CharTok(),
                 stream=None):
        self.log, self.calls = [], {}
        self.pair = types.SimpleNamespace(tokenizer=tokenizer, name="P")
        self.res = Result(list(texts), list(reasons))
        rig = self

        class Sel:
            backend = types.SimpleNamespace(device="DEV")

            def describe(self):
                return "SELECTION"

        class Reg:
            @classmethod
            def discover(cls):
                rig.log.append("discover")
                return cls()

            def select(self, name):
                rig.log.append(("select", name))
                return Sel()

        def api_run(*a, **kw):
            rig.log.append("api_run")
            rig.calls["api"] = (a, kw)
            for chunk in stream or []:
                kw["on_tokens"](0, chunk)
            return rig.res

        def load(args, device, dtype):
            rig.log.append(("load", device, dtype))
            return rig.pair, {"seconds": 1.5}

        def run_tp(args, prompts):
            rig.log.append(("tp", list(prompts)))
            return 7

        monkeypatch.setattr(dflash2rt.api, "run", api_run)
        monkeypatch.setattr(dflash2rt.registry, "Registry", Reg)
        monkeypatch.setattr(dflash2rt.metrics, "check_metrics_path",
                            lambda p: rig.log.append(("metrics", p)))
        monkeypatch.setattr(WatermarkKey, "from_file", staticmethod(
            lambda path, allow_shared=False: rig.log.append(("key", path, allow_shared))
            or "KEY"))
        monkeypatch.setattr(run_cmd, "_load", load)
        monkeypatch.setattr(run_cmd, "_run_tp", run_tp)
        monkeypatch.setattr(run_cmd, "stats_line", lambda s: f"STATS<{s}>")
        monkeypatch.setattr(run_cmd, "tp_stats_line", lambda s: f"TPSTATS<{s}>")


DEFAULTS = dict(prompts=["p"], max_new_tokens=64, temperature=0.0, top_p=1.0, top_k=0, seed=0,
                block_size=None, spec=True, stop=[], dtype="auto",
                include_stop_str_in_output=False, repetition_penalty=1.0,
                frequency_penalty=0.0, presence_penalty=0.0, min_p=0.0, logit_bias={},
                logprobs=None, logprobs_mode="raw", regex=None, metrics=None, watermark=None,
                num_candidates=None, verification="token")

ONE_FLAG = [
    (["--max-new-tokens", "3"], dict(max_new_tokens=3)),
    (["--temperature", "0.5"], dict(temperature=0.5)),
    (["--top-p", "0.25"], dict(top_p=0.25)),
    (["--top-k", "4"], dict(top_k=4)),
    (["--seed", "9"], dict(seed=9)),
    (["--block-size", "1"], dict(block_size=1)),
    (["--no-spec"], dict(spec=False)),
    (["--stop", "a", "--stop", "bc"], dict(stop=["a", "bc"])),
    (["--include-stop-str-in-output"], dict(include_stop_str_in_output=True)),
    (["--repetition-penalty", "1.5"], dict(repetition_penalty=1.5)),
    (["--frequency-penalty", "-2"], dict(frequency_penalty=-2.0)),
    (["--presence-penalty", "2"], dict(presence_penalty=2.0)),
    (["--min-p", "0.125"], dict(min_p=0.125)),
    (["--logit-bias", "3=-1.5", "--logit-bias", "0=100"], dict(logit_bias={3: -1.5, 0: 100.0})),
    (["--logprobs", "0", "--json"], dict(logprobs=0)),
    (["--logprobs-mode", "processed"], dict(logprobs_mode="processed")),
    (["--regex", "a+"], dict(regex="a+")),
    (["--metrics", "m.prom"], dict(metrics="m.prom")),
    (["--watermark-key-file", "k"], dict(watermark="KEY")),
    (["--num-candidates", "2"], dict(num_candidates=2)),
    (["--verification", "block"], dict(verification="block")),
    (["--dtype", "float32"], dict(dtype=torch.float32)),
    (["--dtype", "float64"], dict(dtype=torch.float64)),
    (["--dtype", "bfloat16"], dict(dtype=torch.bfloat16)),
]


@pytest.mark.parametrize("flags, changed", [([], {})] + ONE_FLAG)
def test_each_flag_reaches_the_api_alone(monkeypatch, capsys, flags, changed):
    rig = Rig(monkeypatch)
    assert run_cmd.run(_args("--prompt", "p", *flags)) == 0
    a, kw = rig.calls["api"]
    assert len(a) == 2 and a[0] is rig.pair and a[1].device == "DEV"
    on_tokens = kw.pop("on_tokens")
    assert callable(on_tokens)
    assert kw == {**DEFAULTS, **changed}
    loads = [e for e in rig.log if e[0] == "load"]
    assert loads == [("load", "DEV", changed.get("dtype", "auto"))]


def test_block_size_auto_is_the_adaptive_default(capsys):
    assert _args("--block-size", "auto").block_size is None
    assert _args().block_size is None and _args("--block-size", "8").block_size == 8
    for bad in ("Auto", "8.0", ""):
        with pytest.raises(SystemExit):
            _args("--block-size", bad)
        assert f"an integer or 'auto', got {bad!r}" in capsys.readouterr().err


def test_prompts_then_the_prompt_file_in_order(monkeypatch, capsys, tmp_path):
    f = tmp_path / "p.json"
    f.write_text(json.dumps(["c", "d"]), encoding="utf-8")
    rig = Rig(monkeypatch, texts=["1", "2", "3", "4"], reasons=["stop"] * 4)
    run_cmd.run(_args("--prompt", "a", "--prompt", "b", "--prompt-file", str(f)))
    assert rig.calls["api"][1]["prompts"] == ["a", "b", "c", "d"]
    rig = Rig(monkeypatch, texts=["1", "2"], reasons=["stop"] * 2)
    run_cmd.run(_args("--prompt-file", str(f)))
    assert rig.calls["api"][1]["prompts"] == ["c", "d"]


def test_no_prompt_is_refused_before_anything(monkeypatch):
    rig = Rig(monkeypatch)
    with pytest.raises(InvalidInputError, match="at least one --prompt"):
        run_cmd.run(_args())
    with pytest.raises(InvalidInputError, match="at least one --prompt"):
        run_cmd.run(_args("--tp", "2"))
    assert rig.log == []


def test_the_order_checks_before_loading(monkeypatch, capsys):
    rig = Rig(monkeypatch)
    run_cmd.run(_args("--prompt", "p", "--metrics", "m", "--watermark-key-file", "k",
                      "--watermark-key-allow-shared", "--backend", "cpu"))
    assert rig.log == [("metrics", "m"), ("key", "k", True), "discover", ("select", "cpu"),
                       ("load", "DEV", "auto"), "api_run"]
    rig.log.clear()
    run_cmd.run(_args("--prompt", "p", "--watermark-key-file", "k"))
    assert rig.log == [("key", "k", False), "discover", ("select", None),
                       ("load", "DEV", "auto"), "api_run"]
    rig.log.clear()
    run_cmd.run(_args("--prompt", "p"))                   # neither: neither is read
    assert rig.log == ["discover", ("select", None), ("load", "DEV", "auto"), "api_run"]


@pytest.mark.parametrize("tp", ["2", "0", "-1"])
def test_tp_other_than_one_goes_to_the_tp_path_alone(monkeypatch, tp):
    rig = Rig(monkeypatch)
    assert run_cmd.run(_args("--prompt", "a", "--prompt", "b", "--tp", tp, "--metrics", "m")) == 7
    assert rig.log == [("tp", ["a", "b"])]


def test_text_output_of_several_prompts(monkeypatch, capsys):
    Rig(monkeypatch, texts=["X", "YY"], reasons=["stop", "length"],
        stream=[[1, 2], [3]])
    rc = run_cmd.run(_args("--prompt", "ab", "--prompt", "c"))
    out = capsys.readouterr()
    assert rc == 0
    assert out.out == "--- [0] stop\nabX\n--- [1] length\ncYY\n"
    assert out.err == ("SELECTION\n\r2 tokens generated\r3 tokens generated\n"
                       "STATS<S>\n")


def test_text_output_of_token_id_prompts(monkeypatch, capsys, tmp_path):
    f = tmp_path / "ids.json"
    f.write_text(json.dumps([_ids("hi"), [65]]), encoding="utf-8")
    Rig(monkeypatch, texts=["!", "?"], reasons=["length", "stop"])
    run_cmd.run(_args("--prompt-file", str(f)))
    assert capsys.readouterr().out == "--- [0] length\nhi!\n--- [1] stop\nA?\n"
    Rig(monkeypatch, texts=["!", "?"], reasons=["length", "stop"], tokenizer=None)
    run_cmd.run(_args("--prompt-file", str(f)))
    assert capsys.readouterr().out == "--- [0] length\n[104, 105]!\n--- [1] stop\n[65]?\n"


def test_one_prompt_without_a_tokenizer_prints_like_several(monkeypatch, capsys):
    Rig(monkeypatch, texts=["Z"], reasons=["stop"], tokenizer=None, stream=[[5]])
    run_cmd.run(_args("--prompt", "q"))
    out = capsys.readouterr()
    assert out.out == "--- [0] stop\nqZ\n"
    assert out.err == "SELECTION\n\r1 tokens generated\nSTATS<S>\n"


def test_one_prompt_streams_prompt_and_text(monkeypatch, capsys):
    Rig(monkeypatch, texts=["xyz"], reasons=["length"], stream=[_ids("x"), _ids("yz")])
    assert run_cmd.run(_args("--prompt", "P:")) == 0
    out = capsys.readouterr()
    assert out.out == "P:xyz\n"
    assert out.err == "SELECTION\nSTATS<S>\n"


def test_one_token_id_prompt_streams_its_decoded_text(monkeypatch, capsys, tmp_path):
    f = tmp_path / "ids.json"
    f.write_text(json.dumps([_ids("ab")]), encoding="utf-8")
    Rig(monkeypatch, texts=["c"], reasons=["length"], stream=[_ids("c")])
    run_cmd.run(_args("--prompt-file", str(f)))
    assert capsys.readouterr().out == "abc\n"


@pytest.mark.parametrize("prompts", [["a"], ["a", "b"]])
def test_json_output(monkeypatch, capsys, prompts):
    Rig(monkeypatch, texts=["t"] * len(prompts), reasons=["stop"] * len(prompts),
        stream=[[1]])
    flags = [x for p in prompts for x in ("--prompt", p)]
    assert run_cmd.run(_args(*flags, "--json")) == 0
    out = capsys.readouterr()
    assert json.loads(out.out) == {"texts": ["t"] * len(prompts), "stats": "S",
                                   "load": {"seconds": 1.5}}
    assert out.out == json.dumps({"texts": ["t"] * len(prompts), "stats": "S",
                                  "load": {"seconds": 1.5}}, indent=2) + "\n"
    assert out.err == "SELECTION\n\r1 tokens generated\n"


# The tensor-parallel path: api.run gets the model's name, not a pair.

class TpRig:
    def __init__(self, monkeypatch, res):
        self.calls = []
        monkeypatch.setattr(dflash2rt.api, "run",
                            lambda *a, **kw: self.calls.append((a, kw)) or res)
        monkeypatch.setattr(WatermarkKey, "from_file", staticmethod(
            lambda path, allow_shared=False: ("KEY", path, allow_shared)))
        monkeypatch.setattr(run_cmd, "tp_stats_line", lambda s: f"TPSTATS<{s}>")


TP_DEFAULTS = {**DEFAULTS, "draft": None, "revision": None, "draft_revision": None,
               "tp": 2, "tp_check": False}


@pytest.mark.parametrize("flags, changed", ONE_FLAG + [
    (["--draft", "d"], dict(draft="d")), (["--revision", "r"], dict(revision="r")),
    (["--draft-revision", "v"], dict(draft_revision="v")), (["--tp-check"], dict(tp_check=True)),
    (["--watermark-key-file", "k", "--watermark-key-allow-shared"],
     dict(watermark=("KEY", "k", True))),
])
def test_tp_each_flag_reaches_the_api_alone(monkeypatch, capsys, flags, changed):
    if changed.get("watermark") == "KEY":
        changed = dict(watermark=("KEY", "k", False))
    rig = TpRig(monkeypatch, None)
    args = _args("--prompt", "p", "--tp", "2", "--backend", "B", *flags)
    assert run_cmd._run_tp(args, ["p"]) == 0
    [(a, kw)] = rig.calls
    assert a == ("stdlib-code", "B")
    assert kw == {**TP_DEFAULTS, **changed}
    assert capsys.readouterr().out == ""             # a rank other than 0 prints nothing


@pytest.mark.parametrize("model, want", [("m", "m"), ("t,d", ("t", "d")),
                                         ("t,d,e", ("t", "d,e")), (",", ("", ""))])
def test_model_names_split_at_the_first_comma(monkeypatch, model, want):
    rig = TpRig(monkeypatch, None)
    run_cmd._run_tp(_args("--model", model, "--tp", "2"), ["p"])
    assert rig.calls[0][0] == (want, None)
    assert run_cmd._model_arg(model) == want


def test_tp_text_and_json_output(monkeypatch, capsys):
    res = Result(["X", "Y"], ["stop", "length"])
    TpRig(monkeypatch, res)
    assert run_cmd._run_tp(_args("--tp", "2"), ["a", [1, 2]]) == 0
    out = capsys.readouterr()
    ids_text = load_tokenizer(bundled_path("stdlib-code") / "target").decode([1, 2])
    assert ids_text and ids_text != "[1, 2]"
    assert out.out == f"--- [0] stop\naX\n--- [1] length\n{ids_text}Y\n"
    assert out.err == "TPSTATS<S>\n"
    assert run_cmd._run_tp(_args("--tp", "2", "--json"), ["a", "b"]) == 0
    out = capsys.readouterr()
    assert out.out == json.dumps({"texts": ["X", "Y"], "stats": "S"}, indent=2) + "\n"
    assert out.err == ""


def test_tp_token_id_prompts_without_a_tokenizer_print_as_ids(monkeypatch, capsys, tmp_path):
    (tmp_path / "config.json").write_text("{}", encoding="utf-8")     # no tokenizer.json
    TpRig(monkeypatch, Result(["X", "Y"], ["stop", "length"]))
    assert run_cmd._run_tp(_args("--tp", "2", "--model", str(tmp_path)), ["a", [1, 2]]) == 0
    assert capsys.readouterr().out == "--- [0] stop\naX\n--- [1] length\n[1, 2]Y\n"


# _logit_bias: each malformed part alone.

def test_logit_bias_items():
    assert run_cmd._logit_bias([]) == {}
    assert run_cmd._logit_bias(["-3=0", "7=1e2", "+8=-0.5"]) == {-3: 0.0, 7: 100.0, 8: -0.5}
    assert run_cmd._logit_bias(["1=2", "2=1"]) == {1: 2.0, 2: 1.0}
    for bad in ("1", "1.5=2", "x=2", "1=", "=", "1=2=3", "1:2", ""):
        with pytest.raises(SamplingParamsError, match=r"ID=BIAS \(e\.g\. 42=-5\.5\), got "):
            run_cmd._logit_bias(["4=1", bad])
    with pytest.raises(SamplingParamsError, match=r"token 4 twice \(1 and -0\.5\)"):
        run_cmd._logit_bias(["4=1", "5=0", "+4=-0.5"])


# safe_len against scans of every position.

def _ref_safe(text, stops, include):
    for p in range(len(text)):
        hits = [len(s) for s in stops if text[p:p + len(s)] == s]
        if hits:
            return p + (min(hits) if include else 0)
    held = 0
    for p in range(len(text)):
        tail = text[p:]
        if any(len(tail) < len(s) and s[:len(tail)] == tail for s in stops):
            held = max(held, len(tail))
    return len(text) - held


def test_safe_len_against_every_short_text():
    stop_sets = [[], ["a"], ["ab"], ["aba"], ["ab", "b"], ["bb", "abb"], ["aab", "ba"],
                 ["abab"], ["b", "aaa"]]
    for n in range(7):
        for chars in itertools.product("ab", repeat=n):
            text = "".join(chars)
            for stops in stop_sets:
                for include in (False, True):
                    assert run_progress.safe_len(text, stops, include) == \
                        _ref_safe(text, stops, include), (text, stops, include)


def test_safe_len_hand_values():
    assert run_progress.safe_len("xab", ["abc"]) == 1
    assert run_progress.safe_len("xa", ["abc"]) == 1
    assert run_progress.safe_len("xab", ["ab"]) == 1
    assert run_progress.safe_len("xab", ["ab"], True) == 3
    assert run_progress.safe_len("", ["ab"]) == 0
    assert run_progress.safe_len("abc", []) == 3


# Progress: what reaches stdout / stderr after each chunk.

def test_progress_streams_the_held_back_text(capsys):
    shown = []
    prog = run_progress.Progress(CharTok(), True, lambda: shown.append(1) or "P>", ["cd"],
                             lambda: _ids("pp"))
    assert capsys.readouterr().out == "" and shown == []
    prog(0, _ids("ab"))
    assert capsys.readouterr().out == "P>ab" and shown == [1]
    prog(0, _ids("c"))                                       # may become "cd": held back
    assert capsys.readouterr().out == ""
    prog(0, _ids("e"))
    assert capsys.readouterr().out == "ce"
    prog(0, _ids("cdzz"))                                    # the stop: the text ends before it
    assert capsys.readouterr().out == ""
    prog.finish("abce")
    assert capsys.readouterr().out == "\n" and shown == [1]
    assert capsys.readouterr().err == ""


def test_progress_echoes_the_prompt_once_even_for_held_back_text(capsys):
    shown = []
    prog = run_progress.Progress(CharTok(), True, lambda: shown.append(1) or "P>", ["ab"])
    prog(0, _ids("a"))
    assert capsys.readouterr().out == "P>" and shown == [1]
    prog(0, _ids("b"))
    assert capsys.readouterr().out == "" and shown == [1]
    prog.finish("")
    assert capsys.readouterr().out == "\n" and shown == [1]


def test_progress_with_include_keeps_the_stop(capsys):
    prog = run_progress.Progress(CharTok(), True, lambda: "", ["cd"], include_stop=True)
    prog(0, _ids("abcdz"))
    assert capsys.readouterr().out == "abcd"


def test_progress_waits_for_an_incomplete_character(capsys):
    prog = run_progress.Progress(CharTok(), True, lambda: "P", [])
    prog(0, [0xFFFD])
    assert capsys.readouterr().out == ""
    prog(0, _ids("a"))
    assert capsys.readouterr().out == "P\ufffda"
    prog(0, [0xFFFD])
    assert capsys.readouterr().out == ""
    prog.finish("\ufffda\ufffd")
    assert capsys.readouterr().out == "\ufffd\n"


def test_progress_finish_alone_writes_prompt_and_text(capsys):
    prog = run_progress.Progress(CharTok(), True, lambda: "P", ["x"])
    prog.finish("abc")
    assert capsys.readouterr().out == "Pabc\n"


@pytest.mark.parametrize("tokenizer, stream", [(CharTok(), False), (None, True), (None, False)])
def test_progress_counts_tokens_on_stderr_otherwise(capsys, tokenizer, stream):
    prog = run_progress.Progress(tokenizer, stream, lambda: "P", [])
    assert prog.stream_text is False
    prog(0, [1, 2])
    prog(1, [])
    prog(0, [3])
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err == "\r2 tokens generated\r2 tokens generated\r3 tokens generated"


def test_prompt_ids_and_shown():
    pair = types.SimpleNamespace(tokenizer=CharTok())
    assert run_cmd._prompt_ids(pair, "hi") == [104, 105]
    assert run_cmd._prompt_ids(pair, (1, 2)) == [1, 2]
    assert run_cmd._shown(pair.tokenizer, "hi") == "hi"
    assert run_cmd._shown(pair.tokenizer, [104, 105]) == "hi"
    assert run_cmd._shown(None, [1]) == "[1]"


# _LoadWatch and _load: a fake clock and fake peak RSS.

def _fake_watch(monkeypatch, times, rss_kb):
    import resource
    import time

    t, r = iter(times), iter(rss_kb)
    monkeypatch.setattr(time, "perf_counter", lambda: next(t))
    monkeypatch.setattr(resource, "getrusage",
                        lambda who: types.SimpleNamespace(ru_maxrss=next(r)))


def test_load_watch_seconds_rss_and_checkpoint_bytes(monkeypatch, tmp_path):
    t, d = tmp_path / "t", tmp_path / "d"
    t.mkdir()
    d.mkdir()
    (t / "a.safetensors").write_bytes(b"x" * 3)
    (t / "b.safetensors").write_bytes(b"x" * 5)
    (t / "config.json").write_bytes(b"x" * 100)
    (d / "m.safetensors").write_bytes(b"x" * 7)
    _fake_watch(monkeypatch, [10.25, 12.75], [1000, 3000])
    w = run_cmd._LoadWatch()
    pair = types.SimpleNamespace(target=types.SimpleNamespace(source_dir=str(t)),
                                 draft=types.SimpleNamespace(source_dir=d))
    assert w.done(pair) == {"seconds": 2.5, "rss_before_bytes": 1024000,
                            "peak_rss_bytes": 3072000, "checkpoint_bytes": 15}
    for draft in (None, types.SimpleNamespace(), types.SimpleNamespace(source_dir=None)):
        _fake_watch(monkeypatch, [0.0, 1.0], [1, 2])
        w = run_cmd._LoadWatch()
        pair = types.SimpleNamespace(target=types.SimpleNamespace(source_dir=t), draft=draft)
        assert w.done(pair)["checkpoint_bytes"] == 8
    _fake_watch(monkeypatch, [0.0, 1.0], [1, 2])
    w = run_cmd._LoadWatch()
    pair = types.SimpleNamespace(target=types.SimpleNamespace(), draft=None)
    assert w.done(pair)["checkpoint_bytes"] == 0


def test_load_prints_what_loading_took(monkeypatch, capsys, tmp_path):
    (tmp_path / "w.safetensors").write_bytes(b"x" * 6_000_000)
    pair = types.SimpleNamespace(name="N", dtype=torch.bfloat16, draft=None,
                                 target=types.SimpleNamespace(source_dir=tmp_path))
    seen = []
    monkeypatch.setattr(run_cmd, "resolve_model_args",
                        lambda args, device, dtype: seen.append((device, dtype)) or pair)
    _fake_watch(monkeypatch, [1.0, 3.25], [1_000_000, 2_500_000])
    assert run_cmd._load(_args(), "DEV", torch.float32) == (
        pair, {"seconds": 2.25, "rss_before_bytes": 1_024_000_000,
               "peak_rss_bytes": 2_560_000_000, "checkpoint_bytes": 6_000_000})
    assert seen == [("DEV", torch.float32)]
    assert capsys.readouterr().err == (
        "loaded N (bfloat16) in 2.2s: peak host RSS 2.56 GB (before loading 1.02 GB), "
        "checkpoint files 0.01 GB\n")


def test_resolve_model_args_passes_each_flag(monkeypatch):
    seen = []
    monkeypatch.setattr(dflash2rt.api, "resolve_model",
                        lambda *a, **kw: seen.append((a, kw)) or "PAIR")
    args = _args("--model", "t,d", "--draft", "x", "--revision", "r", "--draft-revision", "v")
    assert run_cmd.resolve_model_args(args, "DEV", "auto") == "PAIR"
    assert seen == [((("t", "d"), "DEV", "auto"),
                     dict(draft="x", revision="r", draft_revision="v"))]
    seen.clear()
    run_cmd.resolve_model_args(_args(), "cpu", torch.float64)
    assert seen == [(("stdlib-code", "cpu", torch.float64),
                     dict(draft=None, revision=None, draft_revision=None))]


def test_parser_defaults():
    a = _args()
    assert (a.backend, a.model, a.tp, a.tp_check, a.json, a.no_spec, a.dtype) == \
        (None, "stdlib-code", 1, False, False, False, "auto")
    assert a.func is run_cmd.run
    assert sys.modules["dflash2rt.cli.run_cmd"] is run_cmd


class Recorder:
    """A stream that records each write and each flush, in order."""

    def __init__(self):
        self.events = []

    def write(self, s):
        self.events.append(("write", s))

    def flush(self):
        self.events.append(("flush",))


def test_progress_flushes_after_each_step(monkeypatch):
    err, out = Recorder(), Recorder()
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setattr(sys, "stdout", out)
    prog = run_progress.Progress(None, False, lambda: "P", [])
    prog(0, [1])
    prog(0, [2, 3])
    assert [e for e in err.events if e != ("write", "")] == [
        ("write", "\r1 tokens generated"), ("flush",),
        ("write", "\r3 tokens generated"), ("flush",)]
    prog = run_progress.Progress(CharTok(), True, lambda: "P", [])
    prog(0, _ids("a"))
    assert out.events == [("write", "P"), ("write", "a"), ("flush",)]
