"""The application's routes, API key gate and HTTP counts over a stub server, driven as an ASGI
client by hand, against the routes, statuses and OpenAI error shape written out from the
module's documentation and serving.md: each gate condition alone, each route's status."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest

from dflash2rt.serve.app import Gate, create_app
from dflash2rt.serve.errors import APIError

KEY = "k-1"
OPEN = ("/health", "/metrics")


class Stub:
    """What the application reads of a ``Server``: answers are scripted, every HTTP count is
    recorded as (handler, method, status), ``start`` / ``close`` are recorded in order."""

    def __init__(self, api_key=None, name=None, failed=None, answer=None) -> None:
        self.api_key, self.calls, self.counts = api_key, [], []
        self.pair = SimpleNamespace(name=name)
        self.limits = SimpleNamespace(max_model_len=192, model_names=("m-a", "m-b"))
        self.scheduler = SimpleNamespace(failed=failed)
        self.metrics = SimpleNamespace(http_request=lambda *a: self.counts.append(a))
        self.answer = answer if answer is not None else {"ok": 1}

    def start(self) -> None:
        self.calls.append("start")

    def close(self, timeout: float) -> None:
        self.calls.append(("close", timeout))

    def metrics_text(self) -> str:
        return "# metrics\nx 1\n"

    async def completion(self, body, disconnected):
        self.calls.append(("completion", body))
        return await self._out()

    async def chat(self, body, disconnected):
        self.calls.append(("chat", body))
        return await self._out()

    async def _out(self):
        if isinstance(self.answer, BaseException):
            raise self.answer
        if isinstance(self.answer, list):
            async def events():
                for e in self.answer:
                    yield e
            return events()
        return self.answer


def call(app, method: str, path: str, body: bytes = b"", headers=(), raises=None) -> tuple:
    """One request through the ASGI app → (status, headers, body bytes); ``raises``: the
    exception the app re-raises after its 500 answer, as Starlette does for the server's log."""
    async def go():
        done, sent = asyncio.Event(), []
        inbox = [{"type": "http.request", "body": body, "more_body": False}]

        async def receive():
            if inbox:
                return inbox.pop(0)
            await done.wait()
            return {"type": "http.disconnect"}

        async def send(message):
            sent.append(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                done.set()
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
                 "method": method, "scheme": "http", "path": path,
                 "raw_path": path.encode(), "query_string": b"", "root_path": "",
                 "headers": [(k.lower().encode(), v.encode("latin-1")) for k, v in headers],
                 "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}
        if raises is None:
            await app(scope, receive, send)
        else:
            with pytest.raises(raises):
                await app(scope, receive, send)
        return sent
    sent = asyncio.run(go())
    start = [m for m in sent if m["type"] == "http.response.start"]
    assert len(start) == 1
    data = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start[0]["status"], dict(start[0]["headers"]), data


def _error(status: int, data: bytes, code=None) -> dict:
    err = json.loads(data)["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if code is not None:
        assert err["code"] == code
    return err


BEARER = [("Authorization", f"Bearer {KEY}")]


@pytest.mark.parametrize("path", ["/v1/models", "/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize("headers", [[], [("Authorization", "Bearer wrong")],
                                     [("Authorization", KEY)], [("Authorization", f"bearer {KEY}")],
                                     [("Authorization", f"Bearer  {KEY}")],
                                     [("Authorization", f"Bearer {KEY}x")],
                                     [("Authorization", f"Bearer {KEY[:-1]}")],
                                     [("Authorization", f"Basic {KEY}")],
                                     [("X-Api-Key", KEY)], [("X-Authorization", f"Bearer {KEY}")],
                                     [("Authorization", "Bearer wrong"), ("Authorization",
                                                                          f"Bearer {KEY}")]])
def test_a_v1_route_without_the_key_is_401(path, headers):
    server = Stub(api_key=KEY)
    method = "GET" if path == "/v1/models" else "POST"
    status, _, data = call(create_app(server), method, path, b'{"a": 1}', headers)
    assert status == 401
    _error(status, data, "invalid_api_key")
    assert not [c for c in server.calls if c != "start"]         # nothing reached the server
    assert server.counts == [(path, method, 401)]


@pytest.mark.parametrize("headers", [BEARER, [("Accept", f"Bearer {KEY}")] + BEARER,
                                     BEARER + [("Authorization", "Bearer wrong")]])
def test_the_key_lets_each_v1_route_through(headers):
    server = Stub(api_key=KEY)
    app = create_app(server)
    assert call(app, "POST", "/v1/completions", b'{"p": 1}', headers)[0] == 200
    assert call(app, "POST", "/v1/chat/completions", b'{"c": 2}', headers)[0] == 200
    assert call(app, "GET", "/v1/models", b"", headers)[0] == 200
    assert server.calls == [("completion", {"p": 1}), ("chat", {"c": 2})]
    assert server.counts == [("/v1/completions", "POST", 200),
                             ("/v1/chat/completions", "POST", 200), ("/v1/models", "GET", 200)]


@pytest.mark.parametrize("path", OPEN)
def test_health_and_metrics_are_open_with_a_key(path):
    server = Stub(api_key=KEY)
    status, headers, data = call(create_app(server), "GET", path)
    assert status == 200 and server.counts == [(path, "GET", 200)]
    if path == "/metrics":
        assert data == b"# metrics\nx 1\n"
        assert headers[b"content-type"].startswith(b"text/plain; version=0.0.4")


def test_without_a_key_every_route_is_open():
    server = Stub()
    app = create_app(server)
    assert call(app, "POST", "/v1/completions", b"{}")[0] == 200
    assert call(app, "GET", "/v1/models", b"", [("Authorization", "Bearer x")])[0] == 200
    assert server.counts == [("/v1/completions", "POST", 200), ("/v1/models", "GET", 200)]


def test_models_lists_every_name_with_the_root_and_the_context():
    for name, roots in ((None, ["m-a", "m-b"]), ("", ["m-a", "m-b"]),
                        ("org/pair", ["org/pair", "org/pair"])):
        status, _, data = call(create_app(Stub(name=name)), "GET", "/v1/models")
        got = json.loads(data)
        assert status == 200 and got["object"] == "list"
        assert [m["id"] for m in got["data"]] == ["m-a", "m-b"]
        assert [m["root"] for m in got["data"]] == roots
        for m in got["data"]:
            assert (m["object"], m["owned_by"], m["max_model_len"]) == \
                ("model", "dflash2rt", 192)
            assert isinstance(m["created"], int)


def test_health_is_503_once_the_engine_loop_failed():
    assert call(create_app(Stub(failed=None)), "GET", "/health")[:3:2] == (200, b"")
    server = Stub(failed=RuntimeError("boom"))
    status, _, data = call(create_app(server), "GET", "/health")
    assert status == 503 and "boom" in _error(status, data)["message"]
    assert server.counts == [("/health", "GET", 503)]


def test_a_dict_is_json_and_events_are_a_stream():
    status, headers, data = call(create_app(Stub(answer={"x": [1]})), "POST",
                                 "/v1/completions", b"{}")
    assert (status, json.loads(data)) == (200, {"x": [1]})
    assert headers[b"content-type"] == b"application/json"
    events = ["data: 1\n\n", "data: é\n\n", "data: [DONE]\n\n"]
    status, headers, data = call(create_app(Stub(answer=events)), "POST",
                                 "/v1/chat/completions", b"{}")
    assert (status, data) == (200, "".join(events).encode())
    assert headers[b"content-type"].startswith(b"text/event-stream")


@pytest.mark.parametrize("body, code", [(b"{not json", "invalid_json"), (b"", "invalid_json"),
                                        (b"\xff\xfe", "invalid_json"),
                                        (b"[" * 100_000 + b"]" * 100_000, "invalid_json")])
def test_a_body_that_is_not_json_is_400(body, code):
    server = Stub()
    status, _, data = call(create_app(server), "POST", "/v1/completions", body)
    assert status == 400
    _error(status, data, code)
    assert server.calls == [] and server.counts == [("/v1/completions", "POST", 400)]


def test_any_json_value_reaches_the_server():
    server = Stub()
    for raw in (b"[1, 2]", b"3", b"null", b'"s"'):
        assert call(create_app(server), "POST", "/v1/completions", raw)[0] == 200
    assert [c[1] for c in server.calls] == [[1, 2], 3, None, "s"]


def test_errors_keep_their_status_and_headers_and_others_are_500():
    server = Stub(answer=APIError(503, "full", None, "server_overloaded", {"Retry-After": "1"}))
    status, headers, data = call(create_app(server), "POST", "/v1/completions", b"{}")
    assert status == 503 and headers[b"retry-after"] == b"1"
    assert _error(status, data, "server_overloaded")["type"] != "invalid_request_error"
    server = Stub(answer=ValueError("oops"))
    status, _, data = call(create_app(server), "POST", "/v1/chat/completions", b"{}",
                           raises=ValueError)
    assert status == 500 and "ValueError: oops" in _error(status, data, "internal_error")["message"]
    assert server.counts == [("/v1/chat/completions", "POST", 500)]


@pytest.mark.parametrize("method, path, status, handler", [
    ("GET", "/nowhere", 404, "none"), ("GET", "/v1", 404, "none"),
    ("GET", "/v1/completions/x", 404, "none"), ("GET", "/v1/completions", 405,
                                                "/v1/completions"),
    ("POST", "/health", 405, "/health"), ("DELETE", "/v1/models", 405, "/v1/models")])
def test_unknown_routes_and_methods_are_openai_errors(method, path, status, handler):
    server = Stub()
    got, _, data = call(create_app(server), method, path)
    assert got == status
    message = _error(got, data)["message"]
    if status == 404:
        assert path in message and "/v1/chat/completions" in message
    else:
        assert method in message and path in message
    assert server.counts == [(handler, method, status)]


def test_the_gate_counts_a_request_that_died_as_500():
    server = Stub()

    async def broken(scope, receive, send):
        raise RuntimeError("no answer")

    async def go():
        scope = {"type": "http", "path": "/v1/models", "method": "GET", "headers": []}
        with pytest.raises(RuntimeError):
            await Gate(broken, server)(scope, None, None)
    asyncio.run(go())
    assert server.counts == [("/v1/models", "GET", 500)]


def test_other_scopes_pass_the_gate_uncounted_and_the_lifespan_drains_30_s():
    server = Stub(api_key=KEY)
    app = create_app(server)

    async def go():
        inbox = [{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}]
        sent = []

        async def receive():
            return inbox.pop(0)

        async def send(message):
            sent.append(message["type"])
        await app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}, receive, send)
        return sent
    assert asyncio.run(go()) == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
    assert server.calls == ["start", ("close", 30.0)] and server.counts == []
