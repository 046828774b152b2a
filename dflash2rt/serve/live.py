"""A server on a free loopback port: ``LiveServer`` in a thread of this process (uvicorn over a
real socket, so clients talk HTTP to it: the tests, scripts/serve_soak.py), ``SpawnedServer``
as a ``dflash2rt serve`` process of its own (``dflash2rt bench serve``)."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import uvicorn

from .app import create_app

START_S = 120.0            # generous: a loaded machine


class LiveServer:
    """``with LiveServer(server) as live:`` serves ``server`` at ``live.base`` (``live.url``:
    its /v1); leaving the block shuts it down as SIGTERM would (drain, then stop)."""

    def __init__(self, server) -> None:
        self.server = server
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.base = f"http://127.0.0.1:{self.port}"
        self.url = self.base + "/v1"
        config = uvicorn.Config(create_app(server), log_level="warning", lifespan="on",
                                timeout_graceful_shutdown=10)
        self.uvicorn = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.uvicorn.run,
                                       kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> "LiveServer":
        self.thread.start()
        deadline = time.monotonic() + START_S
        while not self.uvicorn.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.uvicorn.should_exit = True
        self.thread.join(START_S)
        self.sock.close()


class SpawnedServer:
    """``with SpawnedServer(["stdlib-code", "--backend", "cpu"]) as s:`` runs ``dflash2rt serve``
    with those arguments in a process of its own on a free loopback port, as a deployment
    runs it (the load generator apart from the server), until /health answers; ``s.base``,
    ``s.model`` (the first model name it serves). Leaving the block sends SIGTERM (drain,
    exit) and waits for the process."""

    def __init__(self, args: list[str]) -> None:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.args = [*args, "--host", "127.0.0.1", "--port", str(self.port),
                     "--log-level", "warning"]
        self.base = f"http://127.0.0.1:{self.port}"
        self.model = ""
        self.log = tempfile.TemporaryFile(mode="w+")
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> "SpawnedServer":
        import httpx

        self.proc = subprocess.Popen([sys.executable, "-m", "dflash2rt", "serve", *self.args],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_S
        while True:
            try:
                r = httpx.get(self.base + "/v1/models", timeout=5)
                if r.status_code == 200:
                    self.model = r.json()["data"][0]["id"]
                    return self
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.__exit__()
                self.log.seek(0)
                raise RuntimeError(f"dflash2rt serve {' '.join(self.args)} did not start: "
                                   f"{self.log.read()[-2000:]}")
            time.sleep(0.2)

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(START_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
