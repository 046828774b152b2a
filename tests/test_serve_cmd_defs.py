"""`dflash2rt serve` / `bench serve` against their flags and docs/serving.md, written by hand."""

from __future__ import annotations

import argparse
import json
import types

import pytest
import torch

import dflash2rt.api
import dflash2rt.bundled
import dflash2rt.serve
from dflash2rt.cli import serve_cmd
from dflash2rt.errors import InvalidInputError


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    serve_cmd.add_parser(p.add_subparsers())
    return p.parse_args(["serve", *argv])


def _bench_args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    serve_cmd.add_bench_parser(p.add_subparsers())
    return p.parse_args(["serve", *argv])


class Rig:
    def __init__(self, monkeypatch, block=None, template=None, names=("m",)):
        self.log = []
        rig = self
        sched = types.SimpleNamespace(block=block, slots=3, max_model_len=40, max_queue=5)
        self.server = types.SimpleNamespace(
            scheduler=sched, limits=types.SimpleNamespace(model_names=list(names)),
            engine=types.SimpleNamespace(backend=types.SimpleNamespace(name="be")),
            template=template)

        def build(*a, **kw):
            rig.log.append(("build", a, kw))
            return rig.server

        monkeypatch.setattr(dflash2rt.serve, "build_server", build)
        monkeypatch.setattr(dflash2rt.serve, "run_server",
                            lambda *a: rig.log.append(("run_server", a)))
        monkeypatch.delenv("DFLASH2RT_API_KEY", raising=False)


DEFAULTS = dict(draft=None, revision=None, draft_revision=None, dtype="auto", spec=True,
                block_size=None, max_num_seqs=16, max_model_len=None, max_queue=256,
                kv_cache_gib=None, served_model_name=None, chat_template=None, api_key=None,
                stream_interval=1)


@pytest.mark.parametrize("flags, changed", [
    ([], {}), (["--draft", "d"], dict(draft="d")), (["--revision", "r"], dict(revision="r")),
    (["--draft-revision", "v"], dict(draft_revision="v")),
    (["--dtype", "float32"], dict(dtype=torch.float32)),
    (["--dtype", "float64"], dict(dtype=torch.float64)),
    (["--dtype", "bfloat16"], dict(dtype=torch.bfloat16)),
    (["--no-spec"], dict(spec=False)), (["--block-size", "4"], dict(block_size=4)),
    (["--block-size", "auto"], dict(block_size="auto")),
    (["--max-num-seqs", "2"], dict(max_num_seqs=2)),
    (["--max-model-len", "9"], dict(max_model_len=9)),
    (["--max-queue", "0"], dict(max_queue=0)),
    (["--kv-cache-gib", "0.5"], dict(kv_cache_gib=0.5)),
    (["--served-model-name", "a", "--served-model-name", "b"],
     dict(served_model_name=["a", "b"])),
    (["--chat-template", "t"], dict(chat_template="t")),
    (["--api-key", "k"], dict(api_key="k")),
    (["--stream-interval", "3"], dict(stream_interval=3)),
])
def test_each_flag_reaches_build_server_alone(monkeypatch, capsys, flags, changed):
    rig = Rig(monkeypatch)
    assert serve_cmd.run(_args("--backend", "B", *flags)) == 0
    (_, a, kw), run = rig.log
    assert a == ("stdlib-code", "B")
    assert kw == {**DEFAULTS, **changed}
    assert run == ("run_server", (rig.server, "127.0.0.1", 8000, 30.0, "info"))


@pytest.mark.parametrize("model, want", [("m", "m"), ("t,d", ("t", "d")),
                                         ("t,d,e", ("t", "d,e"))])
def test_the_model_splits_at_the_first_comma(monkeypatch, capsys, model, want):
    rig = Rig(monkeypatch)
    serve_cmd.run(_args(model))
    assert rig.log[0][1] == (want, None)


