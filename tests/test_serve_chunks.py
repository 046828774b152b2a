"""What a streamed answer is made of, below HTTP: each chunk's text (``Shape.chunk``, built
around the envelope, against the dict it stands for), the text deltas (``TextStream``:
together, the whole answer's text) and the mailbox an answer reads its events from."""

from __future__ import annotations

import asyncio
import json

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from dflash2rt.bundled import model_dir
from dflash2rt.engine.output import output_text
from dflash2rt.models.tokenizer import TextTokenizer, load_tokenizer
from dflash2rt.serve.jobs import Mailbox
from dflash2rt.serve.responses import Shape, TextStream, sse

names = st.text(max_size=12)


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=40), index=st.integers(0, 1000), chat=st.booleans(),
       rid=names, model=names)
def test_a_text_chunk_is_the_json_of_its_body(text, index, chat, rid, model):
    shape = Shape(rid, chat, model)
    got = shape.chunk(index, text, None)
    assert got == sse(shape.body(index, text, None))
    assert got.startswith("data: ") and got.endswith("\n\n")
    body = json.loads(got[len("data: "):])
    choice = body["choices"][0]
    assert (choice["delta"]["content"] if chat else choice["text"]) == text
    assert (body["id"], body["model"], choice["index"]) == (rid, model, index)
    assert body["object"] == ("chat.completion.chunk" if chat else "text_completion")


@pytest.mark.parametrize("chat", [False, True])
def test_other_chunks_keep_their_fields(chat):
    shape = Shape("x", chat, "m")
    for args, kw in [((0, None, None), {}), ((1, "a", "stop"), {}),
                     ((0, "a", None), {"logprobs": {"content": []}}),
                     ((0, None, None), {"first": True}),
                     ((0, None, None), {"use": {"total_tokens": 3}, "choices": False})]:
        body = json.loads(shape.chunk(*args, **kw)[len("data: "):])
        assert body == shape.body(*args, **kw)
    assert json.loads(shape.chunk(1, "a", "stop")[6:])["choices"][0]["finish_reason"] == "stop"


def _metaspace() -> TextTokenizer:
    """A SentencePiece-like decoder: a "▁" token's space shows only after another token."""
    from tokenizers import Tokenizer, decoders, models

    words = ["<unk>", "▁a", "b", "▁", "é", "▁cd", "\u2581\u2581", "x▁"]
    tok = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)},
                                     unk_token="<unk>"))
    tok.decoder = decoders.Metaspace()
    return TextTokenizer(tok, eos_token_ids=(), bos_token_id=None)


@pytest.fixture(scope="module", params=["bundled", "metaspace"])
def tokenizer(request):
    if request.param == "metaspace":
        return _metaspace()
    return load_tokenizer(model_dir("stdlib-code") / "target")


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_text_deltas_make_the_whole_text(tokenizer, data):
    vocab = tokenizer.vocab_size
    prompt = data.draw(st.lists(st.integers(0, vocab - 1), max_size=6))
    ids = data.draw(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=24))
    cuts = sorted(data.draw(st.sets(st.integers(1, len(ids)), max_size=6)) | {len(ids)})
    stream, text, at = TextStream(tokenizer, prompt, (), False), "", 0
    for cut in cuts:
        text += stream.push(ids[at:cut])
        at = cut
    whole = output_text(tokenizer, prompt, ids)
    assert whole.startswith(text)
    assert text + stream.finish(whole) == whole


def test_the_mailbox_hands_events_over_in_order():
    async def main():
        box = Mailbox()
        box.put(1)
        assert await box.get() == 1
        reader = asyncio.ensure_future(box.get())
        await asyncio.sleep(0)
        assert not reader.done()                     # waits for the next event
        box.put(2)
        box.put(3)
        assert await reader == 2 and await box.get() == 3
        with pytest.raises(asyncio.TimeoutError):      # a reader that gave up loses nothing
            await asyncio.wait_for(box.get(), 0.01)
        box.put(4)
        assert await box.get() == 4
    asyncio.run(main())


