"""``build_server``'s wiring and ``run_server``'s lifecycle over stand-ins (no model loads, no
socket opens): the block, the rows each KV slot holds, the batch a KV budget allows (bytes
worked out here from K and V per layer), the names, the chat template and its directory, the
errors each refused combination raises; and ``run_server``'s defaults, signal handlers, HTTP
thread, drain and failures."""

from __future__ import annotations

import signal
import threading
import time
import types
from pathlib import Path

import pytest
import torch
import uvicorn

import dflash2rt.api
import dflash2rt.engine.engine
import dflash2rt.models.memory
import dflash2rt.serve.app
import dflash2rt.serve.chat
import dflash2rt.serve.server
from dflash2rt.errors import InvalidInputError
from dflash2rt.models import hub
from dflash2rt.models.pair import ModelPair
from dflash2rt.serve import build_server, run_server

NS = types.SimpleNamespace
CONTEXT = 512
FLAGS = "--max-num-seqs, --max-model-len or --kv-cache-gib"
BOUND_S = 60.0                  # a bound on waits for the stand-ins' threads, never reached


def fake_pair(draft: bool = True, layers: int = 2, kv_heads: int = 2, head_dim: int = 4,
              name: str | None = "pair-name") -> NS:
    """Target: ``layers`` layers of ``kv_heads`` x ``head_dim``; draft: block 8, one layer of
    1 x 8, hidden 16; float32."""
    target = NS(cfg=NS(max_position_embeddings=CONTEXT, num_hidden_layers=layers,
                       num_key_value_heads=kv_heads, head_dim=head_dim, vocab_size=100))
    d = NS(cfg=NS(block_size=8, arch=NS(num_hidden_layers=1, num_key_value_heads=1,
                                        head_dim=8, hidden_size=16))) if draft else None
    return NS(target=target, draft=d, name=name, dtype=torch.float32, device="cpu")


def row_bytes(pair: NS, spec: bool) -> int:
    """One KV slot's bytes per row: K and V (float32) of each target layer, and with
    speculation the draft's, and one draft hidden state."""
    t = pair.target.cfg
    out = t.num_hidden_layers * t.num_key_value_heads * t.head_dim * 2 * 4
    if spec:
        d = pair.draft.cfg.arch
        out += d.num_hidden_layers * d.num_key_value_heads * d.head_dim * 2 * 4
        out += d.hidden_size * 4
    return out


class Rig:
    """``build_server`` with its heavy parts replaced: what it gives ``Server``, the memory
    check and the chat template is recorded."""

    def __init__(self, monkeypatch, pair: NS, template_source: str | None = None) -> None:
        self.pair, self.fits, self.templates, self.located = pair, [], [], []
        self.template_source = template_source
        api = dflash2rt.api
        monkeypatch.setattr(api, "backend_of", lambda b: NS(device="cpu"))
        monkeypatch.setattr(api, "resolve_model", lambda *a, **k: pair)
        monkeypatch.setattr(api, "measured_table", lambda p, d: "table")
        monkeypatch.setattr(hub, "locate_pair", self.locate)
        monkeypatch.setattr(dflash2rt.engine.engine, "Engine",
                            lambda p, be, table: ("engine", table))
        monkeypatch.setattr(dflash2rt.serve.server, "Server", lambda *a: a)
        monkeypatch.setattr(dflash2rt.models.memory, "check_fits",
                            lambda *a: self.fits.append(a))
        chat = dflash2rt.serve.chat
        monkeypatch.setattr(chat, "find_template", self.find)
        monkeypatch.setattr(chat, "special_tokens", lambda d: ("special", d))
        monkeypatch.setattr(chat, "ChatTemplate", lambda s, sp: ("template", s, sp))

    def locate(self, model, draft, revision, draft_revision):
        self.located.append(model)
        return [NS(path=f"/models/{model}/target"), NS(path=f"/models/{model}/draft")]

    def find(self, target_dir, chat_template):
        self.templates.append((target_dir, chat_template))
        return self.template_source

    def build(self, model="m-spec", **kw) -> dict:
        """→ the Server's arguments by name, and the memory check's (bytes, what)."""
        self.fits.clear()
        a = build_server(model, "cpu", **kw)
        names = ("engine", "names", "block", "slots", "max_model_len", "max_queue",
                 "template", "api_key", "stream_interval")
        (needed, device, what, lower), = self.fits
        assert (device, lower) == ("cpu", FLAGS)
        return {**dict(zip(names, a)), "bytes": needed, "what": what}


