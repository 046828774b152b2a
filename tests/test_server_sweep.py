"""A ``Server``'s answers below HTTP, over a scripted scheduler and a one-letter-per-id
tokenizer: the whole answer and the stream written out field by field (ids, text, finish
reasons, logprobs with their text offsets, usage), what an engine error, an abort, a full
queue and a client that went away turn into, which jobs are cancelled, the metrics a
request's end reports (against a fake clock), and the limits the constructor checks."""

from __future__ import annotations

import asyncio
import json
import types

import pytest

from dflash2rt import get_backend
from dflash2rt.engine.engine import Engine
from dflash2rt.engine.request import RequestOutput, SamplingParams
from dflash2rt.errors import InvalidInputError
from dflash2rt.serve import server as server_mod
from dflash2rt.serve.errors import APIError
from dflash2rt.serve.jobs import Event, Job, Mailbox, Overloaded
from dflash2rt.serve.protocol import Parsed
from dflash2rt.serve.server import Server

from test_serve_chunks import Chars                  # id i decodes to chr(97 + i)
from test_serve_transport import _Loop, _bare_server
from tiny_models import tiny_pair

WAIT_S = 60.0                                          # a bound: the answers take no time


class Script:
    """What an answer uses of the scheduler: ``submit`` refuses with ``refuse``, else hands
    each job the events ``events`` scripts ((prompt index, Event) pairs, in order) on the
    event loop's next turn, as the engine loop does (a job ends before its end is sent);
    ``cancel`` is recorded."""

    def __init__(self, server: Server, events=(), refuse: BaseException | None = None) -> None:
        self.server, self.events, self.refuse = server, list(events), refuse
        self.jobs, self.cancelled = [], []

    def submit(self, jobs: list[Job]) -> None:
        if self.refuse is not None:
            raise self.refuse
        self.jobs = jobs
        self.send(self.events)

    def send(self, events) -> None:
        for i, event in events:
            if event.kind != "tokens":
                self.jobs[i].finished = True
            self.jobs[i].sink(event)
        self.server._flush()

    def cancel(self, job: Job) -> None:
        self.cancelled.append(job)


def _server(events=(), refuse=None, interval: int = 1) -> Server:
    server = _bare_server(interval)
    server.pair = types.SimpleNamespace(tokenizer=Chars())
    server.scheduler = Script(server, events, refuse)
    return server


def _parsed(prompts, stream: bool, logprobs: int | None = None, usage: bool = False,
            stop: tuple[str, ...] = ()) -> Parsed:
    return Parsed([tuple(p) for p in prompts], SamplingParams(max_tokens=8, stop=list(stop)),
                  stream, usage, logprobs, "m")


def _out(prompt, ids, reason: str, lp: bool = False) -> RequestOutput:
    return RequestOutput(tuple(prompt), list(ids), Chars().decode(ids), reason,
                         [-0.25 * (t + 1) for t in ids] if lp else None,
                         [{t: -0.25 * (t + 1)} for t in ids] if lp else None)


async def _never() -> bool:
    return False


def _answer(server: Server, p: Parsed, chat: bool, disconnected=_never):
    """``_serve``'s answer: the dict of a whole one, or a stream's events as (JSON) bodies
    and "[DONE]", in order."""
    async def main():
        out = await server._serve(p, chat, disconnected, 0.0)
        if isinstance(out, dict):
            return out
        return [e async for e in out]
    got = asyncio.run(asyncio.wait_for(main(), WAIT_S))
    if isinstance(got, dict):
        return got
    assert all(e.startswith("data: ") and e.endswith("\n\n") for e in got)
    return [e[6:-2] if e[6:-2] == "[DONE]" else json.loads(e[6:-2]) for e in got]


def _plain(body: dict) -> dict:
    """A body without what differs between answers (its random id and its clock time)."""
    return {k: v for k, v in body.items() if k not in ("id", "created")}


