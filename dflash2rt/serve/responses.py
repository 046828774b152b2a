"""Response bodies in OpenAI's shapes: completions and chat completions, whole or as
server-sent-event chunks, with logprobs and usage; and ``TextStream``, which turns a request's
tokens into text deltas whose concatenation is the whole response's text."""

from __future__ import annotations

import json
import time
from typing import Any, Sequence

from ..engine.output import OutputText
from ..engine.request import RequestOutput, stop_cut

FINISH = {"length": "length", "stop_token": "stop", "stop_string": "stop",
          "constraint": "stop", "constraint_unsatisfiable": "stop"}


def finish_reason(out: RequestOutput) -> str:
    return FINISH[out.finish_reason]


class TextStream:
    """Text deltas of one request as its tokens arrive: the text decoded so far, less what a
    later token could still change (a trailing incomplete UTF-8 sequence, "\\ufffd") or cut (a
    tail that may begin a stop string; text from a stop string on)."""

    def __init__(self, tokenizer: Any, prompt: Sequence[int], stops: Sequence[str],
                 include_stop: bool) -> None:
        self.text_of, self.stops = OutputText(tokenizer, prompt), tuple(stops)
        self.include_stop = include_stop
        self.ids: list[int] = []
        self.sent = ""

    def push(self, ids: Sequence[int]) -> str:
        self.ids.extend(ids)
        text = self.text_of(self.ids)
        cut = stop_cut(text, self.stops, self.include_stop)
        if cut is not None:
            text = text[:cut]
        else:
            text = text.rstrip("\ufffd")
            hold = max((k for s in self.stops for k in range(1, len(s))
                        if text.endswith(s[:k])), default=0)
            text = text[:len(text) - hold]
        return self._delta(text)

    def finish(self, final: str) -> str:
        return self._delta(final)

    def _delta(self, text: str) -> str:
        if not text.startswith(self.sent):
            raise RuntimeError(f"the text decoded so far ({text!r:.60}) does not extend the "
                               f"text already streamed ({self.sent!r:.60})")
        delta, self.sent = text[len(self.sent):], text
        return delta


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def _token(tokenizer: Any, t: int) -> str:
    return tokenizer.decode([t]) if tokenizer is not None else str(t)


def completion_logprobs(tokenizer: Any, ids: Sequence[int], lps: Sequence[float],
                        tops: Sequence[dict[int, float]], offset: int) -> dict[str, Any]:
    """OpenAI's legacy completions logprobs: tokens, token_logprobs, top_logprobs (token
    text → logprob), text_offset (from ``offset``, the text already returned)."""
    tokens = [_token(tokenizer, t) for t in ids]
    offsets, at = [], offset
    for s in tokens:
        offsets.append(at)
        at += len(s)
    return {"tokens": tokens, "token_logprobs": list(lps),
            "top_logprobs": [{_token(tokenizer, k): v for k, v in top.items()} for top in tops],
            "text_offset": offsets}


def chat_logprobs(tokenizer: Any, ids: Sequence[int], lps: Sequence[float],
                  tops: Sequence[dict[int, float]]) -> dict[str, Any]:
    """Chat logprobs: per token {token, logprob, bytes, top_logprobs: [...]}."""
    def entry(t: int, lp: float) -> dict[str, Any]:
        s = _token(tokenizer, t)
        return {"token": s, "logprob": lp, "bytes": list(s.encode("utf-8"))}
    return {"content": [{**entry(t, lp), "top_logprobs": [entry(k, v) for k, v in
                                                          sorted(top.items(),
                                                                 key=lambda kv: -kv[1])]}
                        for t, lp, top in zip(ids, lps, tops)]}


class Shape:
    """The response's envelope: its id, kind ("text_completion" / "chat.completion"), model
    and creation time. A stream's common chunk, text alone, is the envelope's text around
    the index and the text's JSON (``chunk``): the same string ``body`` gives, built without
    a dict a token."""

    def __init__(self, rid: str, chat: bool, model: str) -> None:
        self.id, self.chat, self.model = rid, chat, model
        self.created = int(time.time())
        head = json.dumps({"id": rid, "object": self._object(True), "created": self.created,
                           "model": model}, ensure_ascii=False)
        self._head = f'data: {head[:-1]}, "choices": [{{"index": '
        self._mid = ', "delta": {"content": ' if chat else ', "text": '
        self._tail = ("}" if chat else "") + \
            ', "logprobs": null, "finish_reason": null}], "usage": null}\n\n'

    def _object(self, chunk: bool) -> str:
        if self.chat:
            return "chat.completion.chunk" if chunk else "chat.completion"
        return "text_completion"

    def whole(self, choices: list[dict], use: dict) -> dict:
        return {"id": self.id, "object": self._object(False), "created": self.created,
                "model": self.model, "choices": choices, "usage": use}

    def choice(self, index: int, text: str, reason: str | None, logprobs: Any) -> dict:
        if self.chat:
            return {"index": index, "message": {"role": "assistant", "content": text},
                    "logprobs": logprobs, "finish_reason": reason}
        return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": reason}

    def chunk(self, index: int, text: str | None, reason: str | None, logprobs: Any = None,
              first: bool = False, use: dict | None = None, choices: bool = True) -> str:
        """One server-sent event: ``body``'s, as a string."""
        if text is not None and reason is None and logprobs is None and use is None \
                and choices and not first:
            return f"{self._head}{index}{self._mid}{json.dumps(text, ensure_ascii=False)}" \
                   f"{self._tail}"
        return sse(self.body(index, text, reason, logprobs, first, use, choices))

    def body(self, index: int, text: str | None, reason: str | None, logprobs: Any = None,
             first: bool = False, use: dict | None = None, choices: bool = True) -> dict:
        """A chunk: choice ``index``'s ``text`` (None: none), ``reason`` it finished for,
        ``logprobs``; ``first``: the chat's opening chunk (its role); ``use``: usage;
        ``choices=False``: none (the usage chunk)."""
        if not choices:
            body_choices = []
        elif self.chat:
            delta = ({"role": "assistant", "content": ""} if first else
                     {} if text is None else {"content": text})
            body_choices = [{"index": index, "delta": delta, "logprobs": logprobs,
                             "finish_reason": reason}]
        else:
            body_choices = [{"index": index, "text": text or "", "logprobs": logprobs,
                             "finish_reason": reason}]
        return {"id": self.id, "object": self._object(True), "created": self.created,
                "model": self.model, "choices": body_choices, "usage": use}


def sse(body: Any) -> str:
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


DONE = "data: [DONE]\n\n"