class Chars:
    """A tokenizer whose id i is the letter chr(97 + i), decoded one to one."""

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return "".join(chr(97 + i) for i in ids)


def _safe(text: str, stops: list[str], include: bool) -> str:
    """What may stream of ``text`` so far, from the definition: up to the earliest stop string
    in it (ties: the shortest; after it with ``include``), which ends the request; else up to
    the earliest tail that could still become one."""
    full = [(p, len(s)) for p in range(len(text)) for s in stops if text.startswith(s, p)]
    if full:
        p, n = min(full)
        return text[:p + n if include else p]
    tails = [p for p in range(len(text)) for s in stops
             if len(text) - p < len(s) and s.startswith(text[p:])]
    return text[:min(tails, default=len(text))]


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_text_deltas_hold_back_what_a_stop_string_may_still_cut(data):
    ids = data.draw(st.lists(st.integers(0, 2), min_size=1, max_size=16))
    stops = data.draw(st.lists(st.text("abc", min_size=1, max_size=3), min_size=1,
                               max_size=2))
    include = data.draw(st.booleans())
    cuts = sorted(data.draw(st.sets(st.integers(1, len(ids)), max_size=8)) | {len(ids)})
    stream, sent, at = TextStream(Chars(), [], stops, include), "", 0
    for cut in cuts:
        sent += stream.push(ids[at:cut])
        at = cut
        text = Chars().decode(ids[:cut])
        assert sent == _safe(text, stops, include), (ids[:cut], stops)
        if any(s in text for s in stops):
            break                                      # a stop string ends the request


def test_a_stop_strings_first_characters_wait_for_the_next_token():
    stream = TextStream(Chars(), [], ["cd"], False)     # ids: a=0, b=1, c=2, d=3
    assert stream.push([0, 1]) == "ab"                 # nothing held without a stop's start
    assert stream.push([2]) == ""                      # "c" may begin "cd"
    assert stream.push([0]) == "ca"                    # it did not
    assert stream.push([2, 3, 0]) == ""                # "cd": cut there, for good
    assert stream.finish("abca") == ""


def test_logprobs_name_each_token_by_its_text_and_its_offset():
    from dflash2rt.serve.responses import chat_logprobs, completion_logprobs, usage

    class Named:
        def decode(self, ids):
            return "".join(f"t{i}" for i in ids)

    lp = completion_logprobs(Named(), [5, 12, 7], [-0.1, -0.2, -0.3],
                             [{5: -0.1, 6: -2.0}, {12: -0.2}, {7: -0.3}], offset=4)
    assert lp["tokens"] == ["t5", "t12", "t7"]
    assert lp["text_offset"] == [4, 6, 9] and lp["token_logprobs"] == [-0.1, -0.2, -0.3]
    assert lp["top_logprobs"][0] == {"t5": -0.1, "t6": -2.0}
    assert completion_logprobs(None, [5], [-0.5], [{}], 0)["tokens"] == ["5"]
    chat = chat_logprobs(Named(), [5], [-0.1], [{6: -2.0, 5: -0.1, 9: -1.0}])["content"][0]
    assert (chat["token"], chat["logprob"], chat["bytes"]) == ("t5", -0.1, list(b"t5"))
    assert [e["token"] for e in chat["top_logprobs"]] == ["t5", "t9", "t6"]   # most likely first
    assert usage(3, 4) == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}


@pytest.mark.parametrize("chat, whole, chunk", [(True, "chat.completion",
                                                 "chat.completion.chunk"),
                                                (False, "text_completion", "text_completion")])
def test_a_whole_answer_and_its_chunks_name_their_objects(chat, whole, chunk):
    shape = Shape("r", chat, "m")
    assert shape.whole([], usage_of(1, 2))["object"] == whole
    assert shape.body(0, "a", None)["object"] == chunk


def usage_of(p: int, c: int) -> dict:
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}
