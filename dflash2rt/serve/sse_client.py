"""A lean client for the load generator: one keep-alive HTTP/1.1 connection per simulated
client (asyncio streams), a streamed POST whose server-sent events are read off the chunked
body as they arrive.

The load generator shares the machine with the server it measures, so what it spends per chunk
is taken from the server: this reads a chunk with two awaits and parses nothing but the
events' JSON, a few times less CPU per chunk than a general HTTP client (vLLM's load
generator uses aiohttp, whose parser is C, for the same reason). It speaks only what the
server sends: a status line and headers, then a chunked or a Content-Length body.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, AsyncIterator
from urllib.parse import urlsplit


class HTTPStatusError(RuntimeError):
    """The server answered something other than 200 (``status``, ``body``)."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"the server answered {status}: {body[:200]!r}")
        self.status, self.body = status, body


class SSEClient:
    """``async with SSEClient(base) as c: async for data in c.stream(path, body): ...``
    yields each event's data (the text after ``data: ``), ``[DONE]`` included, over one
    connection kept open between requests (opened again if the server closed it)."""

    def __init__(self, base: str) -> None:
        url = urlsplit(base)
        if url.scheme != "http" or not url.hostname:
            raise ValueError(f"SSEClient speaks plain http to a host, got {base!r}")
        self.host, self.port = url.hostname, url.port or 80
        self._r: asyncio.StreamReader | None = None
        self._w: asyncio.StreamWriter | None = None

    async def __aenter__(self) -> "SSEClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        if self._w is not None:
            self._w.close()
            try:
                await self._w.wait_closed()
            except OSError:
                pass
        self._r = self._w = None

    async def stream(self, path: str, body: Any) -> AsyncIterator[str]:
        if self._w is None or self._w.is_closing():
            self._r, self._w = await asyncio.open_connection(self.host, self.port)
        payload = json.dumps(body).encode()
        self._w.write(f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                      f"Content-Type: application/json\r\nAccept: text/event-stream\r\n"
                      f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
        r = self._r
        status = int((await r.readuntil(b"\r\n")).split(b" ", 2)[1])
        headers = {}
        while (line := await r.readuntil(b"\r\n")) != b"\r\n":
            k, _, v = line.decode("latin-1").partition(":")
            headers[k.strip().lower()] = v.strip().lower()
        keep = headers.get("connection") != "close"
        chunked = headers.get("transfer-encoding") == "chunked"
        body = _chunks(r) if chunked else _sized(r, headers)
        if status != 200:
            data = b"".join([c async for c in body])
            if not keep:
                await self.close()
            raise HTTPStatusError(status, data)
        buf = b""
        async for chunk in body:
            buf += chunk
            *events, buf = buf.split(b"\n\n")    # what follows the last blank line waits
            for event in events:
                if event.startswith(b"data: "):
                    yield event[6:].decode()
        if not keep:                               # (an event cut off at the end is dropped,
            await self.close()                     # as the SSE standard says)


async def _chunks(r: asyncio.StreamReader) -> AsyncIterator[bytes]:
    """The chunks of a chunked body, to its last (empty) one and the blank line after it."""
    while True:
        size = int((await r.readuntil(b"\r\n")).split(b";", 1)[0], 16)
        data = await r.readexactly(size + 2)
        if size == 0:
            return
        yield data[:-2]


async def _sized(r: asyncio.StreamReader, headers: dict[str, str]) -> AsyncIterator[bytes]:
    """A Content-Length body, as one chunk."""
    yield await r.readexactly(int(headers.get("content-length", "0")))
