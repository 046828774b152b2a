"""What the engine loop and the HTTP side exchange: a ``Job`` (one request, where its events
go, whether it was cancelled or has finished) and its ``Event``s; the ``Mailbox`` an answer
reads them from; ``Overloaded`` when the queue cannot take more."""

from __future__ import annotations

import asyncio
import collections
import time
from dataclasses import dataclass, field
from typing import Callable

from ..engine.output import Collector
from ..engine.request import Request, RequestOutput


class Overloaded(Exception):
    """The queue is full (or the server is shutting down): retry after a while."""


@dataclass(frozen=True)
class Event:
    """What a request's sink receives: ``kind`` "tokens" (``tokens`` and, if asked, their
    ``logprobs`` / ``top_logprobs``), "done" (``output``), "aborted" or "error" (``error``)."""

    kind: str
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] | None = None
    top_logprobs: list[dict[int, float]] | None = None
    output: RequestOutput | None = None
    error: BaseException | None = None


@dataclass(eq=False)
class Job:
    """One request in the server: the engine request, where its events go, and its state."""

    request: Request
    sink: Callable[[Event], None]
    cancelled: bool = False
    finished: bool = False
    collector: Collector | None = None
    arrival: float = field(default_factory=time.monotonic)
    first_token: float | None = None
    held: Event | None = None         # tokens the stream interval holds back (engine thread)
    shown: bool = False               # its first tokens have gone out
    streamed: bool = True             # False: a whole answer, which waits for its end only


def merged(a: Event, b: Event) -> Event:
    """Two "tokens" events of one request as one, in order."""
    cat = lambda x, y: None if x is None else x + y      # noqa: E731 - both or neither
    return Event("tokens", a.tokens + b.tokens, cat(a.logprobs, b.logprobs),
                 cat(a.top_logprobs, b.top_logprobs))


class Mailbox:
    """One answer's events on its event loop, in order: ``put`` by the loop's delivery
    callback, ``get`` awaited by the answer (one reader). An ``asyncio.Queue`` without what
    one reader does not need (bounds, task counting, waiting putters)."""

    __slots__ = ("items", "waiter")

    def __init__(self) -> None:
        self.items: collections.deque = collections.deque()
        self.waiter: asyncio.Future | None = None

    def put(self, item) -> None:
        self.items.append(item)
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def get(self):
        while not self.items:
            self.waiter = asyncio.get_running_loop().create_future()
            await self.waiter
        return self.items.popleft()