@pytest.mark.parametrize("env, flag, want", [
    (None, None, None), ("", None, None), ("e", None, "e"), ("e", "k", "k"), (None, "k", "k"),
    ("e", "", ""),
])
def test_the_api_key_flag_then_the_environment(monkeypatch, capsys, env, flag, want):
    rig = Rig(monkeypatch)
    if env is not None:
        monkeypatch.setenv("DFLASH2RT_API_KEY", env)
    serve_cmd.run(_args(*(["--api-key", flag] if flag is not None else [])))
    assert rig.log[0][2]["api_key"] == want


def test_host_port_drain_and_log_level_reach_the_server(monkeypatch, capsys):
    rig = Rig(monkeypatch)
    serve_cmd.run(_args("--host", "0.0.0.0", "--port", "0", "--drain-timeout", "0",
                        "--log-level", "debug"))
    assert rig.log[1] == ("run_server", (rig.server, "0.0.0.0", 0, 0.0, "debug"))
    assert capsys.readouterr().err.endswith("; http://0.0.0.0:0/v1\n")


@pytest.mark.parametrize("flags", [["--port", "-1"], ["--port", "65536"],
                                   ["--drain-timeout", "-0.5"], ["--drain-timeout", "nan"],
                                   ["--drain-timeout", "inf"]])
def test_bad_port_or_drain_timeout_is_refused_before_loading(monkeypatch, flags):
    rig = Rig(monkeypatch)
    with pytest.raises(InvalidInputError):
        serve_cmd.run(_args(*flags))
    assert rig.log == []


def test_port_edges_pass(monkeypatch, capsys):
    for port in ("0", "65535"):
        rig = Rig(monkeypatch)
        serve_cmd.run(_args("--port", port))
        assert rig.log[1][1][2] == int(port)


@pytest.mark.parametrize("block, template, names, line", [
    (None, None, ["m"], "dflash2rt serve: m on be, adaptive blocks, batch 3, context 40, "
     "queue 5, chat off (no template); http://127.0.0.1:8000/v1\n"),
    (1, "T", ["a", "b"], "dflash2rt serve: a, b on be, target-only, batch 3, context 40, "
     "queue 5, chat on; http://127.0.0.1:8000/v1\n"),
    (2, "", ["m"], "dflash2rt serve: m on be, block 2, batch 3, context 40, queue 5, "
     "chat on; http://127.0.0.1:8000/v1\n"),
    (16, None, ["m"], "dflash2rt serve: m on be, block 16, batch 3, context 40, queue 5, "
     "chat off (no template); http://127.0.0.1:8000/v1\n"),
])
def test_the_banner(monkeypatch, capsys, block, template, names, line):
    Rig(monkeypatch, block=block, template=template, names=names)
    serve_cmd.run(_args())
    assert capsys.readouterr().err == line


def test_mode_and_block():
    assert serve_cmd._mode(None) == "adaptive blocks"
    assert serve_cmd._mode(1) == "target-only"
    assert serve_cmd._mode(0) == "block 0" and serve_cmd._mode(2) == "block 2"
    assert serve_cmd._block("auto") == "auto" and serve_cmd._block("7") == 7
    assert serve_cmd._block("-3") == -3
    for bad in ("Auto", "2.0", "", "x"):
        with pytest.raises(argparse.ArgumentTypeError, match="an integer >= 2 or 'auto', got"):
            serve_cmd._block(bad)


def test_parser_defaults():
    a = _args()
    assert (a.model, a.backend, a.host, a.port, a.drain_timeout, a.log_level, a.func) == \
        ("stdlib-code", None, "127.0.0.1", 8000, 30.0, "info", serve_cmd.run)


# bench serve: its argument checks, each alone, before anything loads.

class Stop(Exception):
    pass


def _bench_rig(monkeypatch):
    monkeypatch.setattr(dflash2rt.bundled, "model_dir", lambda name: "ROOT")
    monkeypatch.setattr(dflash2rt.bundled, "heldout", lambda root: [{"prompt": "p"}])

    def backend_of(name):
        raise Stop(name)
    monkeypatch.setattr(dflash2rt.api, "backend_of", backend_of)


