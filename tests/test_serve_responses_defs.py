"""Whole answers, their choices and each streamed chunk against OpenAI's shapes written out by
hand from the response documentation, one optional field of a chunk at a time beside a text."""

from __future__ import annotations

import json

import pytest

from dflash2rt.serve.responses import Shape

PREFIX, END = "data: ", "\n\n"


def _read(event: str) -> dict:
    """The JSON object of one server-sent event, checked to be framed as one."""
    assert event.startswith(PREFIX) and event.endswith(END) and event.count(END) == 1
    return json.loads(event[len(PREFIX):-len(END)])


def _chunk_def(shape: Shape, chat: bool, index: int, text, reason, logprobs, first, use,
               choices) -> dict:
    """A streamed chunk by its definition: chat deltas carry the role in the opening chunk,
    nothing when there is no text, else the text; completions carry the text ("" for none);
    the usage chunk has no choices."""
    if not choices:
        body_choices = []
    elif chat:
        if first:
            delta = {"role": "assistant", "content": ""}
        elif text is None:
            delta = {}
        else:
            delta = {"content": text}
        body_choices = [{"index": index, "delta": delta, "logprobs": logprobs,
                         "finish_reason": reason}]
    else:
        body_choices = [{"index": index, "text": "" if text is None else text,
                         "logprobs": logprobs, "finish_reason": reason}]
    return {"id": "cmpl-7", "object": "chat.completion.chunk" if chat else "text_completion",
            "created": shape.created, "model": "m/x", "choices": body_choices, "usage": use}


GOOD = dict(text="a\u00e9\"\n", reason=None, logprobs=None, first=False, use=None, choices=True)
ONE_FIELD = [("plain", {}), ("reason", {"reason": "stop"}), ("reason", {"reason": "length"}),
             ("logprobs", {"logprobs": {"content": []}}), ("first", {"first": True}),
             ("use", {"use": {"prompt_tokens": 2, "completion_tokens": 3,
                              "total_tokens": 5}}),
             ("no choices", {"choices": False}), ("no text", {"text": None}),
             ("empty text", {"text": ""})]


@pytest.mark.parametrize("chat", [False, True])
@pytest.mark.parametrize("what, change", ONE_FIELD, ids=[f"{w}-{i}" for i, (w, _) in
                                                         enumerate(ONE_FIELD)])
def test_each_chunk_field_alone_beside_a_text_is_kept(chat, what, change):
    shape = Shape("cmpl-7", chat, "m/x")
    args = {**GOOD, **change}
    for index in (0, 3):
        got = _read(shape.chunk(index, args["text"], args["reason"], args["logprobs"],
                                args["first"], args["use"], args["choices"]))
        want = _chunk_def(shape, chat, index, **args)
        assert got == want, what
        assert list(got) == ["id", "object", "created", "model", "choices", "usage"]


@pytest.mark.parametrize("chat", [False, True])
def test_each_field_alone_also_from_keywords(chat):
    """The keywords a caller passes one by one, each beside a text and nothing else."""
    shape = Shape("cmpl-7", chat, "m/x")
    use = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
    for kw in ({"first": True}, {"use": use}, {"logprobs": {"tokens": []}},
               {"choices": False}):
        got = _read(shape.chunk(1, "hi", None, **kw))
        want = _chunk_def(shape, chat, 1, **{**GOOD, "text": "hi", **kw})
        assert got == want, kw


def test_a_chat_choice_is_an_assistant_message():
    shape = Shape("chatcmpl-1", True, "m")
    lp = {"content": [{"token": "a", "logprob": -0.5, "bytes": [97], "top_logprobs": []}]}
    assert shape.choice(2, "ab", "stop", lp) == {
        "index": 2, "message": {"role": "assistant", "content": "ab"}, "logprobs": lp,
        "finish_reason": "stop"}
    assert shape.choice(0, "", None, None) == {
        "index": 0, "message": {"role": "assistant", "content": ""}, "logprobs": None,
        "finish_reason": None}


def test_a_completion_choice_is_its_text():
    shape = Shape("cmpl-1", False, "m")
    lp = {"tokens": ["a"], "token_logprobs": [-0.5], "top_logprobs": [{}], "text_offset": [0]}
    assert shape.choice(1, "ab", "length", lp) == {
        "index": 1, "text": "ab", "logprobs": lp, "finish_reason": "length"}
    assert shape.choice(0, "", None, None) == {
        "index": 0, "text": "", "logprobs": None, "finish_reason": None}


@pytest.mark.parametrize("chat, obj", [(True, "chat.completion"), (False, "text_completion")])
def test_a_whole_answer_is_its_envelope_choices_and_usage(chat, obj):
    shape = Shape("r-9", chat, "model/a")
    choices = [shape.choice(0, "x", "stop", None), shape.choice(1, "y", "length", None)]
    use = {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6}
    got = shape.whole(choices, use)
    assert got == {"id": "r-9", "object": obj, "created": shape.created, "model": "model/a",
                   "choices": choices, "usage": use}
    assert isinstance(shape.created, int)
    assert (got["choices"][0]["message"]["role"] == "assistant") if chat else \
        ("message" not in got["choices"][0] and got["choices"][1]["text"] == "y")
