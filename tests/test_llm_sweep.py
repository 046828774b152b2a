"""``LLM`` (llm.py) against its documented behaviour, for what test_llm.py, test_llm_chat.py and
test_progress.py leave open: a completion says it is finished; no progress bar unless asked
(vLLM's is on by default, dflash2rt's is off), for ``generate`` and ``chat``; a list holding one
conversation is one conversation; the rendered chat prompt is tokenized without the
tokenizer's special tokens (ids written out here from a character tokenizer's alphabet); an
LLM that lacks its engine or its pair refuses to decode as a closed one does."""

from __future__ import annotations

import json
import sys
import types

import pytest
import torch

from dflash2rt import LLM, SamplingParams
from dflash2rt.errors import DFlash2Error

from tiny_models import VOCAB, char_tokenizer_json, save_pair_dir, tiny_pair

MODEL = "stdlib-code"
TEMPLATE = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")
SP = SamplingParams(max_tokens=3)
MSGS = [{"role": "user", "content": "def f(x):"}]
# char_tokenizer_json's alphabet: a character's id is its index; <eos> is VOCAB - 1
ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789 .,:;()=+-*/\n_'\"[]{}<>!?#@"
BOS = VOCAB - 1


@pytest.fixture(scope="module")
def llm():
    with LLM(MODEL, "cpu") as m:
        yield m


class FakeTqdm:
    """Stands in for tqdm.tqdm: records each bar made."""

    made: list["FakeTqdm"] = []

    def __init__(self, *args, **kwargs) -> None:
        FakeTqdm.made.append(self)
        self.n = 0

    def update(self, n=1):
        self.n += n

    def set_postfix_str(self, *args, **kwargs):
        pass

    def close(self):
        pass


@pytest.fixture
def fake_tqdm(monkeypatch):
    mod = types.ModuleType("tqdm")
    mod.tqdm = FakeTqdm
    monkeypatch.setitem(sys.modules, "tqdm", mod)
    FakeTqdm.made = []
    return FakeTqdm


def test_a_completion_says_it_is_finished(llm):
    out = llm.generate(["import os\n"], SP)[0]
    assert out.finished is True and out.outputs[0].finished() is True


def test_generate_makes_no_progress_bar_unless_asked(llm, fake_tqdm):
    llm.generate(["import os\n", "def f(x):"], SP, spec=False)
    assert fake_tqdm.made == []
    llm.generate(["import os\n", "def f(x):"], SP, spec=False, use_tqdm=True)
    assert len(fake_tqdm.made) == 1                   # the stand-in is the one True picks


def test_chat_makes_no_progress_bar_unless_asked(llm, fake_tqdm):
    llm.chat(MSGS, SP, chat_template=TEMPLATE, spec=False)
    assert fake_tqdm.made == []
    llm.chat(MSGS, SP, chat_template=TEMPLATE, spec=False, use_tqdm=True)
    assert len(fake_tqdm.made) == 1


def test_a_list_of_one_conversation_is_one_conversation(llm):
    text = "<user>def f(x):\n<assistant>"
    outs = llm.chat([MSGS], SP, chat_template=TEMPLATE, block_size=4)
    alone = llm.chat(MSGS, SP, chat_template=TEMPLATE, block_size=4)
    assert len(outs) == 1 and outs[0].prompt == text == alone[0].prompt
    assert outs[0].outputs[0].token_ids == alone[0].outputs[0].token_ids
    assert outs[0].prompt_token_ids == alone[0].prompt_token_ids


@pytest.fixture(scope="module")
def bos_model(tmp_path_factory):
    """A tiny pair whose character tokenizer prepends <eos> as a special token."""
    root = save_pair_dir(tmp_path_factory.mktemp("bos"), tiny_pair(dtype=torch.float32))
    tok = json.loads(char_tokenizer_json())
    tok["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<eos>", "type_id": 0}},
                   {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}},
                 {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<eos>": {"id": "<eos>", "ids": [BOS], "tokens": ["<eos>"]}}}
    (root / "target" / "tokenizer.json").write_text(json.dumps(tok))
    return root


def test_chat_tokenizes_the_rendered_prompt_without_special_tokens(bos_model):
    msgs = [{"role": "user", "content": "ab(1)"}]
    text = "<user>ab(1)\n<assistant>"
    with LLM(str(bos_model), "cpu") as m:
        assert m.tokenizer.encode("ab") == [BOS, 0, 1]       # the tokenizer does add one
        out = m.chat(msgs, SP, chat_template=TEMPLATE)[0]
    assert out.prompt == text
    assert out.prompt_token_ids == [ALPHABET.index(c) for c in text]


def test_an_llm_without_its_engine_or_its_pair_refuses_to_decode():
    with LLM(MODEL, "cpu") as m:
        engine, pair = m.engine, m.pair
        for missing in ("engine", "pair"):
            setattr(m, missing, None)
            with pytest.raises(DFlash2Error, match="this LLM is closed"):
                m.generate(["import os\n"], SP)
            with pytest.raises(DFlash2Error, match="this LLM is closed"):
                m.chat(MSGS, SP, chat_template=TEMPLATE)
            m.engine, m.pair = engine, pair
