"""The synthetic tokenizer (``synth.tokenizer``) of a small made-up shape, 4,100 regular ids and
three specials: the text sample it learns from (files in name order up to a character
budget), the id layout (4,096 learnt ids, filler entries up to the regular count, the specials
right after), the special tokens' flags as saved and as they behave (matched inside words,
spaces kept, skipped on decode), no prefix space, and the config files ``write_tokenizer``
writes next to it. Expected ids, names and file texts are written out by hand."""

from __future__ import annotations

import json
import sysconfig

import pytest

from dflash2rt.synth import tokenizer as synth_tok
from dflash2rt.synth.shapes import Shape

SPECIALS = ("<a>", "<b>", "<c>")
SHAPE = Shape("tiny", {"bos_token_id": 4100, "eos_token_id": 4102,
                       "max_position_embeddings": 64}, 4100, SPECIALS, 4102)
FILL = "\u0120\u0120fill"


@pytest.fixture(scope="module")
def tok():
    return synth_tok.build_tokenizer(SHAPE)


def test_sample_takes_files_in_name_order_until_the_budget_is_reached(tmp_path, monkeypatch):
    for name, body in (("c.py", "c" * 10), ("a.py", "a" * 10), ("b.py", "b" * 10),
                       ("notes.txt", "t" * 10)):
        (tmp_path / name).write_text(body)
    monkeypatch.setattr(sysconfig, "get_paths", lambda: {"stdlib": str(tmp_path)})
    assert synth_tok._sample_text(15) == ["a" * 10, "b" * 10]
    assert synth_tok._sample_text(20) == ["a" * 10, "b" * 10]
    assert synth_tok._sample_text(21) == ["a" * 10, "b" * 10, "c" * 10]
    assert synth_tok._sample_text(5) == ["a" * 10]


def test_sample_budget_is_four_hundred_thousand_characters(tmp_path, monkeypatch):
    (tmp_path / "a.py").write_text("a" * 399_999)
    (tmp_path / "b.py").write_text("b")
    (tmp_path / "c.py").write_text("c")
    monkeypatch.setattr(sysconfig, "get_paths", lambda: {"stdlib": str(tmp_path)})
    assert synth_tok._sample_text() == ["a" * 399_999, "b"]


def test_learnt_ids_then_filler_up_to_the_regular_count(tok):
    assert synth_tok.MERGED == 4096
    assert tok.id_to_token(4095) is not None and not tok.id_to_token(4095).startswith(FILL)
    assert [tok.id_to_token(i) for i in range(4096, 4100)] == [
        "\u0120\u0120fill0", "\u0120\u0120fill1", "\u0120\u0120fill2", "\u0120\u0120fill3"]
    assert tok.token_to_id("\u0120\u0120fill0") == 4096
    assert tok.token_to_id("\u0120\u0120fill4") is None


def test_specials_follow_the_regular_ids_and_nothing_after_them(tok):
    assert tok.get_vocab_size() == 4103
    assert [tok.id_to_token(i) for i in (4100, 4101, 4102, 4103)] == ["<a>", "<b>", "<c>", None]
    assert [tok.token_to_id(s) for s in SPECIALS] == [4100, 4101, 4102]


def test_special_flags_as_saved(tok):
    flags = {"single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
             "special": True}
    assert json.loads(tok.to_str())["added_tokens"] == [
        {"id": 4100, "content": "<a>", **flags}, {"id": 4101, "content": "<b>", **flags},
        {"id": 4102, "content": "<c>", **flags}]


def test_specials_match_inside_words_keep_spaces_and_are_skipped_on_decode(tok):
    assert tok.encode("a<b>b").tokens == ["a", "<b>", "b"]
    assert tok.encode(" <b> ").tokens == ["\u0120", "<b>", "\u0120"]
    ids = tok.encode("x <b> y").ids
    assert 4101 in ids
    assert tok.decode(ids, skip_special_tokens=False) == "x <b> y"
    assert tok.decode(ids) == "x  y"


def test_no_prefix_space_and_text_round_trips(tok):
    assert tok.encode("x").tokens == ["x"]
    text = "def f(x):\n    return x + 1  # é\n"
    assert tok.decode(tok.encode(text).ids) == text


class _Saved:
    def save(self, path: str) -> None:
        open(path, "w").write("{}")


def _write(tmp_path, monkeypatch, target):
    monkeypatch.setattr(synth_tok, "build_tokenizer", lambda shape: _Saved())
    synth_tok.write_tokenizer(Shape("tiny", target, 4100, SPECIALS, 4102), tmp_path)
    return ((tmp_path / "tokenizer_config.json").read_text(),
            (tmp_path / "generation_config.json").read_text())


def test_configs_name_the_specials_by_their_ids(tmp_path, monkeypatch):
    cfg, gen = _write(tmp_path, monkeypatch, {"bos_token_id": 4100, "eos_token_id": 4102,
                                              "pad_token_id": 4101,
                                              "max_position_embeddings": 64})
    assert cfg == ('{\n  "tokenizer_class": "PreTrainedTokenizerFast",\n'
                   '  "eos_token": "<c>",\n  "bos_token": "<a>",\n'
                   '  "model_max_length": 64\n}\n')
    assert gen == ('{\n  "bos_token_id": 4100,\n  "eos_token_id": 4102,\n'
                   '  "pad_token_id": 4101\n}\n')
    assert (tmp_path / "tokenizer.json").read_text() == "{}"


def test_configs_without_bos_or_pad(tmp_path, monkeypatch):
    cfg, gen = _write(tmp_path, monkeypatch, {"eos_token_id": 4101,
                                              "max_position_embeddings": 32})
    assert json.loads(cfg) == {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<b>",
                               "bos_token": None, "model_max_length": 32}
    assert json.loads(gen) == {"bos_token_id": None, "eos_token_id": 4101, "pad_token_id": 4101}