GOOD = dict(concurrency="1,4,16", requests="48", time_limit="60", rounds="3",
            stream_interval="1", servers="spec,adaptive,target-only", max_tokens="64")


def _bench(**kw):
    flags = []
    for k, v in {**GOOD, **kw}.items():
        flags += ["--" + k.replace("_", "-"), v]
    return serve_cmd.bench(_bench_args(*flags))


@pytest.mark.parametrize("kw", [
    {}, dict(concurrency="1"), dict(concurrency="3,1"), dict(requests="1"), dict(rounds="1"),
    dict(stream_interval="1"), dict(time_limit="0.001"), dict(servers="spec"),
    dict(servers="target-only,adaptive"), dict(max_tokens="1:4"),
])
def test_bench_good_arguments_reach_the_backend(monkeypatch, kw):
    _bench_rig(monkeypatch)
    with pytest.raises(Stop):
        _bench(**kw)


@pytest.mark.parametrize("kw, match", [
    (dict(concurrency="0"), "--concurrency takes positive integers"),
    (dict(concurrency="1,0"), "--concurrency takes positive integers"),
    (dict(concurrency="-1"), "--concurrency takes positive integers"),
    (dict(concurrency=""), "--concurrency takes positive integers"),
    (dict(concurrency="1,x"), "--concurrency takes positive integers"),
    (dict(requests="0"), "must be positive"), (dict(rounds="0"), "must be positive"),
    (dict(stream_interval="0"), "must be positive"), (dict(time_limit="0"), "must be positive"),
    (dict(time_limit="-1"), "must be positive"),
    (dict(servers="spec,spec"), "--servers takes distinct names"),
    (dict(servers="spec,nope"), "--servers takes distinct names"),
    (dict(servers=""), "--servers takes distinct names"),
    (dict(max_tokens="x"), "--max-tokens takes N or LO:HI"),
    (dict(max_tokens="0"), "--max-tokens takes N or LO:HI"),
])
def test_bench_each_bad_argument_alone(monkeypatch, kw, match):
    _bench_rig(monkeypatch)
    with pytest.raises(InvalidInputError, match=match):
        _bench(**kw)


def _bench_body_rig(monkeypatch, tmp_path):
    import dflash2rt.serve.live
    import dflash2rt.serve.load

    _bench_rig(monkeypatch)
    seen = {}
    be = types.SimpleNamespace(device="DEV")
    pair = types.SimpleNamespace(draft=types.SimpleNamespace(cfg=types.SimpleNamespace(
        block_size=8)))
    monkeypatch.setattr(dflash2rt.api, "backend_of", lambda name: seen.setdefault("be", name)
                        and be)
    monkeypatch.setattr(dflash2rt.api, "resolve_model",
                        lambda *a: seen.setdefault("resolve", a) and pair)
    monkeypatch.setattr(dflash2rt.api, "measured_table",
                        lambda *a: seen.setdefault("table", a) and "TABLE")
    monkeypatch.setattr(dflash2rt.serve.live, "SpawnedServer", lambda argv: ("spawn", argv))
    monkeypatch.setattr(dflash2rt.serve.load, "Offline",
                        lambda *a, **kw: ("offline", a, kw))

    def bench_serve(start, baseline, prompts, levels, requests, lengths, limit, log, **kw):
        seen["bench"] = (prompts, levels, requests, lengths, limit, kw)
        log("LOG")
        seen["starts"] = {n: start(n) for n in kw["contenders"]}
        seen["baselines"] = {n: baseline(n) for n in kw["contenders"]}
        return {"r": 1}
    monkeypatch.setattr(dflash2rt.serve.load, "bench_serve", bench_serve)
    monkeypatch.setattr(dflash2rt.serve.load, "markdown", lambda res: "MD")
    monkeypatch.setattr(dflash2rt.serve.load, "targets", lambda res: "TG")
    monkeypatch.setattr(serve_cmd.sys, "argv", ["dflash2rt", "bench", "serve", "--x", "y"])
    return seen, be, pair


