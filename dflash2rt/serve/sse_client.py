"""A lean client for the load generator: one keep-alive HTTP/1.1 connection per simulated
client, polled with the others on one ``selectors`` loop, a streamed POST whose server-sent
events are cut off the chunked body as they arrive and stamped with their arrival time.

The load generator shares the machine with the server it measures, so what it spends per chunk
is taken from the server. Per wake-up this does one ``recv`` per ready connection and the
framing: no event loop, no task or future per chunk, and no JSON until the response has ended
(``events`` keeps each event's text and arrival). It speaks only what the server sends: a status
line and headers, then a chunked or a Content-Length body.
"""

from __future__ import annotations

import json
import selectors
import socket
import time
from typing import Any
from urllib.parse import urlsplit

HEAD, CHUNKED, SIZED, ENDED = "head", "chunked", "sized", "ended"


class HTTPStatusError(RuntimeError):
    """The server answered something other than 200 (``status``, ``body``)."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"the server answered {status}: {body[:200]!r}")
        self.status, self.body = status, body


class SSEConnection:
    """One connection, kept open between requests (opened again when the server has closed
    it). ``send(path, body)`` writes a POST; whoever polls ``selector`` calls ``read(now)``
    when the socket is readable (its key's ``data`` is this connection), until it returns
    True: the response has ended. Then ``events`` holds each event's data (the text after
    ``data: ``, ``[DONE]`` included) with the time its bytes were read, in order; ``status``
    and, for a status other than 200, ``body``: ``raise_for_status()`` raises it."""

    def __init__(self, base: str, selector: selectors.BaseSelector) -> None:
        url = urlsplit(base)
        if url.scheme != "http" or not url.hostname:
            raise ValueError(f"SSEConnection speaks plain http to a host, got {base!r}")
        self.host, self.port = url.hostname, url.port or 80
        self.selector = selector
        self.sock: socket.socket | None = None
        self.events: list[tuple[float, str]] = []
        self.status, self.body = 0, b""
        self._request, self._retry = b"", False
        self._buf = self._sse = b""
        self._state, self._keep, self._left = ENDED, True, 0

    def close(self) -> None:
        if self.sock is not None:
            self.selector.unregister(self.sock)
            self.sock.close()
            self.sock = None

    def _open(self) -> None:
        self.close()
        self.sock = socket.create_connection((self.host, self.port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.selector.register(self.sock, selectors.EVENT_READ, self)

    def send(self, path: str, body: Any) -> None:
        if self._state != ENDED:
            raise RuntimeError("send() while a response is still being read")
        payload = json.dumps(body).encode()
        self._request = (f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                         f"Content-Type: application/json\r\nAccept: text/event-stream\r\n"
                         f"Content-Length: {len(payload)}\r\n\r\n").encode() + payload
        self.events, self.status, self.body = [], 0, b""
        self._buf = self._sse = b""
        self._state = HEAD
        self._write(retry=self.sock is not None)

    def _write(self, retry: bool) -> None:
        """The request on the open connection (a new one if there is none); ``retry``: if the
        server has closed it, once more on a new one."""
        if self.sock is None:
            self._open()
        try:
            self.sock.sendall(self._request)
            self._retry = retry
        except OSError:
            if not retry:
                raise
            self.close()
            self._write(retry=False)

    def read(self, now: float) -> bool:
        """What has arrived, parsed; ``now``: when it was read. → whether a response ended
        (an idle connection the server closed is closed here, and is no response)."""
        try:
            data = self.sock.recv(1 << 16)
        except ConnectionResetError:
            data = b""
        if not data:
            self.close()
            if self._state == ENDED:
                return False
            if self._state == HEAD and not self._buf and self._retry:
                self._write(retry=False)    # the server closed the idle connection before
                return False                # it read the request: once more on a new one
            self._state = ENDED
            raise ConnectionError("the server closed the connection mid-response")
        self._buf += data
        return self._parse(now)

    def _parse(self, now: float) -> bool:
        try:
            return self._parse_buffer(now)
        except (IndexError, ValueError) as exc:     # a status line or chunk size unreadable
            self._state = ENDED
            self.close()                            # the stream is out of step: not reused
            raise ConnectionError(f"malformed HTTP response from the server ({exc}): "
                                  f"{self._buf[:80]!r}") from None

    def _parse_buffer(self, now: float) -> bool:
        buf = self._buf
        while self._state != ENDED:
            if self._state == HEAD:
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    break
                lines = buf[:end].decode("latin-1").split("\r\n")
                buf = buf[end + 4:]
                self.status = int(lines[0].split(" ", 2)[1])
                headers = {}
                for line in lines[1:]:
                    k, _, v = line.partition(":")
                    headers[k.strip().lower()] = v.strip().lower()
                self._keep = headers.get("connection") != "close"
                chunked = headers.get("transfer-encoding") == "chunked"
                self._state = CHUNKED if chunked else SIZED
                self._left = 0 if chunked else int(headers.get("content-length", "0"))
            elif self._state == CHUNKED:
                nl = buf.find(b"\r\n")
                if nl < 0:
                    break
                size = int(buf[:nl].split(b";", 1)[0], 16)
                if len(buf) < nl + size + 4:
                    break
                data, buf = buf[nl + 2:nl + 2 + size], buf[nl + size + 4:]
                if size == 0:
                    self._end()
                else:
                    self._take(data, now)
            else:
                if len(buf) < self._left:
                    break
                data, buf = buf[:self._left], buf[self._left:]
                self._take(data, now)
                self._end()
        self._buf = buf
        return self._state == ENDED

    def _take(self, data: bytes, now: float) -> None:
        if self.status != 200:
            self.body += data
            return
        *done, self._sse = (self._sse + data).split(b"\n\n")  # the rest waits for its end
        for event in done:
            if event.startswith(b"data: "):
                self.events.append((now, event[6:].decode()))

    def _end(self) -> None:
        self._state, self._request = ENDED, b""     # (an event cut off at the end is dropped,
        if not self._keep:                          # as the SSE standard says)
            self.close()

    def wait(self, timeout: float) -> list[str]:
        """Poll ``selector`` until the response has ended (for a connection polled alone) →
        its events' data, after ``raise_for_status``; ``TimeoutError`` after ``timeout``
        seconds."""
        deadline = time.monotonic() + timeout
        while self._state != ENDED:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no answer within {timeout} s")
            for key, _ in self.selector.select(left):
                key.data.read(time.perf_counter())
        self.raise_for_status()
        return [data for _, data in self.events]

    def raise_for_status(self) -> None:
        if self.status != 200:
            raise HTTPStatusError(self.status, self.body)
