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
