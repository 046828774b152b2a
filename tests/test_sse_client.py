"""The load generator's client: ``SSEConnection`` reads what a server sends (events split across
chunks or packed in one, either framing, errors) over one keep-alive connection, opens a new
one when the server has closed the old, and stamps each event with when it arrived; ``drive``
turns the stamps into TTFT, TPOT and ITL and gives up on a request that is never answered."""

from __future__ import annotations

import selectors
import socket
import socketserver
import struct
import threading
import time

import pytest

from dflash2rt.serve import load
from dflash2rt.serve.sse_client import HTTPStatusError, SSEConnection

WAIT_S = 60.0


class Canned(socketserver.ThreadingTCPServer):
    """A server on a free loopback port that answers every request with ``payload`` (already
    chunk-framed when ``chunked``) under ``status``. ``close_after``: it closes the connection
    after each answer without saying so (as an idle keep-alive timeout does); ``close_header``:
    it says ``Connection: close`` and closes; ``cut``: it closes after that many bytes of the
    answer; ``silent``: it reads the request and never answers. ``connections``: how many it
    accepted; ``requests``: how many it read; ``reset``: it resets the connection after each
    answer (a close that makes the client's next send fail); ``piece``: it writes the answer
    that many bytes at a time, a moment apart, so the client reads it cut anywhere;
    ``answers``: it answers that many requests, then closes without answering. ``bodies``:
    each request's body, as it read them. ``raw``: ``payload`` is the whole response, status
    line and head included, written as it is."""

    daemon_threads = allow_reuse_address = True

    def __init__(self, payload: bytes, status: int = 200, chunked: bool = True,
                 close_after: bool = False, close_header: bool = False,
                 cut: int | None = None, silent: bool = False, reset: bool = False,
                 piece: int | None = None, answers: int | None = None,
                 raw: bool = False) -> None:
        self.payload, self.status, self.chunked, self.raw = payload, status, chunked, raw
        self.answers, self.bodies = answers, []
        self.close_after, self.close_header, self.cut = close_after, close_header, cut
        self.reset, self.piece = reset, piece
        self.silent, self.connections, self.requests = silent, 0, 0
        self.release = threading.Event()
        super().__init__(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.server_address[1]}"
        threading.Thread(target=self.serve_forever, args=(0.02,), daemon=True).start()

    def __enter__(self) -> "Canned":
        return self

    def __exit__(self, *exc) -> None:
        self.release.set()
        self.shutdown()
        self.server_close()


class Handler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        srv: Canned = self.server
        srv.connections += 1
        while True:
            head = b""
            while not head.endswith(b"\r\n\r\n"):
                line = self.rfile.readline()
                if not line:
                    return                              # the client closed its connection
                head += line
            length = int(next(x.split(b":")[1] for x in head.split(b"\r\n")
                              if x.lower().startswith(b"content-length")))
            srv.bodies.append(self.rfile.read(length))
            srv.requests += 1
            if srv.answers is not None and srv.requests > srv.answers:
                return
            if srv.silent:
                srv.release.wait(WAIT_S)
                return
            framing = b"Transfer-Encoding: chunked\r\n" if srv.chunked else \
                f"Content-Length: {len(srv.payload)}\r\n".encode()
            extra = b"Connection: close\r\n" if srv.close_header else b""
            out = srv.payload if srv.raw else \
                f"HTTP/1.1 {srv.status} X\r\n".encode() + framing + extra + b"\r\n" + srv.payload
            out = out if srv.cut is None else out[:srv.cut]
            step = srv.piece or len(out)
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for k in range(0, len(out), step):
                self.wfile.write(out[k:k + step])
                self.wfile.flush()
                if srv.piece:
                    time.sleep(0.002)
            if srv.reset:
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                           struct.pack("ii", 1, 0))
            if srv.close_after or srv.close_header or srv.cut is not None or srv.reset:
                return


def chunked(*parts: bytes) -> bytes:
    return b"".join(f"{len(p):x}\r\n".encode() + p + b"\r\n" for p in parts) + b"0\r\n\r\n"