def test_the_defaults(monkeypatch):
    pair = fake_pair()
    rig = Rig(monkeypatch, pair)
    got = rig.build()
    rows = CONTEXT + 8 + 1                         # the context, a block, one more
    assert got == {"engine": ("engine", "table"), "names": ("pair-name",), "block": 8,
                   "slots": 16, "max_model_len": CONTEXT, "max_queue": 256, "template": None,
                   "api_key": None, "stream_interval": 1,
                   "bytes": 16 * rows * row_bytes(pair, True),
                   "what": f"the server's KV caches (16 requests x {rows} rows)"}
    assert rig.located == ["m-spec"]
    assert rig.templates == [(Path("/models/m-spec/target"), None)]


@pytest.mark.parametrize("kw, block, rows", [
    ({"block_size": "auto"}, None, 300 + 2 * 8 + 1),     # adaptive: up to twice the draft's
    ({"block_size": 2}, 2, 300 + 2 + 1),
    ({"block_size": 5}, 5, 300 + 5 + 1),
    ({"spec": False}, 1, 300 + 1 + 1),
])
def test_the_block_and_the_rows_of_a_slot(monkeypatch, kw, block, rows):
    pair = fake_pair()
    got = Rig(monkeypatch, pair).build(max_model_len=300, max_num_seqs=3, **kw)
    assert got["block"] == block and got["slots"] == 3
    spec = kw.get("spec", True)
    assert got["bytes"] == 3 * rows * row_bytes(pair, spec)
    assert got["what"] == f"the server's KV caches (3 requests x {rows} rows)"


def test_the_model_length_may_be_2_or_the_whole_context(monkeypatch):
    rig = Rig(monkeypatch, fake_pair())
    for length in (2, CONTEXT):
        assert rig.build(max_model_len=length)["max_model_len"] == length
    with pytest.raises(InvalidInputError, match=f"max_model_len must lie in \\[2, {CONTEXT}\\] "
                                                f".*got {CONTEXT + 1}$"):
        rig.build(max_model_len=CONTEXT + 1)


@pytest.mark.parametrize("pair_kw, kw, match", [
    ({"draft": False}, {}, "this model has no draft: serve it with --no-spec"),
    ({}, {"block_size": 1}, "block_size must be >= 2 with speculation \\(or 'auto'\\), got 1"),
    ({}, {"spec": False, "block_size": 4}, "block_size applies to speculative decoding"),
    ({"draft": False}, {"spec": False, "block_size": 4},
     "block_size applies to speculative decoding"),
])
def test_refused_combinations(monkeypatch, pair_kw, kw, match):
    rig = Rig(monkeypatch, fake_pair(**pair_kw))
    with pytest.raises(InvalidInputError, match=match):
        rig.build(**kw)
    assert rig.fits == []


def test_a_pair_without_a_draft_serves_target_only(monkeypatch):
    pair = fake_pair(draft=False)
    got = Rig(monkeypatch, pair).build(spec=False, max_num_seqs=2, max_model_len=100)
    assert got["block"] == 1 and got["bytes"] == 2 * 102 * row_bytes(pair, False)


def test_the_names_served(monkeypatch):
    rig = Rig(monkeypatch, fake_pair())
    assert rig.build(served_model_name=["x", "y"])["names"] == ("x", "y")
    assert rig.build()["names"] == ("pair-name",)
    rig = Rig(monkeypatch, fake_pair(name=None))
    assert rig.build("m-spec")["names"] == ("m-spec",)


def test_the_chat_template_comes_from_the_target_directory(monkeypatch):
    rig = Rig(monkeypatch, fake_pair(), template_source="{{ x }}")
    got = rig.build(chat_template="file.jinja")
    target = Path("/models/m-spec/target")
    assert got["template"] == ("template", "{{ x }}", ("special", target))
    assert rig.templates == [(target, "file.jinja")]
    pair = object.__new__(ModelPair)                 # a pair in memory: no directory
    rig.templates.clear()
    rig.build(pair)
    assert rig.templates == [(None, None)] and rig.located == ["m-spec"]


def test_a_kv_budget_lowers_the_batch_to_the_slots_it_holds(monkeypatch):
    pair = fake_pair()
    rig = Rig(monkeypatch, pair)
    rows = 300 + 8 + 1
    per = rows * row_bytes(pair, True)
    for held, slots in ((3.5, 3), (1.0, 1), (16.0, 16), (40.0, 16)):
        got = rig.build(max_model_len=300, kv_cache_gib=held * per / 2**30)
        assert got["slots"] == slots and got["bytes"] == slots * per
        assert got["what"] == f"the server's KV caches ({slots} requests x {rows} rows)"


