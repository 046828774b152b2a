"""``--prompt-file`` read through ``read_prompt_file``: the prompts back unchanged, or one
InvalidInputError whose whole message (file, item, what is wrong, the schema) is written out
here by hand."""

from __future__ import annotations

import json

import pytest

from dflash2rt.cli.prompt_file import read_prompt_file
from dflash2rt.errors import InvalidInputError

SCHEMA = ("a non-empty JSON list whose items are all non-empty strings, or all non-empty lists "
          "of integer token ids")


def _file(tmp_path, content: str | bytes):
    f = tmp_path / "p.json"
    if isinstance(content, bytes):
        f.write_bytes(content)
    else:
        f.write_text(content, encoding="utf-8")
    return str(f)


@pytest.mark.parametrize("data", [
    ["a"], ["a", "bc", " "], [[0]], [[1, 2], [3]], [[-1, 0, 7]], ["\u00e9\U0001f600"],
])
def test_good_files_come_back_as_written(tmp_path, data):
    assert read_prompt_file(_file(tmp_path, json.dumps(data))) == data


@pytest.mark.parametrize("content, what", [
    ('"abc"', "got a JSON string, not a list"),
    ('{"a": 1}', "got a JSON object, not a list"),
    ("7", "got a JSON integer, not a list"),
    ("7.5", "got a JSON number, not a list"),
    ("true", "got a JSON boolean, not a list"),
    ("null", "got a JSON null, not a list"),
    ("[]", "the list is empty"),
    ('[""]', "item 0 is empty"),
    ("[[]]", "item 0 is empty"),
    ('["a", ""]', "item 1 is empty"),
    ("[[1], []]", "item 1 is empty"),
    ("[1, 2]", "item 0 is a JSON integer"),
    ("[null]", "item 0 is a JSON null"),
    ('[{"a": 1}]', "item 0 is a JSON object"),
    ('["a", [1]]', "item 1 is a JSON list but item 0 is a string "
                   "(strings and token-id lists cannot be mixed)"),
    ('[[1], "a"]', "item 1 is a JSON string but item 0 is a list "
                   "(strings and token-id lists cannot be mixed)"),
    ('["a", "b", 3]', "item 2 is a JSON integer but item 0 is a string "
                      "(strings and token-id lists cannot be mixed)"),
    ("[[1.5]]", "item 0 holds 1.5, not an integer token id"),
    ("[[1.0]]", "item 0 holds 1.0, not an integer token id"),
    ("[[true]]", "item 0 holds True, not an integer token id"),
    ('[[1], [2, "a"]]', "item 1 holds 'a', not an integer token id"),
    ("[[1, null, 2.5]]", "item 0 holds None, not an integer token id"),
    ('["ok", "\\ud800"]', "item 1 is not valid Unicode text "
                          "(surrogates not allowed at position 0: '\\ud800')"),
    ('["x\\udc00y"]', "item 0 is not valid Unicode text "
                      "(surrogates not allowed at position 1: '\\udc00')"),
])
def test_each_wrong_shape_is_named_exactly(tmp_path, content, what):
    path = _file(tmp_path, content)
    with pytest.raises(InvalidInputError) as exc:
        read_prompt_file(path)
    assert str(exc.value) == f"--prompt-file {path!r}: {what}; it must hold {SCHEMA}"


def test_a_missing_file_cannot_be_read(tmp_path):
    path = str(tmp_path / "nope.json")
    with pytest.raises(InvalidInputError) as exc:
        read_prompt_file(path)
    assert str(exc.value) == f"--prompt-file {path!r}: cannot read it (No such file or directory)"


@pytest.mark.parametrize("content", [b"not json", b"", b'["caf\xe9"]', b"[" * 100000])
def test_not_utf8_json_is_named_with_the_schema(tmp_path, content):
    path = _file(tmp_path, content)
    with pytest.raises(InvalidInputError) as exc:
        read_prompt_file(path)
    msg = str(exc.value)
    assert msg.startswith(f"--prompt-file {path!r} is not a valid UTF-8 JSON file (")
    assert msg.endswith(f"); it must hold {SCHEMA}")
