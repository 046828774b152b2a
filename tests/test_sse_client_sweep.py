"""The lean SSE client's edges, against bytes and messages written out here: the error's
message quotes the first 200 bytes of the body, a fresh connection's request is never sent
twice, ``wait`` keeps reading as long as any of its timeout is left (on a clock that does not
move), and a connection reads "no status yet" as 0 until an answer's head arrives."""

from __future__ import annotations

import selectors
import time
import types

import pytest

from dflash2rt.serve import sse_client
from dflash2rt.serve.sse_client import HTTPStatusError, SSEConnection

from fake_clock import Clock
from test_sse_client import Canned, chunked

WAIT_S = 60.0


def test_the_status_error_quotes_the_first_200_bytes_of_the_body():
    body = bytes(range(256)) + b"tail"
    e = HTTPStatusError(503, body)
    assert str(e) == f"the server answered 503: {body[:200]!r}"
    assert (e.status, e.body) == (503, body)
    assert str(HTTPStatusError(400, b"short")) == "the server answered 400: b'short'"


def test_a_fresh_connections_request_is_not_sent_again():
    """The server reads the request and closes without answering: on a connection opened
    for it that is an error at once, not a second try (only an idle kept connection the
    server may have closed earns one)."""
    with Canned(chunked(b"data: [DONE]\n\n"), answers=0) as srv:
        conn = SSEConnection(srv.base, selectors.DefaultSelector())
        conn.send("/v1/completions", {})
        with pytest.raises(ConnectionError, match="mid-response"):
            conn.wait(WAIT_S)
        conn.close()
        assert srv.requests == 1 and srv.connections == 1


def test_wait_reads_while_any_of_its_timeout_is_left(monkeypatch):
    """On a clock that moves 1 ms a reading, a 0.5 s wait reads an answer however long the
    answer takes in real time; a wait of 0 s gives up before reading what has arrived."""
    clock = Clock(now=100.0, tick=0.001)
    monkeypatch.setattr(sse_client, "time", types.SimpleNamespace(
        monotonic=clock, perf_counter=time.perf_counter))
    payload = chunked(b'data: {"a": 1}\n\n', b"data: [DONE]\n\n")
    with Canned(payload, piece=5) as srv:
        conn = SSEConnection(srv.base, selectors.DefaultSelector())
        for _ in range(2):
            conn.send("/v1/completions", {})
            assert conn.wait(0.5) == ['{"a": 1}', "[DONE]"]
        conn.send("/v1/completions", {})
        clock.tick = 0.0                      # no time left at all: not even one look
        deadline = time.monotonic() + WAIT_S
        while not conn.selector.select(0.05) and time.monotonic() < deadline:
            pass                              # the answer has arrived, unread
        with pytest.raises(TimeoutError, match="no answer within 0 s"):
            conn.wait(0)
        assert conn.events == []
        conn.close()


def test_no_status_reads_as_0_until_the_head_arrives():
    with Canned(b"", silent=True) as srv:
        conn = SSEConnection(srv.base, selectors.DefaultSelector())
        assert (conn.status, conn.body, conn.events) == (0, b"", [])
        conn.send("/v1/completions", {})
        assert conn.status == 0
        with pytest.raises(HTTPStatusError, match="answered 0: b''"):
            conn.raise_for_status()
        conn.close()


@pytest.mark.parametrize("raw", [
    b"\r\n\r\n",                                                   # no status line
    b"HTTP/1.1\r\n\r\n",                                           # no status code
    b"HTTP/1.1 OK 200\r\n\r\n",                                    # a code that is not a number
    b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n",               # a length that is not
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\r\n",  # an empty chunk size
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
], ids=["no-status-line", "no-code", "bad-code", "bad-length", "empty-size", "bad-size"])
def test_a_malformed_response_is_a_connection_error_naming_it(raw):
    with Canned(raw, raw=True) as srv:
        conn = SSEConnection(srv.base, selectors.DefaultSelector())
        conn.send("/v1/completions", {})
        with pytest.raises(ConnectionError, match=r"^malformed HTTP response from the server "):
            conn.wait(WAIT_S)
        assert conn.sock is None                   # closed: the stream is out of step
