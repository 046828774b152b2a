"""``bundled.heldout`` / ``heldout_ids``: a model directory's held-out prompts, read once for
every command that sends them, and every malformed file refused naming what to fix."""

from __future__ import annotations

import json

import pytest

from dflash2rt.bundled import HELDOUT, bundled_path, heldout, heldout_ids
from dflash2rt.errors import InvalidInputError


def _write(tmp_path, items, raw: str | None = None):
    (tmp_path / HELDOUT).write_text(json.dumps(items) if raw is None else raw,
                                    encoding="utf-8")
    return tmp_path


def test_strings_and_objects_in_the_files_order(tmp_path):
    root = _write(tmp_path, ["b", {"prompt": "a", "prompt_ids": [3, 1]}, "", "c"])
    assert heldout(root) == [{"prompt": "b"}, {"prompt": "a", "prompt_ids": [3, 1]},
                             {"prompt": ""}, {"prompt": "c"}]


def test_extra_keys_are_kept(tmp_path):
    root = _write(tmp_path, [{"prompt": "x", "file": "f.py", "line": 7, "prompt_ids": []}])
    assert heldout(root) == [{"prompt": "x", "file": "f.py", "line": 7, "prompt_ids": []}]


def test_ids_as_given(tmp_path):
    root = _write(tmp_path, [{"prompt": "x", "prompt_ids": [5, 0, 9]},
                             {"prompt": "y", "prompt_ids": [2]}])
    assert heldout_ids(root) == [[5, 0, 9], [2]]


@pytest.mark.parametrize("missing_at", [0, 1, 2])
def test_ids_refused_naming_the_first_prompt_without_them(tmp_path, missing_at):
    items = [{"prompt": "x", "prompt_ids": [1]} for _ in range(3)]
    del items[missing_at]["prompt_ids"]
    items.append("text only")
    with pytest.raises(InvalidInputError, match=f"prompt {missing_at} has no \"prompt_ids\""):
        heldout_ids(_write(tmp_path, items))


def test_a_missing_file_names_it(tmp_path):
    with pytest.raises(InvalidInputError, match=f"{tmp_path} has no {HELDOUT}"):
        heldout(tmp_path)
    (tmp_path / HELDOUT).mkdir()                       # a directory of that name is no file
    with pytest.raises(InvalidInputError, match=f"has no {HELDOUT}"):
        heldout(tmp_path)


@pytest.mark.parametrize("raw", ["", "[", "{\"prompt\": 1", "\x00"])
def test_not_json(tmp_path, raw):
    with pytest.raises(InvalidInputError, match="is not JSON"):
        heldout(_write(tmp_path, None, raw))


def test_not_utf8(tmp_path):
    (tmp_path / HELDOUT).write_bytes(b'["\xff"]')
    with pytest.raises(InvalidInputError, match="is not JSON"):
        heldout(tmp_path)


@pytest.mark.parametrize("items", [[], {}, {"prompt": "x"}, "x", 3, None])
def test_not_a_non_empty_list(tmp_path, items):
    with pytest.raises(InvalidInputError, match="non-empty JSON list"):
        heldout(_write(tmp_path, items))


BAD = [3, None, True, ["x"], {}, {"prompt": 3}, {"prompt": None}, {"text": "x"},
       {"prompt": "x", "prompt_ids": "1 2"}, {"prompt": "x", "prompt_ids": None},
       {"prompt": "x", "prompt_ids": [1, "2"]}, {"prompt": "x", "prompt_ids": [1.0]},
       {"prompt": "x", "prompt_ids": [True]}, {"prompt": "x", "prompt_ids": [[1]]}]


@pytest.mark.parametrize("bad", BAD)
@pytest.mark.parametrize("at", [0, 2])
def test_each_malformed_prompt_named_by_its_index(tmp_path, bad, at):
    items: list = ["a", {"prompt": "b", "prompt_ids": [1, 2]}, "c"]
    items[at] = bad
    with pytest.raises(InvalidInputError, match=f": prompt {at} must be a string or an object"):
        heldout(_write(tmp_path, items))


def test_the_bundled_pairs_prompts():
    root = bundled_path("stdlib-code")
    items = heldout(root)
    raw = json.loads((root / HELDOUT).read_text(encoding="utf-8"))
    assert items == raw and len(items) == 24
    assert heldout_ids(root) == [r["prompt_ids"] for r in raw]


def test_bench_serve_refuses_a_directory_without_prompts(tmp_path, capsys):
    from dflash2rt.cli import main

    assert main(["bench", "serve", "--model", str(tmp_path)]) != 0
    assert f"InvalidInputError: {tmp_path} has no {HELDOUT}" in capsys.readouterr().err


def test_bundled_models_are_the_directories_with_both_models(tmp_path, monkeypatch):
    import dflash2rt.bundled as bundled

    for name, subs in (("b-pair", ("target", "draft")), ("a-pair", ("target", "draft")),
                       ("target-only", ("target",)), ("draft-only", ("draft",)),
                       ("empty", ()), ("__pycache__", ()), ("v1.pair", ("target", "draft")),
                       (".hidden", ("target", "draft")), ("~home", ("target", "draft"))):
        (tmp_path / name).mkdir()
        for s in subs:
            (tmp_path / name / s).mkdir()
    (tmp_path / "file").write_text("x")
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "target").write_text("a file, not a directory")
    (tmp_path / "files" / "draft").mkdir()
    monkeypatch.setattr(bundled, "_ROOT", tmp_path)
    listed = [".hidden", "a-pair", "b-pair", "v1.pair", "~home"]
    assert bundled.bundled_models() == listed
    assert bundled.bundled_path("a-pair") == tmp_path / "a-pair"
    # a suffix, a leading "." or "~": meant as a path, never taken as a bundled name
    for name in ("target-only", "empty", "file", "files", "c-pair", "v1.pair", ".hidden",
                 "~home"):
        with pytest.raises(InvalidInputError, match=f"bundled: {', '.join(listed)}"):
            bundled.bundled_path(name)
