"""``--prompt-file``: a JSON list of prompts, all non-empty strings or all non-empty token-id lists."""

from __future__ import annotations

import json

from ..engine.request import unicode_problem
from ..errors import InvalidInputError

SCHEMA = ("a non-empty JSON list whose items are all non-empty strings, or all non-empty lists "
          "of integer token ids")


def read_prompt_file(path: str) -> list[str] | list[list[int]]:
    """The prompts in ``path``; InvalidInputError naming the file and what is wrong otherwise."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as exc:
        raise InvalidInputError(f"--prompt-file {path!r}: cannot read it "
                                f"({exc.strerror or exc})") from None
    except (ValueError, RecursionError) as exc:     # not UTF-8, or not JSON
        raise InvalidInputError(f"--prompt-file {path!r} is not a valid UTF-8 JSON file "
                                f"({exc}); it must hold {SCHEMA}") from None
    _check(path, data)
    return data


def _check(path: str, data: object) -> None:
    def bad(what: str) -> InvalidInputError:
        return InvalidInputError(f"--prompt-file {path!r}: {what}; it must hold {SCHEMA}")

    if not isinstance(data, list):
        raise bad(f"got a JSON {_kind(data)}, not a list")
    if not data:
        raise bad("the list is empty")
    text = isinstance(data[0], str)
    for i, item in enumerate(data):
        if text and not isinstance(item, str) or not text and not isinstance(item, list):
            raise bad(f"item {i} is a JSON {_kind(item)} but item 0 is a {_kind(data[0])} "
                      "(strings and token-id lists cannot be mixed)" if i else
                      f"item 0 is a JSON {_kind(item)}")
        if not item:
            raise bad(f"item {i} is empty")
        if text:
            problem = unicode_problem(item)
            if problem:
                raise bad(f"item {i} is not valid Unicode text ({problem})")
            continue
        wrong = [t for t in item if type(t) is not int]      # JSON ints only: no floats, no bools
        if wrong:
            raise bad(f"item {i} holds {wrong[0]!r}, not an integer token id")


def _kind(value: object) -> str:
    names = {dict: "object", list: "list", str: "string", bool: "boolean", int: "integer",
             float: "number", type(None): "null"}
    return names.get(type(value), type(value).__name__)