def events(base: str, bodies: list[dict]) -> list[list[str]]:
    """Each body's events through one SSEConnection, in turn (the connection kept)."""
    conn = SSEConnection(base, selectors.DefaultSelector())
    out = []
    try:
        for body in bodies:
            conn.send("/v1/completions", body)
            out.append(conn.wait(WAIT_S))
            time.sleep(0.05)              # a server's close after an answer reaches the client
    finally:
        conn.close()
    return out


EVENTS = ['{"a": 1}', '{"a": 2}', "[DONE]"]


@pytest.mark.parametrize("parts", [
    (b"data: {\"a\": 1}\n\ndata: {\"a\": 2}\n\ndata: [DONE]\n\n",),          # all in one chunk
    (b"data: {\"a\"", b": 1}\n", b"\ndata: {\"a\": 2}\n\nda", b"ta: [DONE]\n\n"),   # split
    (b"data: {\"a\": 1}\n\n", b"data: {\"a\": 2}\n\n", b"data: [DONE]\n\n"),
], ids=["packed", "split", "one-per-chunk"])
def test_events_are_read_wherever_the_chunks_cut_them_on_one_connection(parts):
    with Canned(chunked(*parts)) as srv:
        assert events(srv.base, [{}, {}, {}]) == [EVENTS] * 3
        assert srv.connections == 1 and srv.requests == 3


@pytest.mark.parametrize("framing", [True, False], ids=["chunked", "sized"])
def test_an_answer_read_a_few_bytes_at_a_time_gives_the_same_events(framing):
    body = b'data: {"a": 1}\n\ndata: {"a": 2}\n\ndata: [DONE]\n\n'
    payload = chunked(body[:20], body[20:23], body[23:]) if framing else body
    for piece in (1, 3, 7):
        with Canned(payload, chunked=framing, piece=piece) as srv:
            conn = SSEConnection(srv.base, selectors.DefaultSelector())
            conn.send("/v1/completions", {})
            got = _reads(conn)
            assert conn.wait(WAIT_S) == EVENTS and len(got) > 3    # many reads, one end
            conn.close()


def test_a_status_other_than_200_raises_with_its_body_and_the_connection_goes_on():
    body = b'{"error": {"message": "max_tokens must be >= 1"}}'
    for framing in (True, False):
        with Canned(chunked(body[:7], body[7:]) if framing else body, 400,
                    chunked=framing) as srv:
            conn = SSEConnection(srv.base, selectors.DefaultSelector())
            for _ in range(2):
                conn.send("/v1/completions", {})
                with pytest.raises(HTTPStatusError) as info:
                    conn.wait(WAIT_S)
                assert info.value.status == 400 and info.value.body == body
                assert conn.events == []
            conn.close()
            assert srv.connections == 1
    with Canned(body, 200, chunked=False) as srv:
        assert events(srv.base, [{}]) == [[]]             # a sized body without events: none


@pytest.mark.parametrize("framing", [True, False], ids=["chunked", "sized"])
def test_either_framing_reads_alike_and_an_event_cut_off_at_the_end_is_dropped(framing):
    payload = b'data: {"a": 1}\n\n: a comment\n\ndata: [DONE]\n\ndata: {"cut'
    with Canned(chunked(payload[:9], payload[9:]) if framing else payload,
                chunked=framing) as srv:
        assert events(srv.base, [{}, {}]) == [['{"a": 1}', "[DONE]"]] * 2
    with pytest.raises(ValueError, match="plain http"):
        SSEConnection("https://127.0.0.1:1", selectors.DefaultSelector())


def test_a_connection_the_server_closed_is_opened_again_and_the_request_sent_once_more():
    with Canned(chunked(b"data: {\"a\": 1}\n\ndata: {\"a\": 2}\n\ndata: [DONE]\n\n"),
                close_after=True) as srv:
        assert events(srv.base, [{}, {}, {}]) == [EVENTS] * 3
        assert srv.connections == 3 and srv.requests == 3
    with Canned(chunked(b"data: {\"a\": 1}\n\ndata: {\"a\": 2}\n\ndata: [DONE]\n\n"),
                reset=True) as srv:                 # the next send fails: sent again
        assert events(srv.base, [{}, {}, {}]) == [EVENTS] * 3
        assert srv.connections == 3 and srv.requests == 3
    with Canned(chunked(b"data: [DONE]\n\n"), close_header=True) as srv:
        assert events(srv.base, [{}, {}]) == [["[DONE]"]] * 2
        assert srv.connections == 2


