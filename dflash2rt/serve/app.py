"""The FastAPI application: OpenAI's routes over a ``Server``.

``/v1/completions``, ``/v1/chat/completions``, ``/v1/models`` (behind the API key when one is
set), ``/health`` and ``/metrics`` (open). Every error is OpenAI-shaped JSON (``errors.py``),
unknown routes and bad JSON included; an ASGI gate in front checks the key and counts every
HTTP request by handler, method and status class for ``/metrics``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.exceptions import HTTPException

from .errors import APIError
from .server import Server

log = logging.getLogger("dflash2rt.serve")
ROUTES = ("/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics")
DRAIN_S = 30.0            # how long the shutdown waits for the engine loop
DIRECT_SEND = "dflash2rt.send"   # the scope key of Gate's send (see EventStream)


def error_response(exc: APIError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


async def _body(request: Request) -> Any:
    raw = await request.body()
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise APIError(400, f"the request body is not valid JSON: {exc}", None,
                       "invalid_json") from exc
    except RecursionError:
        raise APIError(400, "the request body nests arrays or objects too deeply to read",
                       None, "invalid_json") from None


def create_app(server: Server) -> FastAPI:
    """The application; its lifespan starts the server's engine loop and, at shutdown (after
    uvicorn has drained the connections), stops it."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        server.start()
        try:
            yield
        finally:
            server.close(DRAIN_S)

    app = FastAPI(title="dflash2rt", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
        what = {404: f"no route {request.url.path}: the routes are {', '.join(ROUTES)}",
                405: f"{request.method} is not allowed on {request.url.path}"}
        return error_response(APIError(exc.status_code, what.get(exc.status_code,
                                                                  str(exc.detail))))

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        log.exception("internal error on %s", request.url.path)
        return error_response(APIError(500, f"internal error: {type(exc).__name__}: {exc}",
                                       None, "internal_error"))

    async def _answer(request: Request, chat: bool) -> Response:
        body = await _body(request)
        handle = server.chat if chat else server.completion
        out = await handle(body, request.is_disconnected)
        if isinstance(out, dict):
            return JSONResponse(out)
        return EventStream(out)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await _answer(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await _answer(request, chat=True)

    @app.get("/v1/models")
    async def models() -> dict:
        created = int(time.time())
        return {"object": "list", "data": [
            {"id": n, "object": "model", "created": created, "owned_by": "dflash2rt",
             "root": server.pair.name or n, "max_model_len": server.limits.max_model_len}
            for n in server.limits.model_names]}

    @app.get("/health")
    async def health() -> Response:
        if server.scheduler.failed is not None:
            return error_response(APIError(503, f"the engine loop stopped: "
                                                f"{server.scheduler.failed}"))
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(server.metrics_text(),
                                 media_type="text/plain; version=0.0.4; charset=utf-8")

    return Gate(app, server)


class EventStream(Response):
    """A streamed answer's ASGI response: each server-sent event the generator yields goes to
    the server as bytes when it is yielded. The start goes through every layer of the stack,
    which records that the response has started; the body's chunks go to ``Gate``'s send,
    which the gate leaves in the scope (``DIRECT_SEND``), past the layers between (Starlette's
    error and exception wrappers, which pass a body on unchanged: a middleware that changed
    bodies, such as gzip, would be bypassed). A client that goes away cancels the answer at
    once (the generator's ``finally`` cancels its requests), as Starlette's
    ``StreamingResponse`` does, without a task group between the generator and the socket."""

    HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"),
               (b"cache-control", b"no-cache")]

    def __init__(self, events: Any) -> None:
        self.events, self.background = events, None

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        task, state = asyncio.current_task(), "streaming"

        async def listen() -> None:
            nonlocal state
            while (await receive())["type"] != "http.disconnect":
                pass
            if state == "streaming":
                state = "gone"
                task.cancel()

        listener = asyncio.ensure_future(listen())
        try:
            await send({"type": "http.response.start", "status": 200,
                        "headers": self.HEADERS})
            body = scope.get(DIRECT_SEND, send)
            async for text in self.events:
                await body({"type": "http.response.body", "body": text.encode(),
                            "more_body": True})
            await body({"type": "http.response.body", "body": b"", "more_body": False})
            state = "sent"
        except asyncio.CancelledError:
            if state != "gone":
                raise
            task.uncancel()
        finally:
            listener.cancel()     # (before any await here: a disconnect heard now cancels none)
            await self.events.aclose()


class Gate:
    """ASGI middleware: the API key on /v1 routes (401 without it) and the HTTP counters."""

    def __init__(self, app: Any, server: Server) -> None:
        self.app, self.server = app, server

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500

        async def send_status(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        path = scope["path"]
        try:
            key = self.server.api_key
            if key is not None and path.startswith("/v1") and not _authorized(scope, key):
                await error_response(APIError(
                    401, "missing or wrong API key: send the header 'Authorization: Bearer "
                         "<key>' with the key the server was started with", None,
                    "invalid_api_key"))(scope, receive, send_status)
                return
            scope[DIRECT_SEND] = send_status
            await self.app(scope, receive, send_status)
        finally:
            self.server.metrics.http_request(path if path in ROUTES else "none",
                                             scope["method"], status)


def _authorized(scope: dict, key: str) -> bool:
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            got = value.decode("latin-1")
            return got.startswith("Bearer ") and hmac.compare_digest(
                got[len("Bearer "):].encode(), key.encode())
    return False
