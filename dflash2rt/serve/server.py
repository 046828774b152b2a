"""What serves a parsed request: its jobs into the engine loop, their events back on the event
loop, and the answer, whole or streamed. One ``Server`` per model: the Engine's scheduler, the
limits requests are checked against, the chat template and the metrics."""

from __future__ import annotations

import asyncio
import functools
import threading
import time
import uuid
from typing import Any, AsyncIterator

from ..engine.engine import Engine
from ..engine.request import Request
from ..errors import DFlash2Error, InvalidInputError
from . import parse, responses
from .chat import ChatTemplate
from .errors import APIError, bad, overloaded
from .metrics import ServerMetrics
from .protocol import Limits, Parsed
from .responses import DONE, Shape, TextStream, finish_reason, sse, usage
from .jobs import Event, Job, Mailbox, Overloaded, merged
from .scheduler import Scheduler

RETRY_AFTER = 1           # seconds a refused client is told to wait
POLL_S = 0.5              # how often a waiting non-streamed request checks its client


class Server:
    """``names``: the model names requests may give (the first is the one listed);
    ``block``: the fixed block of every step (1: target-only; None: adaptive); ``slots``,
    ``max_model_len``, ``max_queue``: ``Scheduler``'s; ``template``: the chat template (None:
    no chat); ``api_key``: what the /v1 routes require (None: nothing); ``stream_interval``:
    tokens a request's events gather before they go out (1: each step's at once; a request's
    first tokens and its end go out at once whatever it is), as vLLM's and SGLang's
    ``--stream-interval``: fewer chunks, less host time per token."""

    def __init__(self, engine: Engine, names: tuple[str, ...], block: int | None, slots: int,
                 max_model_len: int, max_queue: int, template: ChatTemplate | None,
                 api_key: str | None = None, stream_interval: int = 1) -> None:
        pair = engine.pair
        if stream_interval < 1:
            raise InvalidInputError(f"stream_interval must be >= 1, got {stream_interval}")
        self.stream_interval = stream_interval
        limit = pair.target.cfg.max_position_embeddings
        if not 2 <= max_model_len <= limit:
            raise InvalidInputError(f"max_model_len must lie in [2, {limit}] (the target's "
                                    f"max_position_embeddings), got {max_model_len}")
        self.engine, self.pair, self.template, self.api_key = engine, pair, template, api_key
        self.scheduler = Scheduler(engine, block, slots, max_model_len, max_queue)
        self._outbox: dict[asyncio.AbstractEventLoop, list] = {}
        self._outbox_lock = threading.Lock()
        self.scheduler.after_turn = self._flush
        self.limits = Limits(names, max_model_len, block, pair.target.cfg.vocab_size,
                             functools.lru_cache(maxsize=64)(self._regex))
        labels = {"model_name": names[0]}
        self.metrics = ServerMetrics(labels)

    def _regex(self, pattern: str) -> Any:
        from ..api import regex_constraint

        return regex_constraint(self.pair, pattern)

    def start(self) -> None:
        self.scheduler.start()

    def close(self, timeout: float) -> None:
        self.scheduler.close(timeout)

    def metrics_text(self) -> str:
        s = self.scheduler
        return self.metrics.text(s.stats, s.running, s.waiting)

    # ---- a request ---------------------------------------------------------------------------
    async def completion(self, body: Any, disconnected) -> Any:
        arrival = time.monotonic()
        p = await asyncio.to_thread(parse.completion, body, self.limits, self.pair.tokenizer)
        return await self._serve(p, False, disconnected, arrival)

    async def chat(self, body: Any, disconnected) -> Any:
        arrival = time.monotonic()
        p = await asyncio.to_thread(parse.chat, body, self.limits, self.pair.tokenizer,
                                    self.template)
        return await self._serve(p, True, disconnected, arrival)

    async def _serve(self, p: Parsed, chat: bool, disconnected, arrival: float) -> Any:
        """Queue one job per prompt → the whole answer (a dict), or an async iterator of
        server-sent events for a streamed one. ``arrival``: when the body was read (the
        latencies in /metrics count from there)."""
        loop, queue = asyncio.get_running_loop(), Mailbox()
        jobs = []
        for i, prompt in enumerate(p.prompts):
            job = Job(Request(prompt, p.params), lambda e: None, arrival=arrival,
                      streamed=p.stream)
            job.sink = functools.partial(self._sink, loop, queue, i, job)
            jobs.append(job)
        try:
            self.scheduler.submit(jobs)             # checks each request before queueing it
        except Overloaded as exc:
            raise overloaded(str(exc), RETRY_AFTER) from exc
        except DFlash2Error as exc:
            raise bad("prompt", str(exc)) from exc
        shape = Shape(("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex, chat, p.model)
        if p.stream:
            return self._stream(p, jobs, queue, shape)
        try:
            return await self._whole(p, jobs, queue, shape, disconnected)
        finally:
            self._cancel_unfinished(jobs)

    def _sink(self, loop: asyncio.AbstractEventLoop, queue: Mailbox, i: int, job: Job,
              event: Event) -> None:
        """On the engine thread: count a request's end; the event waits in the outbox for the
        loop's turn to end (``_flush``), tokens until ``stream_interval`` of them gather (held
        ones go out before the request's end). A whole answer's tokens stay here: its end
        carries them all."""
        if event.kind == "tokens":
            if not job.streamed:
                return
            if job.held is not None:
                event, job.held = merged(job.held, event), None
            if job.shown and len(event.tokens) < self.stream_interval:
                job.held = event
                return
            job.shown = True
        elif job.held is not None:
            self._post(loop, queue, i, job.held)
            job.held = None
        if event.kind in ("done", "aborted"):
            out = event.output
            reason = "abort" if out is None else finish_reason(out)
            first = job.first_token
            self.metrics.finished(reason, len(job.request.prompt_ids),
                                  0 if out is None else len(out.token_ids),
                                  None if first is None else first - job.arrival,
                                  time.monotonic() - job.arrival)
        self._post(loop, queue, i, event)

    def _post(self, loop: asyncio.AbstractEventLoop, queue: Mailbox, i: int,
              event: Event) -> None:
        with self._outbox_lock:
            self._outbox.setdefault(loop, []).append((queue, (i, event)))

    def _flush(self) -> None:
        """On the engine thread, at the end of each turn of its loop: every event of the turn
        to its event loop in one call, so a step wakes the HTTP side once, not once a row."""
        with self._outbox_lock:
            boxes, self._outbox = self._outbox, {}
        for loop, items in boxes.items():
            try:
                loop.call_soon_threadsafe(_deliver, items)
            except RuntimeError:
                pass        # the event loop has closed (shutdown): nobody is waiting any more

    def _cancel_unfinished(self, jobs: list[Job]) -> None:
        for job in jobs:
            if not job.finished:
                self.scheduler.cancel(job)

    async def _next(self, queue: Mailbox) -> tuple[int, Event]:
        i, event = await queue.get()
        if event.kind == "error":
            raise APIError(500, f"decoding failed: {type(event.error).__name__}: "
                                f"{event.error}", None, "engine_error")
        if event.kind == "aborted":
            raise APIError(503, "the request was aborted: the server is shutting down", None,
                           "aborted", {"Retry-After": str(RETRY_AFTER)})
        return i, event

    async def _whole(self, p: Parsed, jobs: list[Job], queue: Mailbox, shape: Shape,
                     disconnected) -> dict:
        outs: list[Any] = [None] * len(jobs)
        while any(o is None for o in outs):
            try:
                i, event = await asyncio.wait_for(self._next(queue), POLL_S)
            except asyncio.TimeoutError:
                if await disconnected():
                    self._cancel_unfinished(jobs)
                    raise APIError(499, "the client disconnected") from None
                continue
            if event.kind == "done":
                outs[i] = event.output
        tok = self.pair.tokenizer
        choices = []
        for i, o in enumerate(outs):
            lp = None
            if p.logprobs is not None:
                lp = (responses.chat_logprobs(tok, o.token_ids, o.logprobs, o.top_logprobs)
                      if shape.chat else
                      responses.completion_logprobs(tok, o.token_ids, o.logprobs,
                                                    o.top_logprobs, 0))
            choices.append(shape.choice(i, o.text, finish_reason(o), lp))
        return shape.whole(choices, usage(sum(len(o.prompt_ids) for o in outs),
                                          sum(len(o.token_ids) for o in outs)))

    async def _stream(self, p: Parsed, jobs: list[Job], queue: Mailbox,
                      shape: Shape) -> AsyncIterator[str]:
        tok = self.pair.tokenizer
        streams = [TextStream(tok, j.request.prompt_ids, p.params.stop,
                              p.params.include_stop_str_in_output) for j in jobs]
        done, made = 0, 0
        try:
            if shape.chat:
                yield shape.chunk(0, None, None, first=True)
            while done < len(jobs):
                try:
                    i, event = await self._next(queue)
                except APIError as exc:
                    yield sse(exc.body())
                    return
                if event.kind == "tokens":
                    offset = len(streams[i].sent)
                    delta = streams[i].push(event.tokens)
                    lp = None if p.logprobs is None else (
                        responses.chat_logprobs(tok, event.tokens, event.logprobs,
                                                event.top_logprobs) if shape.chat else
                        responses.completion_logprobs(tok, event.tokens, event.logprobs,
                                                      event.top_logprobs, offset))
                    if delta or lp is not None:
                        yield shape.chunk(i, delta, None, lp)
                else:
                    o = event.output
                    done, made = done + 1, made + len(o.token_ids)
                    yield shape.chunk(i, streams[i].finish(o.text), finish_reason(o))
            if p.include_usage:
                yield shape.chunk(0, None, None, use=usage(
                    sum(len(j.request.prompt_ids) for j in jobs), made), choices=False)
            yield DONE
        finally:
            self._cancel_unfinished(jobs)


def _deliver(items: list[tuple[Mailbox, Any]]) -> None:
    for queue, item in items:
        queue.put(item)