@pytest.mark.parametrize("how", ["close_after", "reset"])
def test_a_request_goes_again_once_at_most(how):
    """The server closed (or reset) the idle connection, and closes the new one too without
    answering: the request went out again once, then it is an error, not a third try."""
    with Canned(chunked(b"data: [DONE]\n\n"), answers=1, close_after=how == "close_after",
                reset=how == "reset") as srv:
        conn = SSEConnection(srv.base, selectors.DefaultSelector())
        conn.send("/v1/completions", {})
        assert conn.wait(WAIT_S) == ["[DONE]"]
        time.sleep(0.05)
        conn.send("/v1/completions", {})
        with pytest.raises(ConnectionError, match="mid-response"):
            conn.wait(5.0)
        assert srv.requests == 2 and srv.connections == 2
        conn.close()


def test_a_server_that_closes_mid_answer_is_an_error_not_an_answer():
    payload = chunked(b"data: {\"a\": 1}\n\n", b"data: [DONE]\n\n")
    for cut in (5, 40, len(payload) - 3):      # in the status line, the head, the body
        with Canned(payload, cut=cut) as srv:
            conn = SSEConnection(srv.base, selectors.DefaultSelector())
            conn.send("/v1/completions", {})
            with pytest.raises(ConnectionError, match="mid-response"):
                conn.wait(WAIT_S)
            assert srv.requests == 1               # not sent again: the server had read it
            conn.close()


def test_a_second_request_before_the_answer_ended_is_refused():
    with Canned(b"", silent=True) as srv:
        conn = SSEConnection(srv.base, selectors.DefaultSelector())
        conn.send("/v1/completions", {})
        with pytest.raises(RuntimeError, match="still being read"):
            conn.send("/v1/completions", {})
        with pytest.raises(TimeoutError):
            conn.wait(0.2)
        conn.close()


def test_each_event_carries_when_it_was_read():
    """The events of one read share its time; those of a later read carry the later one."""
    with Canned(b"", silent=True) as srv:
        conn = SSEConnection(srv.base, selectors.DefaultSelector())
        conn.send("/v1/completions", {})
        body = chunked(b'data: {"a": 1}\n\n', b'data: {"a": 2}\n\n', b"data: [DONE]\n\n")
        cut = body.index(b"data: [DONE]") - 3          # at its chunk's size line
        conn._buf = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + body[:cut]
        assert not conn._parse(1.0)
        conn._buf += body[cut:]
        assert conn._parse(2.5)
        assert conn.events == [(1.0, '{"a": 1}'), (1.0, '{"a": 2}'), (2.5, "[DONE]")]
        conn.close()


def _chunk(text: str, usage: int | None = None) -> str:
    import json

    return json.dumps({"choices": [{"text": text}] if usage is None else [],
                       "usage": None if usage is None else {"completion_tokens": usage}})


def test_a_requests_figures_come_from_its_events_arrival_times():
    """TTFT to the first chunk with text, ITL between chunks with text (empty ones are no
    token), TPOT from the first text to the end over the tokens after the first."""
    conn = SSEConnection("http://127.0.0.1:1", selectors.DefaultSelector())
    conn.status = 200
    conn.events = [(10.5, _chunk("")), (11.0, _chunk("a")), (11.25, _chunk("bc")),
                   (11.5, _chunk("")), (12.0, _chunk("d")), (12.25, _chunk("", usage=5)),
                   (12.5, "[DONE]")]
    r = load._result(conn, 10.0, 13.0)
    assert r["ttft"] == 1.0 and r["e2e"] == 3.0 and r["tokens"] == 5
    assert r["itl"] == [0.25, 0.75] and r["tpot"] == pytest.approx(2.0 / 4)
    conn.events = [(11.0, _chunk("a")), (12.5, _chunk("b")), (12.75, _chunk("", usage=2))]
    two = load._result(conn, 10.0, 13.0)
    assert two["tpot"] == 2.0 and two["itl"] == [1.5]
    conn.events = [(11.0, _chunk("a")), (12.0, _chunk("", usage=1))]
    one = load._result(conn, 10.0, 13.0)
    assert one["tpot"] is None and one["itl"] == [] and one["ttft"] == 1.0
    conn.events = []
    none = load._result(conn, 10.0, 13.0)
    assert none["ttft"] == 3.0 and none["tokens"] == 0
    conn.status, conn.body = 503, b"busy"
    with pytest.raises(HTTPStatusError, match="503"):
        load._result(conn, 10.0, 13.0)


