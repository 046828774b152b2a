"""``models.tokenizer`` against a tokenizer.json and configs written by hand: the ids and text
of transformers' defaults (special tokens added on encode, kept on decode), the vocabulary
with added tokens, the eos / bos ids and the file each comes from (generation_config.json,
else config.json), and each malformed file as a CheckpointError that names it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from dflash2rt.errors import CheckpointError
from dflash2rt.models.tokenizer import load_tokenizer, read_json_object

tokenizers = pytest.importorskip("tokenizers")

# ids: the three words, then "<s>" 3 and "</s>" 4 (special), then "extra" 5 (added, not special)
WORDS = {"[UNK]": 0, "hello": 1, "world": 2}
BOS, EOS, EXTRA = 3, 4, 5


def _write_tokenizer(path: Path) -> Path:
    """A word-level tokenizer.json whose post-processor puts "<s>" before the text."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers, processors

    tok = Tokenizer(models.WordLevel(WORDS, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens([AddedToken("<s>", special=True), AddedToken("</s>", special=True)])
    tok.add_tokens(["extra"])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A",
                                                       special_tokens=[("<s>", BOS)])
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    return path


def _checkpoint(path: Path, generation: dict | None, config: dict | None) -> Path:
    _write_tokenizer(path)
    for name, data in (("generation_config.json", generation), ("config.json", config)):
        if data is not None:
            (path / name).write_text(json.dumps(data), encoding="utf-8")
    return path


def test_special_tokens_are_added_on_encode_and_kept_on_decode_by_default(tmp_path):
    tok = load_tokenizer(_checkpoint(tmp_path, None, {}))
    assert tok.encode("hello world") == [BOS, 1, 2]
    assert tok.encode("hello world", add_special_tokens=False) == [1, 2]
    assert tok.encode("extra hello", add_special_tokens=False) == [EXTRA, 1]
    assert tok.decode([BOS, 1, 2, EOS]) == "<s> hello world </s>"
    assert tok.decode((BOS, 1, 2, EOS), skip_special_tokens=True) == "hello world"
    assert tok.vocab_size == 6                     # three words, two special tokens, "extra"


def test_the_wrapper_is_immutable(tmp_path):
    tok = load_tokenizer(_checkpoint(tmp_path, None, {"eos_token_id": EOS}))
    with pytest.raises(dataclasses.FrozenInstanceError):
        tok.eos_token_ids = (1,)
    assert tok.eos_token_ids == (EOS,)


# (generation_config.json, config.json: None for no such file) → (eos ids, bos id)
SOURCES = [
    (None, None, (), None),
    ({}, {}, (), None),
    (None, {"eos_token_id": EOS, "bos_token_id": BOS}, (EOS,), BOS),
    ({"eos_token_id": [EOS, 2], "bos_token_id": BOS}, {"eos_token_id": 1, "bos_token_id": 0},
     (EOS, 2), BOS),
    ({"bos_token_id": BOS}, {"eos_token_id": EOS, "bos_token_id": 0}, (EOS,), BOS),
    ({"eos_token_id": EOS}, {"eos_token_id": 1, "bos_token_id": BOS}, (EOS,), BOS),
    ({"eos_token_id": EOS, "bos_token_id": None}, {"bos_token_id": 0}, (EOS,), 0),
    ({"eos_token_id": []}, {"eos_token_id": [EOS]}, (EOS,), None),
    ({"eos_token_id": 0}, {"eos_token_id": EOS}, (0,), None),
    ({"eos_token_id": None}, {"eos_token_id": None}, (), None),
]


@pytest.mark.parametrize("generation,config,eos,bos", SOURCES)
def test_eos_and_bos_come_from_generation_config_before_config(tmp_path, generation, config,
                                                               eos, bos):
    tok = load_tokenizer(_checkpoint(tmp_path, generation, config))
    assert tok.eos_token_ids == eos and tok.bos_token_id == bos


@pytest.mark.parametrize("value", [True, "4", 4.0, [EOS, "5"], [EOS, False], [[EOS]],
                                   {"id": EOS}])
@pytest.mark.parametrize("name", ["generation_config.json", "config.json"])
def test_an_eos_id_that_is_no_int_is_refused_naming_the_file(tmp_path, value, name):
    _write_tokenizer(tmp_path)
    (tmp_path / name).write_text(json.dumps({"eos_token_id": value}), encoding="utf-8")
    with pytest.raises(CheckpointError) as info:
        load_tokenizer(tmp_path)
    assert str(info.value) == (f"{tmp_path / name}: eos_token_id must be an int or a list of "
                               f"ints, got {value!r}")


@pytest.mark.parametrize("content,message", [
    (b"[1, 2]", "{} must hold a JSON object"),
    (b'"text"', "{} must hold a JSON object"),
    (b"null", "{} must hold a JSON object"),
    (b"{not json", "cannot read {}: "),
    (b'{"eos_token_id": "\xff"}', "cannot read {}: "),
])
def test_a_config_that_is_no_json_object_names_the_file(tmp_path, content, message):
    _write_tokenizer(tmp_path)
    (tmp_path / "config.json").write_bytes(content)
    with pytest.raises(CheckpointError) as info:
        load_tokenizer(tmp_path)
    assert str(info.value).startswith(message.format(tmp_path / "config.json"))
    with pytest.raises(CheckpointError) as info:
        read_json_object(tmp_path / "config.json")
    assert str(info.value).startswith(message.format(tmp_path / "config.json"))


def test_read_json_object_returns_the_object_and_names_a_missing_file(tmp_path):
    (tmp_path / "a.json").write_text('{"x": [1, 2], "y": null}', encoding="utf-8")
    assert read_json_object(tmp_path / "a.json") == {"x": [1, 2], "y": None}
    with pytest.raises(CheckpointError, match="^cannot read .*absent.json: "):
        read_json_object(tmp_path / "absent.json")


def test_a_missing_or_malformed_tokenizer_json_names_it(tmp_path):
    with pytest.raises(CheckpointError) as info:
        load_tokenizer(tmp_path)
    assert str(info.value) == f"{tmp_path}: tokenizer.json not found"
    (tmp_path / "tokenizer.json").mkdir()                 # a directory is no tokenizer.json
    with pytest.raises(CheckpointError, match="tokenizer.json not found"):
        load_tokenizer(str(tmp_path))
    (tmp_path / "tokenizer.json").rmdir()
    (tmp_path / "tokenizer.json").write_text('{"model": 3}', encoding="utf-8")
    with pytest.raises(CheckpointError) as info:
        load_tokenizer(tmp_path)
    assert str(info.value).startswith(f"cannot load {tmp_path / 'tokenizer.json'}: ")
