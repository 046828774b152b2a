"""Chat messages, templates and where they are found against OpenAI's message shape and Hugging
Face's ``apply_chat_template`` environment written out from their documentation: each
check alone beside good messages, each place a template is kept, each Jinja option by its
output."""

from __future__ import annotations

import json

import pytest

from dflash2rt.errors import CheckpointError, InvalidInputError
from dflash2rt.serve.chat import ChatTemplate, check_messages, find_template, special_tokens
from dflash2rt.serve.errors import APIError

ROLES = ["system", "developer", "user", "assistant", "tool"]
GOOD = {"role": "user", "content": "hi"}


def _refused(messages, param: str) -> None:
    with pytest.raises(APIError) as info:
        check_messages(messages)
    assert (info.value.status, info.value.param) == (400, param), info.value.message


@pytest.mark.parametrize("messages", [None, "hi", {"role": "user", "content": "x"},
                                      (GOOD,), [], 3])
def test_messages_must_be_a_non_empty_list(messages):
    _refused(messages, "messages")


@pytest.mark.parametrize("at", [0, 1, 2])
@pytest.mark.parametrize("bad", ["x", None, ["user", "x"], {"role": "user", "content": "x",
                                                              "extra": 1},
                                 {"role": "user", "content": "x", "tool_calls": []}])
def test_a_message_that_is_not_an_object_of_known_keys_is_named_alone(at, bad):
    messages = [dict(GOOD), dict(GOOD), dict(GOOD)]
    messages[at] = bad
    _refused(messages, f"messages[{at}]")


@pytest.mark.parametrize("role", ROLES)
def test_every_documented_role_is_taken(role):
    assert check_messages([GOOD, {"role": role, "content": "c"}]) == [
        {"role": "user", "content": "hi"}, {"role": role, "content": "c"}]


@pytest.mark.parametrize("at", [0, 1])
@pytest.mark.parametrize("role", ["robot", "User", "", None, 1, "function"])
def test_an_unknown_role_is_named_alone(at, role):
    messages = [dict(GOOD), dict(GOOD)]
    messages[at] = {"role": role, "content": "x"}
    _refused(messages, f"messages[{at}].role")
    messages[at] = {"content": "x"}                           # no role at all
    _refused(messages, f"messages[{at}].role")


@pytest.mark.parametrize("at", [0, 1])
@pytest.mark.parametrize("content", [None, 3, {"type": "text", "text": "x"}, b"x",
                                     [{"type": "image_url", "text": "x"}],
                                     [{"type": "text", "text": 3}], [{"type": "text"}],
                                     [{"text": "x"}], ["x"],
                                     [{"type": "text", "text": "a"}, {"type": "text"}],
                                     [{"type": "text", "text": "a"}, "b"],
                                     [{"type": "image_url"}, {"type": "text", "text": "b"}]])
def test_content_that_is_not_text_is_named_alone(at, content):
    messages = [dict(GOOD), dict(GOOD)]
    messages[at] = {"role": "assistant", "content": content}
    _refused(messages, f"messages[{at}].content")
    messages[at] = {"role": "assistant"}                       # no content at all
    _refused(messages, f"messages[{at}].content")


def test_messages_come_out_as_plain_role_and_content():
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": ""},
             {"type": "text", "text": "bé"}]
    got = check_messages([{"role": "system", "content": ""},
                          {"role": "user", "content": parts, "name": "n"},
                          {"role": "tool", "content": []}])
    assert got == [{"role": "system", "content": ""}, {"role": "user", "content": "abé"},
                   {"role": "tool", "content": ""}]
    assert all(list(m) == ["role", "content"] for m in got)


def _render(source: str, messages=None, gen: bool = True, specials=None) -> str:
    return ChatTemplate(source, specials or {}).render(messages or [GOOD], gen)


def test_blocks_trim_their_newline_and_their_indent():
    """Hugging Face's environment: trim_blocks and lstrip_blocks."""
    assert _render("{% if true %}\nx\n{% endif %}\n") == "x\n"
    assert _render("  {% if true %}x{% endif %}") == "x"
    assert _render("a\n    {% for m in messages %}\n[{{ m.role }}]\n    {% endfor %}\nb",
                   [GOOD, GOOD]) == "a\n[user]\n[user]\nb"


def test_loop_controls_and_tojson():
    msgs = [{"role": "user", "content": str(i)} for i in range(4)]
    src = ("{% for m in messages %}{% if loop.index0 == 1 %}{% continue %}{% endif %}"
           "{% if loop.index0 == 3 %}{% break %}{% endif %}{{ m.content }}{% endfor %}")
    assert _render(src, msgs) == "02"
    obj = [{"role": "user", "content": "é\""}]
    assert _render("{{ messages | tojson }}", obj) == json.dumps(obj, ensure_ascii=False)
    assert _render("{{ messages | tojson(indent=2) }}", obj) == \
        json.dumps(obj, ensure_ascii=False, indent=2)
    assert _render("{{ strftime_now('plain') }}") == "plain"


