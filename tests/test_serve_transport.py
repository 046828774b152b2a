"""How the server's events travel: the load generator's lean SSE client reads what the server
sends exactly as a general client does; a turn's events reach the event loop in one call, in
order; the stream interval gathers a request's tokens without holding its first or its end;
an adaptive server's cost table is calibrated before its first request and decides by the
rate rule."""

from __future__ import annotations

import json
import re
import selectors
import threading
import types

import httpx
import pytest

from dflash2rt.serve import build_server
from dflash2rt.serve.jobs import Event, Job, Mailbox
from dflash2rt.serve.live import LiveServer
from dflash2rt.serve.server import Server
from dflash2rt.serve.sse_client import HTTPStatusError, SSEConnection
from test_sse_client import events as answers     # each body's events on one connection

MODEL = "stdlib-code"
WAIT_S = 120.0


@pytest.fixture(scope="module")
def live():
    with LiveServer(build_server(MODEL, "cpu", max_num_seqs=4, max_model_len=256)) as s:
        yield s


def test_the_lean_client_sees_what_a_general_client_sees(live):
    """The server's stream through SSEConnection and through httpx: the same events (the
    response ids and creation times apart), on a connection that survives a 400 between
    streams."""
    body = {"model": MODEL, "prompt": "def add(a, b):", "max_tokens": 12, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    bad = {**body, "max_tokens": -1}
    conn = SSEConnection(live.base, selectors.DefaultSelector())
    try:
        conn.send("/v1/completions", body)
        a = conn.wait(WAIT_S)
        conn.send("/v1/completions", bad)
        with pytest.raises(HTTPStatusError) as info:
            conn.wait(WAIT_S)
        conn.send("/v1/completions", body)
        b = conn.wait(WAIT_S)
    finally:
        conn.close()
    with httpx.stream("POST", live.base + "/v1/completions", json=body, timeout=WAIT_S) as r:
        ref = [line[len("data: "):] for line in r.iter_lines() if line.startswith("data: ")]

    def plain(events: list[str]) -> list:
        return [e if e == "[DONE]" else {k: v for k, v in json.loads(e).items()
                                         if k not in ("id", "created")} for e in events]
    assert info.value.status == 400
    assert plain(a) == plain(b) == plain(ref) and len(ref) > 3 and ref[-1] == "[DONE]"


class _Loop:
    """What ``Server._flush`` needs of an event loop: ``call_soon_threadsafe``, recorded."""

    def __init__(self, closed: bool = False) -> None:
        self.calls, self.closed = [], closed

    def call_soon_threadsafe(self, fn, *args) -> None:
        if self.closed:
            raise RuntimeError("Event loop is closed")
        self.calls.append((fn, args))


def test_a_turns_events_reach_each_event_loop_in_one_call_in_order():
    server = _bare_server(1)
    one, two, gone = _Loop(), _Loop(), _Loop(closed=True)
    queues = [Mailbox() for _ in range(3)]
    sent = [(one, queues[0], Event("tokens", [1])), (two, queues[1], Event("tokens", [2])),
            (one, queues[0], Event("tokens", [3])), (one, queues[2], Event("tokens", [4])),
            (gone, queues[1], Event("tokens", [5]))]
    for i, (loop, q, e) in enumerate(sent):
        server._sink(loop, q, i, Job(None, None), e)
    assert not one.calls and not two.calls           # nothing leaves before the turn ends
    server._flush()
    assert len(one.calls) == len(two.calls) == 1 and not server._outbox
    for loop in (one, two):
        fn, (items,) = loop.calls[0]
        fn(items)
    got = [q.items.popleft() for q in (queues[0], queues[0], queues[1], queues[2])]
    assert [(i, e.tokens) for i, e in got] == [(0, [1]), (2, [3]), (1, [2]), (3, [4])]
    assert not any(q.items for q in queues)            # the closed loop's event is dropped
    server._flush()
    assert len(one.calls) == 1                       # an empty turn calls nothing


def _bare_server(stream_interval: int) -> Server:
    """A Server with only what ``_sink`` and ``_flush`` use (no model)."""
    server = object.__new__(Server)
    server._outbox, server._outbox_lock = {}, threading.Lock()
    server.stream_interval = stream_interval
    server.metrics = types.SimpleNamespace(finished=lambda *a: None)
    return server


def _through(server: Server, events: list[Event], streamed: bool = True) -> list[Event]:
    """``events`` of one request through ``_sink`` → what leaves at the turns' ends."""
    loop, q = _Loop(), Mailbox()
    job = Job(types.SimpleNamespace(prompt_ids=(1, 2)), None, streamed=streamed)
    out = []
    for e in events:
        server._sink(loop, q, 0, job, e)
        server._flush()
        for fn, (items,) in loop.calls:
            fn(items)
        loop.calls.clear()
        while q.items:
            out.append(q.items.popleft()[1])
    return out


def _tokens(*runs: list[int], lp: bool = False) -> list[Event]:
    return [Event("tokens", list(r), [-0.5 * t for t in r] if lp else None,
                  [{t: -0.5 * t} for t in r] if lp else None) for r in runs]


@pytest.mark.parametrize("interval", [2, 3, 5])
def test_the_stream_interval_gathers_tokens_in_order_never_holding_the_first_or_the_end(
        interval):
    server = _bare_server(interval)
    runs = [[1], [2], [3, 4], [5], [6], [7, 8, 9, 10, 11], [12]]
    for lp in (False, True):
        for end in (Event("done"), Event("aborted"), Event("error", error=ValueError("x"))):
            out = _through(server, _tokens(*runs, lp=lp) + [end])
            assert out[-1] is end and all(e.kind == "tokens" for e in out[:-1])
            sizes = [len(e.tokens) for e in out[:-1]]
            assert sizes[0] == 1                           # the first tokens at once
            assert all(n >= interval for n in sizes[1:-1])  # later ones gathered
            assert [t for e in out[:-1] for t in e.tokens] == list(range(1, 13))
            if lp:                                        # logprobs travel with their tokens
                for e in out[:-1]:
                    assert e.logprobs == [-0.5 * t for t in e.tokens]
                    assert e.top_logprobs == [{t: -0.5 * t} for t in e.tokens]
            else:
                assert all(e.logprobs is None and e.top_logprobs is None for e in out[:-1])
    plain = _through(_bare_server(1), _tokens(*runs) + [Event("done")])
    assert [e.tokens for e in plain[:-1]] == runs           # 1: every event as it came


@pytest.mark.parametrize("interval", [1, 3])
def test_a_whole_answer_hears_only_its_end(interval):
    """A request that is not streamed gets no token events, whatever the interval: its end
    carries every token, so the HTTP side wakes for it once."""
    for end in (Event("done"), Event("aborted"), Event("error", error=ValueError("x"))):
        out = _through(_bare_server(interval), _tokens([1], [2, 3], [4]) + [end],
                       streamed=False)
        assert out == [end]


def test_a_served_whole_answer_posts_no_token_events():
    """Through a live server: the streamed request's tokens reach the HTTP side as they come,
    the whole answer's only with its end, and both say the same text."""
    server = build_server(MODEL, "cpu", spec=False, max_num_seqs=2, max_model_len=128)
    posted: list[tuple[int, str]] = []
    real = server._post

    def post(loop, queue, i, event):
        posted.append((id(queue), event.kind))
        real(loop, queue, i, event)
    server._post = post
    body = {"model": MODEL, "prompt": "def add(a, b):", "max_tokens": 9, "temperature": 0,
            "ignore_eos": True}
    with LiveServer(server) as s:
        whole = httpx.post(s.base + "/v1/completions", json=body, timeout=WAIT_S).json()
        kinds_whole = [k for _, k in posted]
        posted.clear()
        (events,) = answers(s.base, [{**body, "stream": True}])
    assert kinds_whole == ["done"]
    assert [k for _, k in posted].count("tokens") >= 2 and posted[-1][1] == "done"
    text = "".join(json.loads(e)["choices"][0]["text"] for e in events if e != "[DONE]")
    assert text == whole["choices"][0]["text"]


def test_a_stream_interval_below_one_is_refused():
    from dflash2rt.errors import InvalidInputError

    with pytest.raises(InvalidInputError, match="stream_interval must be an integer >= 1"):
        build_server(MODEL, "cpu", max_num_seqs=1, max_model_len=64, stream_interval=0)


def test_a_served_stream_gathers_tokens_and_says_what_the_whole_answer_says():
    """Target-only (one token a step) with --stream-interval 4: after the first chunk each
    chunk but the last carries at least 4 tokens; the text and tokens equal the
    non-streamed answer's."""
    server = build_server(MODEL, "cpu", spec=False, max_num_seqs=2, max_model_len=128,
                          stream_interval=4)
    body = {"model": MODEL, "prompt": "def add(a, b):", "max_tokens": 19, "temperature": 0,
            "ignore_eos": True, "logprobs": 0}
    with LiveServer(server) as s:
        whole = httpx.post(s.base + "/v1/completions", json=body, timeout=WAIT_S).json()
        (events,) = answers(s.base, [{**body, "stream": True}])
    chunks = [json.loads(e)["choices"][0] for e in events if e != "[DONE]"]
    sizes = [len(c["logprobs"]["tokens"]) for c in chunks if c["logprobs"]]
    assert sizes[0] == 1 and all(n >= 4 for n in sizes[1:-1]) and sum(sizes) == 19
    assert len(sizes) < 19 - 8                              # gathered: far fewer chunks
    assert "".join(c["text"] for c in chunks) == whole["choices"][0]["text"]
    assert [t for c in chunks if c["logprobs"] for t in c["logprobs"]["tokens"]] == \
        whole["choices"][0]["logprobs"]["tokens"]


def test_an_adaptive_server_is_calibrated_before_its_first_request():
    """Every candidate at every bucket up to the slots, greedy and sampled, in the table
    before any request; the server's policy decides by the rate rule."""
    server = build_server(MODEL, "cpu", max_num_seqs=4, max_model_len=256, block_size="auto")
    with LiveServer(server) as s:
        blocks = server.scheduler.blocks
        table = blocks.policy.table
        want = {(b, k, m) for b in blocks.candidates for k in (1, 2, 4)
                for m in ("greedy", "sampled")}
        assert want <= {key for key, v in table.samples.items() if len(v) >= 3}
        assert {"finish_rule", "call_plan"} <= blocks.policy.without
        assert server.scheduler.stats.steps == 0 and server.scheduler.running == 0
        r = httpx.post(s.base + "/v1/completions", timeout=WAIT_S, json={
            "model": MODEL, "prompt": "import os\n", "max_tokens": 8, "temperature": 0,
            "ignore_eos": True})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 8


def test_an_adaptive_server_never_plans_an_epoch_target_only():
    """Whatever earlier epochs took, each epoch decides step by step: with a pooled
    acceptance and records saying speculative epochs take a million seconds beyond their
    steps, the engine's call plan would run the next epoch target-only; the server's does not
    plan."""
    server = build_server(MODEL, "cpu", max_num_seqs=2, max_model_len=256, block_size="auto")
    with LiveServer(server) as s:
        policy = server.scheduler.blocks.policy
        law, table = (0.0, 1.0, 0), policy.table
        table.fold_accept("greedy", law, ([90.0] * 15, [100.0] * 15))
        for bucket in (1, 2):
            table.overhead[("greedy", law, bucket, "spec")] = 1e6
            table.overhead[("greedy", law, bucket, "target-only")] = 0.0
        policy.schedule.begin("greedy", law)
        assert policy.schedule.project(1, [16]) is not None      # the plan would have decided
        r = httpx.post(s.base + "/v1/completions", timeout=WAIT_S, json={
            "model": MODEL, "prompt": "import os\n", "max_tokens": 16, "temperature": 0,
            "ignore_eos": True})
        assert r.status_code == 200 and server.scheduler.blocks.epochs >= 1
        assert policy.call_plan.last == "" and not policy.target_only_call


def test_an_idle_engine_loop_runs_a_signal_that_another_thread_received():
    """``dflash2rt serve`` runs the engine loop on the main thread, where Python runs signal
    handlers, between bytecodes only. A SIGTERM the kernel hands to another thread (uvicorn's)
    only sets a flag: an idle loop must still come back to look at it, or the server never
    drains. Here the signal goes to a helper thread by ``pthread_kill``."""
    import signal
    import time

    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers can only be installed from the main thread, and this "
                    "test runner runs tests on another")
    server = build_server(MODEL, "cpu", max_num_seqs=1, max_model_len=64)
    sch = server.scheduler
    sch.loop_in_caller()
    handled, gave_up = [], []

    def handler(signum, frame) -> None:
        handled.append(signum)
        sch.close(0)

    def poke() -> None:
        sch._ready.wait()
        time.sleep(0.2)                       # the loop is waiting for requests by now
        signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)

    def watchdog() -> None:                   # bounded: a loop that never looks is stopped
        gave_up.append(True)
        sch.close(0)
    old = signal.signal(signal.SIGUSR1, handler)
    timer = threading.Timer(60.0, watchdog)
    try:
        threading.Thread(target=poke, daemon=True).start()
        timer.start()
        sch.run_here()
    finally:
        timer.cancel()
        signal.signal(signal.SIGUSR1, old)
    assert handled == [signal.SIGUSR1] and not gave_up


@pytest.mark.parametrize("port", [-1, 65536, 99999, "8000", True, 80.0, None])
def test_a_port_outside_its_range_is_refused(port):
    from dflash2rt.errors import InvalidInputError
    from dflash2rt.serve import check_port

    with pytest.raises(InvalidInputError, match=f"port must be an integer in \\[0, 65535\\], "
                                                f"got {re.escape(repr(port))}"):
        check_port(port)


def test_ports_at_the_ends_of_the_range():
    from dflash2rt.serve import check_port

    for port in (0, 1, 8000, 65535):
        check_port(port)


def test_a_server_that_cannot_listen_fails_naming_the_address():
    """A port in use: uvicorn logs the bind error and exits its thread; run_server must not
    return as if the server had run and stopped."""
    import socket

    from dflash2rt.errors import InvalidInputError
    from dflash2rt.serve import run_server

    server = build_server(MODEL, "cpu", max_num_seqs=1, max_model_len=64)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(InvalidInputError,
                           match=f"could not listen on http://127.0.0.1:{port} "):
            run_server(server, "127.0.0.1", port, drain_timeout=1.0, log_level="critical")
    assert server.scheduler.failed is None