def test_bench_runs_the_servers_it_names(monkeypatch, tmp_path, capsys):
    seen, be, pair = _bench_body_rig(monkeypatch, tmp_path)
    md, js = tmp_path / "t.md", tmp_path / "r.json"
    assert _bench(concurrency="2,5", requests="7", time_limit="1.5", rounds="2",
                  stream_interval="3", servers="spec,adaptive,target-only", max_tokens="4",
                  markdown=str(md), json_out=str(js)) == 0
    assert seen["be"] == "cpu" and seen["resolve"] == ("ROOT", "DEV", "auto")
    assert seen["table"] == (pair, "DEV")
    assert seen["bench"] == (["p"], [2, 5], 7, 4, 1.5,
                             dict(contenders=["spec", "adaptive", "target-only"], rounds=2))
    common = ["--max-num-seqs", "16", "--max-queue", "5", "--stream-interval", "3"]
    assert seen["starts"] == {
        "spec": ("spawn", ["ROOT", "--backend", "cpu", *common]),
        "adaptive": ("spawn", ["ROOT", "--backend", "cpu", "--block-size", "auto", *common]),
        "target-only": ("spawn", ["ROOT", "--backend", "cpu", "--no-spec", *common])}
    assert seen["baselines"] == {
        n: ("offline", (pair, be, b, ["p"], 4), dict(table="TABLE"))
        for n, b in (("spec", 8), ("adaptive", None), ("target-only", 1))}
    assert md.read_text(encoding="utf-8") == "MD\nTG"
    want = {"r": 1, "command": "dflash2rt bench serve --x y"}
    assert js.read_text(encoding="utf-8") == json.dumps(want, indent=1) + "\n"
    out = capsys.readouterr()
    assert out.out == "MD\nTG\n" and out.err == "LOG\n"


def test_bench_json_on_stdout_and_no_files_unasked(monkeypatch, tmp_path, capsys):
    _bench_body_rig(monkeypatch, tmp_path)
    monkeypatch.chdir(tmp_path)
    flags = []
    for k, v in GOOD.items():
        flags += ["--" + k.replace("_", "-"), v]
    assert serve_cmd.bench(_bench_args(*flags, "--json")) == 0
    want = {"r": 1, "command": "dflash2rt bench serve --x y"}
    assert capsys.readouterr().out == json.dumps(want, indent=1) + "\n"
    assert list(tmp_path.iterdir()) == []


def test_bench_parser_defaults():
    a = _bench_args()
    assert (a.model, a.backend, a.concurrency, a.requests, a.time_limit, a.max_tokens,
            a.max_num_seqs, a.servers, a.stream_interval, a.rounds, a.markdown, a.json,
            a.json_out, a.func) == \
        ("stdlib-code", "cpu", "1,4,16", 48, 60.0, "64", 16, "spec,adaptive,target-only", 1, 3,
         None, False, None, serve_cmd.bench)


def recording_stream(events: list):
    """A stream class whose writes and flushes are appended to ``events`` in order."""
    class Stream:
        def write(self, s):
            events.append(("write", s))

        def flush(self):
            events.append(("flush",))
    return Stream


def test_the_banner_is_flushed_before_serving(monkeypatch):
    events = []
    Err = recording_stream(events)
    rig = Rig(monkeypatch)
    monkeypatch.setattr(dflash2rt.serve, "run_server", lambda *a: events.append(("serve",)))
    monkeypatch.setattr(serve_cmd.sys, "stderr", Err())
    serve_cmd.run(_args())
    assert [e[0] for e in events if e != ("write", "")][-2:] == ["flush", "serve"]
    assert rig.log[0][0] == "build"


def test_bench_log_lines_are_flushed(monkeypatch, tmp_path):
    _bench_body_rig(monkeypatch, tmp_path)
    events = []
    Err = recording_stream(events)
    monkeypatch.setattr(serve_cmd.sys, "stderr", Err())
    monkeypatch.setattr(serve_cmd.sys, "stdout", Err())
    _bench()
    assert events[:3] == [("write", "LOG"), ("write", "\n"), ("flush",)]