def test_a_kv_budget_that_holds_no_request_names_its_size(monkeypatch):
    pair = fake_pair(layers=64, kv_heads=8, head_dim=128)
    rig = Rig(monkeypatch, pair)
    per = (CONTEXT + 2) * row_bytes(pair, False)        # 269484032 bytes: 0.251 GiB
    assert f"{per / 2**30:.3f}" == "0.251"
    with pytest.raises(InvalidInputError) as info:
        rig.build(spec=False, kv_cache_gib=0.2)
    assert str(info.value) == ("kv_cache_gib=0.2 holds no request of 514 rows (0.251 GiB "
                               "each): raise it or lower max_model_len")


# ---- run_server ------------------------------------------------------------------------------

class HTTP:
    """uvicorn's Server: ``run`` (on run_server's HTTP thread) records its thread, starts
    unless told to fail, waits to be told to exit, and finishes a moment later."""

    made: list = []

    def __init__(self, config) -> None:
        self.config, self.started, self.should_exit, self.seen = config, False, False, {}
        HTTP.made.append(self)

    def run(self) -> None:
        t = threading.current_thread()
        self.seen.update(name=t.name, daemon=t.daemon)
        if self.config.fail is not None:
            raise self.config.fail
        self.started = True
        t0 = time.monotonic()
        while not self.should_exit and time.monotonic() - t0 < BOUND_S:
            time.sleep(0.01)
        time.sleep(0.2)
        self.seen["finished"] = True


class Engine:
    """run_server's server: the engine loop runs in the caller (``run_here``), which waits
    for the HTTP side to start, looks at the signal handlers, and may act as a signal."""

    def __init__(self, failed=None, signal_in_loop: bool = False) -> None:
        self.failed, self.signal_in_loop = failed, signal_in_loop
        self.calls, self.handlers = [], {}
        self.scheduler = self

    def loop_in_caller(self) -> None:
        self.calls.append("loop_in_caller")

    def run_here(self) -> None:
        self.calls.append("run_here")
        http = HTTP.made[-1]
        t0 = time.monotonic()
        while not http.started and "name" not in http.seen and time.monotonic() - t0 < BOUND_S:
            time.sleep(0.01)
        self.handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        if self.signal_in_loop:
            self.handlers[signal.SIGTERM](signal.SIGTERM, None)
            self.calls.append(("should_exit", http.should_exit))

    def close(self, timeout: float) -> None:
        self.calls.append(("close", timeout))


@pytest.fixture
def uvicorn_stand_in(monkeypatch):
    HTTP.made = []
    monkeypatch.setattr(dflash2rt.serve.app, "create_app", lambda server: ("app", server))
    monkeypatch.setattr(uvicorn, "Config", lambda app, **kw: NS(app=app, fail=None, **kw))
    monkeypatch.setattr(uvicorn, "Server", HTTP)
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers can only be installed from the main thread")


def test_run_server_defaults_handlers_thread_and_drain(uvicorn_stand_in):
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    server = Engine(signal_in_loop=True)
    assert run_server(server) is None
    (http,) = HTTP.made
    c = http.config
    assert (c.app, c.host, c.port, c.log_level, c.timeout_graceful_shutdown, c.lifespan) == (
        ("app", server), "127.0.0.1", 8000, "info", 30.0, "on")
    assert http.seen == {"name": "dflash2rt-http", "daemon": True, "finished": True}
    assert server.calls == ["loop_in_caller", "run_here", ("should_exit", True), ("close", 0)]
    assert all(h not in (before[s], signal.SIG_DFL) for s, h in server.handlers.items())
    assert {s: signal.getsignal(s) for s in before} == before       # put back


def test_run_server_waits_for_the_http_side_after_the_loop_ends(uvicorn_stand_in):
    server = Engine()
    run_server(server, "0.0.0.0", 0, drain_timeout=0.0, log_level="debug")
    (http,) = HTTP.made
    assert http.should_exit and http.seen["finished"]       # joined, not left running
    assert (http.config.host, http.config.port, http.config.timeout_graceful_shutdown) == (
        "0.0.0.0", 0, 0.0)


def test_run_server_raises_a_failed_engine_loop_and_a_failed_listen(uvicorn_stand_in,
                                                                   monkeypatch):
    failed = ValueError("the loop failed")
    with pytest.raises(ValueError, match="the loop failed"):
        run_server(Engine(failed=failed), port=0)
    monkeypatch.setattr(uvicorn, "Config", lambda app, **kw: NS(
        app=app, fail=OSError("address in use"), **kw))
    with pytest.raises(InvalidInputError, match="could not listen on http://127.0.0.1:0: "
                                                "OSError: address in use; choose another"):
        run_server(Engine(), port=0)
