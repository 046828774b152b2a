"""``LLM.chat`` against the prompt rendered by hand: each conversation's output equals
``generate`` on the template's text written out here, tokenized without special tokens."""

from __future__ import annotations

import json
import shutil

import pytest

from dflash2rt import LLM, SamplingParams
from dflash2rt.bundled import bundled_path
from dflash2rt.errors import DFlash2Error, InvalidInputError

TEMPLATE = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")
SP = SamplingParams(max_tokens=8)


def by_hand(messages, add_generation_prompt=True) -> str:
    text = "".join(f"<{m['role']}>{m['content']}\n" for m in messages)
    return text + ("<assistant>" if add_generation_prompt else "")


@pytest.fixture(scope="module")
def llm():
    with LLM("stdlib-code", backend="cpu") as m:
        yield m


def expect(llm, text, sp=SP, **kw):
    ids = llm.tokenizer.encode(text, add_special_tokens=False)
    return llm.generate([ids], sp, **kw)[0]


def test_one_conversation_is_the_rendered_prompt_decoded(llm):
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "def f(x):"}]
    out = llm.chat(msgs, SP, chat_template=TEMPLATE)
    ref = expect(llm, by_hand(msgs))
    assert len(out) == 1 and out[0].prompt == by_hand(msgs)
    assert out[0].prompt_token_ids == ref.prompt_token_ids
    assert out[0].outputs[0].token_ids == ref.outputs[0].token_ids
    assert out[0].outputs[0].text == ref.outputs[0].text


def test_many_conversations_keep_their_order_and_their_own_params(llm):
    convs = [[{"role": "user", "content": "import os"}],
             [{"role": "user", "content": [{"type": "text", "text": "class "},
                                           {"type": "text", "text": "A:"}]}],
             ({"role": "user", "content": "x = 1"}, {"role": "assistant", "content": "y"})]
    sps = [SP, SamplingParams(max_tokens=5, temperature=1.0, seed=3),
           SamplingParams(max_tokens=3)]
    outs = llm.chat(convs, sps, chat_template=TEMPLATE, block_size=8)
    texts = [by_hand(convs[0]), by_hand([{"role": "user", "content": "class A:"}]),
             by_hand(list(convs[2]))]
    assert [o.prompt for o in outs] == texts
    for o, t, sp in zip(outs, texts, sps):       # a fixed block: each alone gives the same
        assert o.outputs[0].token_ids == expect(llm, t, sp, block_size=8).outputs[0].token_ids
    assert [len(o.outputs[0].token_ids) for o in outs] == [8, 5, 3]


def test_seeded_sampling_matches_generate_at_a_fixed_block(llm):
    msgs = [{"role": "user", "content": "def g():"}]
    sp = SamplingParams(max_tokens=10, temperature=1.0, seed=11)
    out = llm.chat(msgs, sp, chat_template=TEMPLATE, block_size=4)
    assert out[0].outputs[0].token_ids == expect(llm, by_hand(msgs), sp,
                                                 block_size=4).outputs[0].token_ids


def test_add_generation_prompt_false_renders_without_it(llm):
    msgs = [{"role": "user", "content": "for i in"}]
    out = llm.chat(msgs, SP, chat_template=TEMPLATE, add_generation_prompt=False)
    assert out[0].prompt == by_hand(msgs, False)
    assert out[0].outputs[0].token_ids == expect(llm, by_hand(msgs, False)).outputs[0].token_ids


def test_the_models_own_template_and_a_template_file(tmp_path):
    model = tmp_path / "pair"
    shutil.copytree(bundled_path("stdlib-code"), model)
    cfg = model / "target" / "tokenizer_config.json"
    data = json.loads(cfg.read_text())
    data["chat_template"] = TEMPLATE
    cfg.write_text(json.dumps(data))
    msgs = [{"role": "user", "content": "while"}]
    file = tmp_path / "t.jinja"
    file.write_text(TEMPLATE.replace("<assistant>", "<bot>"))
    with LLM(str(model), backend="cpu") as llm:
        assert llm.chat(msgs, SP)[0].prompt == by_hand(msgs)
        assert llm.chat(msgs, SP, chat_template=str(file))[0].prompt == \
            by_hand(msgs, False) + "<bot>"