def test_the_generation_flag_and_the_special_tokens_reach_the_template():
    src = "{{ bos_token }}{{ messages[0].content }}{% if add_generation_prompt %}>{% endif %}"
    assert _render(src, gen=True, specials={"bos_token": "<s>"}) == "<s>hi>"
    assert _render(src, gen=False, specials={"bos_token": "<s>"}) == "<s>hi"
    assert _render(src, gen=False) == "hi"                     # undefined: empty


@pytest.mark.parametrize("source", ["{{ raise_exception('no system role') }}",
                                    "{{ messages.append(1) }}", "{{ messages[0].x.y }}",
                                    "{{ ''.__class__.__mro__ }}"])
def test_a_template_that_refuses_names_messages(source):
    with pytest.raises(APIError) as info:
        _render(source)
    assert (info.value.status, info.value.param) == (400, "messages")


@pytest.mark.parametrize("source, said", [
    ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}",
     "the chat template failed on the messages: RecursionError: "),
    ("{{ 1 // 0 }}", "the chat template failed on the messages: ZeroDivisionError: "),
    ("{{ messages[7].role + 1 }}", "the chat template refused the messages: ")])
def test_a_template_whose_own_expression_fails_is_a_400_naming_messages(source, said):
    with pytest.raises(APIError) as info:
        _render(source)
    assert (info.value.status, info.value.param) == (400, "messages")
    assert info.value.message.startswith(said)


def test_the_messages_are_checked_before_rendering():
    with pytest.raises(APIError) as info:
        _render("{{ messages[0].content }}", [GOOD, {"role": "bot", "content": "x"}])
    assert info.value.param == "messages[1].role"


def test_a_template_that_does_not_compile_is_an_input_error():
    with pytest.raises(InvalidInputError, match="does not compile"):
        ChatTemplate("{% for %}", {})


def _config(tmp_path, data) -> None:
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(data))


def test_a_given_template_comes_first_as_a_file_or_as_text(tmp_path):
    (tmp_path / "chat_template.jinja").write_text("J")
    _config(tmp_path, {"chat_template": "C"})
    f = tmp_path / "given.jinja"
    f.write_text("no braces in a file")
    assert find_template(tmp_path, str(f)) == "no braces in a file"
    assert find_template(None, str(f)) == "no braces in a file"
    assert find_template(tmp_path, "{{ x }}") == "{{ x }}"
    assert find_template(None, "{") == "{"
    for given in ("plain words", "", str(tmp_path / "missing.jinja")):
        with pytest.raises(InvalidInputError, match="neither a file nor"):
            find_template(tmp_path, given)


def test_a_models_template_jinja_file_then_its_config(tmp_path):
    assert find_template(None, None) is None
    assert find_template(tmp_path, None) is None                 # nothing there
    (tmp_path / "chat_template.jinja").mkdir()                    # not a file: skipped
    assert find_template(tmp_path, None) is None
    _config(tmp_path, {"chat_template": "C"})
    assert find_template(tmp_path, None) == "C"
    (tmp_path / "chat_template.jinja").rmdir()
    (tmp_path / "chat_template.jinja").write_text("J")
    assert find_template(tmp_path, None) == "J"


@pytest.mark.parametrize("value, want", [
    (None, None), ("", ""), ("T", "T"), ([], None),
    ([{"name": "tools", "template": "T"}], None),
    ([{"name": "tools", "template": "T"}, {"name": "default", "template": "D"}], "D"),
    ([{"name": "default", "template": "D"}, {"name": "default", "template": "E"}], "D"),
    ([{"name": "default"}], None), ([{"template": "D"}], None)])
def test_the_configs_template_a_string_or_the_default_of_a_list(tmp_path, value, want):
    _config(tmp_path, {"chat_template": value} if value is not None else {})
    assert find_template(tmp_path, None) == want


@pytest.mark.parametrize("value", [3, True, {"default": "D"}, ["D"],
                                   [{"name": "default", "template": "D"}, "x"],
                                   ["x", {"name": "default", "template": "D"}],
                                   [{"name": "default", "template": 3}]])
def test_any_other_config_template_is_a_checkpoint_error(tmp_path, value):
    _config(tmp_path, {"chat_template": value})
    with pytest.raises(CheckpointError, match="chat_template"):
        find_template(tmp_path, None)


@pytest.mark.parametrize("data, want", [
    ({}, {}), ({"bos_token": "<s>"}, {"bos_token": "<s>"}),
    ({"eos_token": {"content": "</s>", "lstrip": False}}, {"eos_token": "</s>"}),
    ({"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<p>", "unk_token": "<u>"},
     {"bos_token": "<s>", "eos_token": "</s>"}),
    ({"bos_token": None, "eos_token": 3}, {}), ({"bos_token": {"id": 1}}, {}),
    ({"bos_token": {"content": 1}, "eos_token": ""}, {"eos_token": ""})])
def test_special_tokens_are_the_string_or_the_content_of_each(tmp_path, data, want):
    _config(tmp_path, data)
    assert special_tokens(tmp_path) == want


def test_special_tokens_without_a_config(tmp_path):
    assert special_tokens(None) == {}
    assert special_tokens(tmp_path) == {}
    (tmp_path / "tokenizer_config.json").mkdir()
    assert special_tokens(tmp_path) == {}
