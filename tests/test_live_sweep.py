"""The test servers themselves: ``LiveServer`` serves on a port of its own, gives up at once on
an application that cannot start and leaves nothing running; ``SpawnedServer`` (over a stand-in
``dflash2rt serve`` that speaks only /v1/models) waits through non-200 answers, names the first
model, stops its process with SIGTERM, and reports a process that died with the tail of its
log, written out here by hand."""

from __future__ import annotations

import sys
import textwrap
import time
import types

import httpx
import pytest

from dflash2rt.serve import live as live_mod
from dflash2rt.serve.live import LiveServer, SpawnedServer

from test_serve_app_defs import Stub

GIVE_UP_S = 60.0           # a loop that never gives up is stopped here (a bound, not a timing)


def _bounded_time(monkeypatch) -> None:
    """``live``'s clock with its own deadline out of reach, and a sleep that fails past
    ``GIVE_UP_S``: a wait that ends only at its deadline fails instead of passing late."""
    t0 = time.monotonic()

    def sleep(s: float) -> None:
        if time.monotonic() - t0 > GIVE_UP_S:
            raise AssertionError("still waiting for a server that has stopped")
        time.sleep(s)
    monkeypatch.setattr(live_mod, "START_S", 1e6)
    monkeypatch.setattr(live_mod, "time", types.SimpleNamespace(monotonic=time.monotonic,
                                                                sleep=sleep))


class NoStart(Stub):
    def start(self) -> None:
        raise RuntimeError("the engine loop cannot start")


def test_a_live_server_answers_on_its_own_port_and_leaves_nothing_running(monkeypatch):
    monkeypatch.setattr(live_mod, "START_S", 30.0)
    stub = Stub()
    with LiveServer(stub) as one, LiveServer(Stub()) as two:
        assert one.port != two.port
        assert one.base == f"http://127.0.0.1:{one.port}" and one.url == one.base + "/v1"
        assert httpx.get(one.base + "/health", timeout=GIVE_UP_S).status_code == 200
        assert one.thread.daemon and one.uvicorn.started
    assert not one.thread.is_alive() and one.sock.fileno() == -1
    assert stub.calls[0] == "start" and stub.calls[-1][0] == "close"


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_live_server_whose_application_cannot_start_fails_at_once(monkeypatch):
    """uvicorn logs the failed startup and exits its thread (SystemExit, let through)."""
    _bounded_time(monkeypatch)
    with pytest.raises(RuntimeError, match="the test server did not start"):
        with LiveServer(NoStart()):
            pass


STAND_IN = textwrap.dedent('''
    import http.server, json, os, signal, sys

    args = sys.argv[1:]
    assert args[:3] == ["-m", "dflash2rt", "serve"], args
    mode, port = args[3], int(args[args.index("--port") + 1])
    if mode != "serve":
        sys.stdout.write({"short": "boom\\n", "long": "A" * 1000 + "B" * 2000}[mode])
        sys.exit(3)
    marker, asked = args[4], []

    def term(signum, frame):
        with open(marker, "w") as f:
            f.write("term")
        os._exit(0)
    signal.signal(signal.SIGTERM, term)

    class Models(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            asked.append(self.path)
            ready = len(asked) > 2
            body = json.dumps({"data": [{"id": "first"}, {"id": "second"}]} if ready
                              else {"error": "loading"}).encode()
            self.send_response(200 if ready else 503)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass
    http.server.HTTPServer(("127.0.0.1", port), Models).serve_forever()
''')


@pytest.fixture
def stand_in(tmp_path, monkeypatch):
    """``dflash2rt serve`` replaced by ``STAND_IN``: the executable SpawnedServer runs."""
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN)
    exe = tmp_path / "python"
    exe.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{script}" "$@"\n')
    exe.chmod(0o755)
    monkeypatch.setattr(live_mod, "sys", types.SimpleNamespace(executable=str(exe)))
    _bounded_time(monkeypatch)
    return tmp_path


def test_a_spawned_server_waits_for_200_names_the_first_model_and_stops_by_sigterm(stand_in):
    marker = stand_in / "signal"
    s = SpawnedServer(["serve", str(marker)])
    try:
        with s:
            assert s.model == "first" and s.base == f"http://127.0.0.1:{s.port}"
            assert s.args == ["serve", str(marker), "--host", "127.0.0.1", "--port",
                              str(s.port), "--log-level", "warning"]
            assert SpawnedServer(["serve", str(marker)]).port != s.port   # not one in use
        assert s.proc.poll() == 0 and marker.read_text() == "term"
    finally:
        if s.proc is not None and s.proc.poll() is None:
            s.proc.kill()
            s.proc.wait()


@pytest.mark.parametrize("mode, tail", [("short", "boom\n"), ("long", "B" * 2000)])
def test_a_spawned_server_that_dies_is_reported_with_the_tail_of_its_log(stand_in, mode,
                                                                           tail):
    s = SpawnedServer([mode])
    with pytest.raises(RuntimeError) as info:
        with s:
            pass
    assert str(info.value) == (f"dflash2rt serve {mode} --host 127.0.0.1 --port {s.port} "
                               f"--log-level warning did not start: {tail}")
    assert s.proc.poll() == 3


def test_leaving_a_spawned_server_never_started_does_nothing():
    s = SpawnedServer(["x"])
    s.__exit__(None, None, None)
    assert s.proc is None