def test_a_whole_completion_of_two_prompts_field_by_field():
    """Their ends arrive out of order and token events come too: each choice stands at its
    prompt's index with its text, reason and logprobs (text offsets from 0); usage sums
    both; no finished job is cancelled."""
    a, b = (1, 2), (3,)
    server = _server([(0, Event("tokens", [0, 1])), (1, Event("done", output=_out(b, [2],
                                                                                  "stop_token",
                                                                                  True))),
                      (0, Event("done", output=_out(a, [0, 1], "length", True)))])
    got = _answer(server, _parsed([a, b], False, logprobs=1), False)
    assert got["id"].startswith("cmpl-") and len(got["id"]) == len("cmpl-") + 32
    assert _plain(got) == {"object": "text_completion", "model": "m", "choices": [
        {"index": 0, "text": "ab", "finish_reason": "length",
         "logprobs": {"tokens": ["a", "b"], "token_logprobs": [-0.25, -0.5],
                      "top_logprobs": [{"a": -0.25}, {"b": -0.5}], "text_offset": [0, 1]}},
        {"index": 1, "text": "c", "finish_reason": "stop",
         "logprobs": {"tokens": ["c"], "token_logprobs": [-0.75],
                      "top_logprobs": [{"c": -0.75}], "text_offset": [0]}}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}}
    assert server.scheduler.cancelled == []