@pytest.mark.parametrize("messages, match", [
    ([], "messages must be a non-empty list"),
    ("hi", "messages must be a non-empty list"),
    ([{"role": "robot", "content": "x"}], r"messages\[0\].role must be one of"),
    ([{"role": "user"}], r"messages\[0\].content must be a string"),
    ([{"role": "user", "content": 3}], r"messages\[0\].content must be a string"),
    ([{"role": "user", "content": "x", "extra": 1}], r"messages\[0\] must be an object"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": "u"}]}],
     "content parts must be"),
    ([[{"role": "user", "content": "a"}], []], "conversation 1: messages must be a non-empty"),
])
def test_bad_messages_are_typed_errors_naming_the_field(llm, messages, match):
    with pytest.raises(InvalidInputError, match=match):
        llm.chat(messages, SP, chat_template=TEMPLATE)


def test_templates_and_arguments_outside_their_domain(llm):
    msgs = [{"role": "user", "content": "x"}]
    with pytest.raises(InvalidInputError, match="this model has no chat template"):
        llm.chat(msgs, SP)
    with pytest.raises(InvalidInputError, match="neither a file nor a Jinja template"):
        llm.chat(msgs, SP, chat_template="no-such-file.jinja")
    with pytest.raises(InvalidInputError, match="does not compile"):
        llm.chat(msgs, SP, chat_template="{% for %}")
    with pytest.raises(InvalidInputError, match="refused the messages: no system"):
        llm.chat(msgs, SP, chat_template="{{ raise_exception('no system') }}")
    with pytest.raises(InvalidInputError, match="rendered the messages to no tokens"):
        llm.chat(msgs, SP, chat_template="{% if false %}{{ messages }}{% endif %}")
    with pytest.raises(InvalidInputError, match="chat_template must be a template or a file"):
        llm.chat(msgs, SP, chat_template=3)
    with pytest.raises(InvalidInputError, match="add_generation_prompt must be True or False"):
        llm.chat(msgs, SP, chat_template=TEMPLATE, add_generation_prompt="yes")


def test_a_closed_llm_refuses_chat_and_its_tokenizer():
    llm = LLM("stdlib-code", backend="cpu")
    tok = llm.get_tokenizer()
    assert tok is llm.tokenizer and tok.decode(tok.encode("def f(x):")) == "def f(x):"
    llm.close()
    with pytest.raises(DFlash2Error, match="this LLM is closed"):
        llm.chat([{"role": "user", "content": "x"}], SP, chat_template=TEMPLATE)
    with pytest.raises(DFlash2Error, match="this LLM is closed"):
        llm.get_tokenizer()


@pytest.mark.parametrize("template, kind", [
    ("{{ messages[0].content + 1 }}", "TypeError"), ("{{ 1 / 0 }}", "ZeroDivisionError"),
    ("{% for i in range(10 ** 9) %}{% endfor %}x", "OverflowError"),
    ("{{ '{:q}'.format(1) }}", "ValueError")])
def test_a_template_expression_that_fails_is_an_error_naming_it(llm, template, kind):
    with pytest.raises(InvalidInputError, match=f"the chat template failed on the messages: "
                                                f"{kind}"):
        llm.chat([{"role": "user", "content": "x"}], SP, chat_template=template)


def test_the_servers_answer_to_a_failing_template_is_a_400_naming_messages():
    from dflash2rt.serve.chat import ChatTemplate
    from dflash2rt.serve.errors import APIError

    with pytest.raises(APIError) as info:
        ChatTemplate("{{ 1 / 0 }}", {}).render([{"role": "user", "content": "x"}], True)
    assert (info.value.status, info.value.param) == (400, "messages")
