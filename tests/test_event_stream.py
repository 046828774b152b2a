"""``EventStream``, the streamed answer's ASGI response: every event the answer yields goes out
as it comes, then the body's end; a client that goes away ends the answer at once (its
``finally`` runs: the server cancels its requests there) and ends the response quietly; a
cancellation that is not the client's goes on up; the client going away after the end
changes nothing."""

from __future__ import annotations

import asyncio

import pytest

from dflash2rt.serve.app import EventStream


class Answer:
    """An answer's events: ``texts``, then (``hang``) waiting forever, as an answer whose next
    tokens have not come; ``closed``: its ``finally`` ran."""

    def __init__(self, texts: list[str], hang: bool = False) -> None:
        self.texts, self.hang, self.closed = texts, hang, False
        self.yielded = asyncio.Event()

    async def events(self):
        try:
            for t in self.texts:
                yield t
            self.yielded.set()
            if self.hang:
                await asyncio.Event().wait()
        finally:
            self.closed = True


def _wire(disconnect: asyncio.Event):
    sent = []

    async def receive() -> dict:
        await disconnect.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)
    return receive, send, sent


def _bodies(sent: list[dict]) -> list[bytes]:
    return [m["body"] for m in sent if m["type"] == "http.response.body"]


def test_each_event_goes_out_in_order_then_the_end():
    async def go():
        gone = asyncio.Event()
        receive, send, sent = _wire(gone)
        answer = Answer(["data: a\n\n", "data: é\n\n"])
        await EventStream(answer.events())({}, receive, send)
        gone.set()                               # the client leaves after the end: nothing
        await asyncio.sleep(0)
        return sent, answer
    sent, answer = asyncio.run(go())
    start = sent[0]
    assert start["type"] == "http.response.start" and start["status"] == 200
    assert dict(start["headers"])[b"content-type"].startswith(b"text/event-stream")
    assert _bodies(sent) == [b"data: a\n\n", "data: é\n\n".encode(), b""]
    assert [m["more_body"] for m in sent[1:]] == [True, True, False] and answer.closed


def test_a_client_that_goes_away_ends_the_answer_at_once_and_quietly():
    async def go():
        gone = asyncio.Event()
        receive, send, sent = _wire(gone)
        answer = Answer(["data: a\n\n"], hang=True)
        task = asyncio.ensure_future(EventStream(answer.events())({}, receive, send))
        await answer.yielded.wait()
        gone.set()
        await asyncio.wait_for(task, 10)         # returns, without raising
        return sent, answer, task
    sent, answer, task = asyncio.run(go())
    assert answer.closed and not task.cancelled()
    assert _bodies(sent) == [b"data: a\n\n"]     # no end: the client is gone


def test_a_cancellation_that_is_not_the_clients_goes_on_up():
    async def go():
        receive, send, sent = _wire(asyncio.Event())
        answer = Answer([], hang=True)
        task = asyncio.ensure_future(EventStream(answer.events())({}, receive, send))
        await answer.yielded.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return answer
    assert asyncio.run(go()).closed


def test_the_start_goes_through_the_stack_and_the_body_to_the_gates_send():
    from dflash2rt.serve.app import DIRECT_SEND

    async def go():
        receive, send, through = _wire(asyncio.Event())
        _, direct, straight = _wire(asyncio.Event())
        answer = Answer(["data: a\n\n", "data: b\n\n"])
        await EventStream(answer.events())({DIRECT_SEND: direct}, receive, send)
        return through, straight
    through, straight = asyncio.run(go())
    assert [m["type"] for m in through] == ["http.response.start"]
    assert _bodies(straight) == [b"data: a\n\n", b"data: b\n\n", b""]