def test_a_whole_chat_answer_without_and_with_logprobs():
    prompt = (4, 5)
    for logprobs in (None, 0):
        server = _server([(0, Event("done", output=_out(prompt, [3, 0], "stop_string",
                                                        True)))])
        got = _answer(server, _parsed([prompt], False, logprobs=logprobs), True)
        assert got["id"].startswith("chatcmpl-")
        lp = None if logprobs is None else {"content": [
            {"token": "d", "logprob": -1.0, "bytes": [100],
             "top_logprobs": [{"token": "d", "logprob": -1.0, "bytes": [100]}]},
            {"token": "a", "logprob": -0.25, "bytes": [97],
             "top_logprobs": [{"token": "a", "logprob": -0.25, "bytes": [97]}]}]}
        assert _plain(got) == {"object": "chat.completion", "model": "m", "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "da"}, "logprobs": lp,
             "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4}}


def test_a_streamed_completion_chunk_by_chunk_with_usage():
    """Tokens as they come; a token a stop string may still need sends nothing until the
    next decides; the end's chunk carries the rest and the reason; the usage chunk has no
    choice and counts every prompt token and every token made; then [DONE]."""
    prompt = (1, 2, 3)
    server = _server([(0, Event("tokens", [0])), (0, Event("tokens", [2])),
                      (0, Event("tokens", [1, 4])),
                      (0, Event("done", output=_out(prompt, [0, 2, 1, 4], "length")))])
    got = _answer(server, _parsed([prompt], True, usage=True, stop=("cd",)), False)
    assert got[-1] == "[DONE]"
    body = {"object": "text_completion", "model": "m", "usage": None}
    choice = {"index": 0, "logprobs": None, "finish_reason": None}
    assert [_plain(c) for c in got[:-1]] == [
        {**body, "choices": [{**choice, "text": "a"}]},
        {**body, "choices": [{**choice, "text": "cbe"}]},
        {**body, "choices": [{**choice, "text": "", "finish_reason": "length"}]},
        {**body, "choices": [],
         "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}}]
    assert len({c["id"] for c in got[:-1]}) == 1


def test_a_streamed_completion_of_two_prompts_ends_after_both():
    a, b = (1,), (2, 3)
    server = _server([(1, Event("tokens", [5])), (0, Event("tokens", [6])),
                      (1, Event("done", output=_out(b, [5], "stop_token"))),
                      (0, Event("tokens", [7])),
                      (0, Event("done", output=_out(a, [6, 7], "length")))])
    got = _answer(server, _parsed([a, b], True, usage=True), False)
    assert [(c["choices"][0]["index"], c["choices"][0]["text"],
             c["choices"][0]["finish_reason"]) for c in got[:-2]] == [
        (1, "f", None), (0, "g", None), (1, "", "stop"), (0, "h", None), (0, "", "length")]
    assert got[-2]["usage"] == {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}
    assert got[-1] == "[DONE]" and server.scheduler.cancelled == []


def test_streamed_logprobs_carry_their_text_offsets():
    prompt = (1,)
    server = _server([(0, Event("tokens", [0], [-0.25], [{0: -0.25}])),
                      (0, Event("tokens", [1, 2], [-0.5, -0.75], [{1: -0.5}, {2: -0.75}])),
                      (0, Event("done", output=_out(prompt, [0, 1, 2], "length", True)))])
    got = _answer(server, _parsed([prompt], True, logprobs=0), False)
    assert [c["choices"][0]["logprobs"] for c in got[:2]] == [
        {"tokens": ["a"], "token_logprobs": [-0.25], "top_logprobs": [{"a": -0.25}],
         "text_offset": [0]},
        {"tokens": ["b", "c"], "token_logprobs": [-0.5, -0.75],
         "top_logprobs": [{"b": -0.5}, {"c": -0.75}], "text_offset": [1, 2]}]
    assert [c["choices"][0]["text"] for c in got[:3]] == ["a", "bc", ""]
    assert got[3] == "[DONE]" and len(got) == 4           # no usage asked: none sent


def test_a_streamed_chat_opens_with_the_role_and_sends_logprobs_of_held_tokens():
    """The first chunk names the role; a token whose text a stop string holds back still
    sends its logprobs (with no text)."""
    prompt = (1,)
    server = _server([(0, Event("tokens", [2], [-0.5], [{2: -0.5}])),
                      (0, Event("done", output=_out(prompt, [2], "length", True)))])
    got = _answer(server, _parsed([prompt], True, logprobs=0, stop=("cd",)), True)
    body = {"object": "chat.completion.chunk", "model": "m", "usage": None}
    entry = {"token": "c", "logprob": -0.5, "bytes": [99]}
    assert [_plain(c) for c in got[:-1]] == [
        {**body, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                              "logprobs": None, "finish_reason": None}]},
        {**body, "choices": [{"index": 0, "delta": {"content": ""},
                              "logprobs": {"content": [{**entry, "top_logprobs": [entry]}]},
                              "finish_reason": None}]},
        {**body, "choices": [{"index": 0, "delta": {"content": "c"}, "logprobs": None,
                              "finish_reason": "length"}]}]
    assert got[-1] == "[DONE]"


@pytest.mark.parametrize("stream", [False, True])
def test_an_engine_error_and_an_abort_as_answers(stream):
    """An engine error: 500 "engine_error" naming it; an abort (shutdown): 503 "aborted"
    with Retry-After 1. A stream sends the error's body as its last event, without
    [DONE]."""
    cases = [(Event("error", error=ValueError("bad row")), 500, "engine_error",
              "decoding failed: ValueError: bad row", {}),
             (Event("aborted"), 503, "aborted",
              "the request was aborted: the server is shutting down", {"Retry-After": "1"})]
    for end, status, code, message, headers in cases:
        server = _server([(0, Event("tokens", [0])), (0, end)])
        p = _parsed([(1,)], stream)
        if stream:
            got = _answer(server, p, False)
            assert got[-1] == {"error": {"message": message, "type": "server_error",
                                         "param": None, "code": code}}
            assert [c["choices"][0]["text"] for c in got[:-1]] == ["a"]
        else:
            with pytest.raises(APIError) as info:
                _answer(server, p, False)
            e = info.value
            assert (e.status, e.code, e.message, e.headers) == (status, code, message, headers)


def test_a_full_queue_is_a_503_with_retry_after_and_a_refused_prompt_a_400():
    server = _server(refuse=Overloaded("the queue is full"))
    with pytest.raises(APIError) as info:
        _answer(server, _parsed([(1,)], False), False)
    e = info.value
    assert (e.status, e.message, e.code, e.headers) == (
        503, "the queue is full; retry after 1 s", "server_overloaded", {"Retry-After": "1"})
    server = _server(refuse=InvalidInputError("prompt too long"))
    with pytest.raises(APIError) as info:
        _answer(server, _parsed([(1,)], True), False)
    assert (info.value.status, info.value.param, info.value.message) == (
        400, "prompt", "prompt too long")


def test_a_client_that_went_away_is_a_499_and_its_jobs_are_cancelled(monkeypatch):
    """A whole answer looks at its client each poll: gone, its unfinished jobs are
    cancelled (a finished one is not); still there, it goes on waiting."""
    monkeypatch.setattr(server_mod, "POLL_S", 0.01)
    a, b = (1,), (2,)
    server = _server([(1, Event("done", output=_out(b, [0], "length")))])
    asked = []

    async def gone() -> bool:
        asked.append(1)
        return True
    with pytest.raises(APIError) as info:
        _answer(server, _parsed([a, b], False), False, gone)
    assert (info.value.status, info.value.message) == (499, "the client disconnected")
    jobs = server.scheduler.jobs
    assert asked == [1] and {id(j) for j in server.scheduler.cancelled} == {id(jobs[0])}

    server = _server()

    async def there() -> bool:
        if not asked:
            server.scheduler.send([(0, Event("done", output=_out(a, [1], "length")))])
        asked.append(1)
        return False
    asked.clear()
    got = _answer(server, _parsed([a], False), False, there)
    assert got["choices"][0]["text"] == "b" and asked and server.scheduler.cancelled == []


def test_a_stream_left_early_cancels_its_unfinished_jobs():
    a, b = (1,), (2,)
    server = _server([(0, Event("tokens", [0])),
                      (1, Event("done", output=_out(b, [1], "length")))])

    async def main():
        stream = await server._serve(_parsed([a, b], True), False, _never, 0.0)
        first = await stream.__anext__()
        await stream.aclose()
        return first
    first = asyncio.run(asyncio.wait_for(main(), WAIT_S))
    assert json.loads(first[6:])["choices"][0]["text"] == "a"
    jobs = server.scheduler.jobs
    assert [id(j) for j in server.scheduler.cancelled] == [id(jobs[0])]


class Finished:
    def __init__(self) -> None:
        self.calls = []

    def __call__(self, *args) -> None:
        self.calls.append(args)


def test_a_requests_end_reports_its_reason_tokens_and_seconds(monkeypatch):
    """(reason, prompt tokens, tokens made, seconds to the first token or None, seconds to
    the end), from the job's arrival, by the server's clock."""
    monkeypatch.setattr(server_mod, "time", types.SimpleNamespace(monotonic=lambda: 20.0))
    cases = [(Event("done", output=_out((1, 2), [0, 1, 2], "stop_string")), 12.5,
              ("stop", 2, 3, 2.5, 10.0)),
             (Event("done", output=_out((1, 2), [0], "length")), 11.0,
              ("length", 2, 1, 1.0, 10.0)),
             (Event("aborted"), None, ("abort", 2, 0, None, 10.0))]
    for end, first, want in cases:
        for streamed in (True, False):
            server = _bare_server(1)
            server.metrics = types.SimpleNamespace(finished=Finished())
            job = Job(types.SimpleNamespace(prompt_ids=(1, 2)), None, arrival=10.0,
                      first_token=first, streamed=streamed)
            server._sink(_Loop(), Mailbox(), 0, job, Event("tokens", [0]))
            server._sink(_Loop(), Mailbox(), 0, job, end)
            assert server.metrics.finished.calls == [want]


@pytest.fixture(scope="module")
def engine():
    return Engine(tiny_pair("dflash2", block=4, seed=4), get_backend("cpu"))


def test_the_constructor_checks_the_model_length_and_the_stream_interval(engine):
    limit = engine.pair.target.cfg.max_position_embeddings
    for length in (2, limit):
        server = Server(engine, ("a", "b"), 4, 1, length, 0, None)
        assert server.stream_interval == 1 and server.limits.max_model_len == length
    for length in (1, limit + 1):
        with pytest.raises(InvalidInputError, match=f"max_model_len must lie in \\[2, {limit}\\]"
                                                    f" .*got {length}$"):
            Server(engine, ("a",), 4, 1, length, 0, None)
    assert Server(engine, ("a",), 4, 1, 64, 0, None, stream_interval=2).stream_interval == 2
    with pytest.raises(InvalidInputError, match="stream_interval must be >= 1, got 0"):
        Server(engine, ("a",), 4, 1, 64, 0, None, stream_interval=0)


def test_the_metrics_are_labelled_with_the_first_name(engine):
    text = Server(engine, ("first", "second"), 4, 1, 64, 0, None).metrics_text()
    assert 'model_name="first"' in text and 'model_name="second"' not in text