def test_drive_gives_up_on_a_request_that_is_never_answered(monkeypatch):
    monkeypatch.setattr(load, "PATIENCE_S", 0.5)
    monkeypatch.setattr(load, "_spec_counters", lambda base: {"drafts": 0.0,
                                                              "accepted_tokens": 0.0})
    with Canned(b"", silent=True) as srv:
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match="unanswered"):
            load.drive(srv.base, "m", ["p"], concurrency=2, requests=4, max_tokens=3,
                       time_limit=0.1)
        assert time.monotonic() - t0 < WAIT_S and srv.requests == 2


def _reads(conn: SSEConnection) -> list[bool]:
    """``conn``'s answer polled as ``drive`` polls it: what each ``read`` returned."""
    got, deadline = [], time.monotonic() + WAIT_S
    while True not in got:
        assert time.monotonic() < deadline, "no answer"
        for key, _ in conn.selector.select(1.0):
            got.append(key.data.read(time.perf_counter()))
    return got


@pytest.mark.parametrize("how", ["kept", "close_after", "reset"])
def test_a_read_says_an_answer_ended_once_and_an_idle_close_is_no_answer(how):
    """``drive`` records an answer when ``read`` returns True: only at an answer's end, never
    for the server closing an idle connection, nor for the request going out again."""
    payload = chunked(b'data: {"a": 1}\n\n', b"data: [DONE]\n\n")
    with Canned(payload, close_after=how == "close_after", reset=how == "reset") as srv:
        conn = SSEConnection(srv.base, selectors.DefaultSelector())
        for _ in range(3):
            conn.send("/v1/completions", {})
            got = _reads(conn)
            assert got[-1] is True and True not in got[:-1]
            assert [d for _, d in conn.events] == ['{"a": 1}', "[DONE]"]
            time.sleep(0.05)
        if how != "kept":                      # the last answer's close, read while idle
            ready = conn.selector.select(WAIT_S)
            assert [key.data.read(time.perf_counter()) for key, _ in ready] == [False]
            assert conn.sock is None
        conn.close()
    assert SSEConnection("http://127.0.0.1", selectors.DefaultSelector()).port == 80


def test_drive_asks_each_request_greedy_streamed_with_usage_for_its_length(monkeypatch):
    """What ``drive`` sends: request k is prompt k % len(prompts), for its own length, greedy
    (the references decode greedily), EOS ignored, streamed with the usage at the end."""
    import json

    monkeypatch.setattr(load, "_spec_counters", lambda base: {"drafts": 0.0,
                                                              "accepted_tokens": 0.0})
    answer = chunked(b'data: ' + _chunk("a").encode() + b"\n\n",
                     b'data: ' + _chunk("", usage=1).encode() + b"\n\ndata: [DONE]\n\n")
    with Canned(answer) as srv:
        row = load.drive(srv.base, "m", ["p0", "p1"], concurrency=1, requests=3,
                         max_tokens=[2, 5], time_limit=WAIT_S)
    assert row["requests"] == 3 and row["output_tokens"] == 3
    assert [json.loads(b) for b in srv.bodies] == [
        {"model": "m", "prompt": p, "stream": True, "max_tokens": n, "temperature": 0,
         "ignore_eos": True, "stream_options": {"include_usage": True}}
        for p, n in (("p0", 2), ("p1", 5), ("p0", 2))]
