"""``dflash2rt watermark`` with the detector and tokenizer replaced by recorders: required
flags, where ``--model``'s tokenizer is looked for, how ``--text`` is encoded, what ``--tokens``
must hold, the detector's arguments and the verdict line, written out here by hand."""

from __future__ import annotations

import importlib

import pytest

import dflash2rt.bundled
import dflash2rt.models.tokenizer
from dflash2rt.cli import build_parser, main
from dflash2rt.watermark import WatermarkKey

# the package's ``detect`` is the function; the module is reached by name
DETECT = importlib.import_module("dflash2rt.watermark.detect")


@pytest.mark.parametrize("argv", [
    ["watermark"], ["watermark", "keygen"], ["watermark", "detect", "--tokens", "t.json"],
    ["watermark", "detect", "--key-file", "k"],
    ["watermark", "detect", "--key-file", "k", "--tokens", "t", "--text", "x"],
])
def test_required_arguments(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(argv)
    assert exc.value.code == 2
    capsys.readouterr()


def test_keygen_exits_0_and_prints_only_the_fingerprint(tmp_path, capsys):
    kf = tmp_path / "k"
    assert main(["watermark", "keygen", "--out", str(kf)]) == 0
    key = WatermarkKey.from_file(kf)
    assert capsys.readouterr().out == f"wrote {kf} (WatermarkKey(fingerprint={key.fingerprint}))\n"


class Result:
    watermarked, fpr, p_value, log10_p_value, score = True, 0.01, 1.234e-5, -4.9087, 12.345
    tokens_scored, repeated_skipped, context_width, tokens_total = 40, 3, 4, 47

    def as_dict(self):
        return {"watermarked": self.watermarked, "p": 1}


@pytest.fixture
def key_file(tmp_path):
    kf = tmp_path / "wm.key"
    WatermarkKey.generate().save(kf)
    return kf


def _detector(monkeypatch, result=None):
    calls = []

    def detect(key, tokens, fpr, context_width):
        calls.append((key, tokens, fpr, context_width))
        return result or Result()

    monkeypatch.setattr(DETECT, "detect", detect)
    return calls


def test_tokens_file_defaults_and_the_verdict_line(tmp_path, monkeypatch, capsys, key_file):
    calls = _detector(monkeypatch)
    tf = tmp_path / "t.json"
    tf.write_text("[5, 6, 7]")
    assert main(["watermark", "detect", "--key-file", str(key_file), "--tokens", str(tf)]) == 0
    [(key, tokens, fpr, width)] = calls
    assert key.fingerprint == WatermarkKey.from_file(key_file).fingerprint
    assert (tokens, fpr, width) == ([5, 6, 7], 0.01, 4)
    assert capsys.readouterr().out == ("watermarked at fpr 0.01: p-value 1.23e-05 (log10 -4.91), "
                                       "score 12.35 over 40 tokens (3 repeated skipped, "
                                       "4 context-only)\n")


def test_not_watermarked_and_few_tokens_json(tmp_path, monkeypatch, capsys, key_file):
    res = Result()
    res.watermarked, res.tokens_total, res.fpr = False, 2, 0.5
    calls = _detector(monkeypatch, res)
    tf = tmp_path / "t.json"
    tf.write_text("[1, 2]")
    argv = ["watermark", "detect", "--key-file", str(key_file), "--tokens", str(tf),
            "--fpr", "0.5", "--context-width", "6"]
    assert main(argv) == 0
    assert capsys.readouterr().out.startswith("not watermarked at fpr 0.5: ")
    assert main(argv) == 0
    assert capsys.readouterr().out.endswith(" (3 repeated skipped, 2 context-only)\n")
    assert main(argv + ["--json"]) == 0
    assert capsys.readouterr().out == '{"watermarked": false, "p": 1}\n'
    assert [c[2:] for c in calls] == [(0.5, 6)] * 3


@pytest.mark.parametrize("content", ["[1, 2", "", "[" * 100000, "\udcff"])
def test_tokens_that_are_not_json(tmp_path, monkeypatch, capsys, key_file, content):
    calls = _detector(monkeypatch)
    tf = tmp_path / "t.json"
    tf.write_bytes(content.encode("utf-8", "surrogateescape"))
    assert main(["watermark", "detect", "--key-file", str(key_file), "--tokens", str(tf)]) == 2
    assert calls == []
    err = capsys.readouterr().err
    assert err.startswith(f"dflash2rt: error: InvalidInputError: {str(tf)!r} is not JSON (")
    assert err.endswith("); --tokens wants a JSON list of token ids\n")


@pytest.mark.parametrize("content, what", [
    ('{"a": 1}', "holds a dict; --tokens wants a JSON list of token ids"),
    ("3", "holds a int; --tokens wants a JSON list of token ids"),
])
def test_tokens_that_are_not_a_list(tmp_path, monkeypatch, capsys, key_file, content, what):
    calls = _detector(monkeypatch)
    tf = tmp_path / "t.json"
    tf.write_text(content)
    assert main(["watermark", "detect", "--key-file", str(key_file), "--tokens", str(tf)]) == 2
    assert calls == []
    assert capsys.readouterr().err == f"dflash2rt: error: InvalidInputError: {str(tf)!r} {what}\n"


class Tok:
    def __init__(self, where):
        self.where, self.calls = where, []

    def encode(self, text, add_special_tokens=True):
        self.calls.append((text, add_special_tokens))
        return [len(text), 1]


def _loader(monkeypatch):
    toks = []

    def load_tokenizer(d):
        toks.append(Tok(d))
        return toks[-1]

    monkeypatch.setattr(dflash2rt.models.tokenizer, "load_tokenizer", load_tokenizer)
    return toks


@pytest.mark.parametrize("sub", ["", "target"])
def test_text_through_a_directorys_tokenizer_without_special_tokens(tmp_path, monkeypatch,
                                                                    capsys, key_file, sub):
    calls, toks = _detector(monkeypatch), _loader(monkeypatch)
    model = tmp_path / "m"
    (model / sub).mkdir(parents=True)
    (model / sub / "tokenizer.json").write_text("{}")
    monkeypatch.setattr(dflash2rt.bundled, "bundled_path", lambda name: pytest.fail(name))
    assert main(["watermark", "detect", "--key-file", str(key_file), "--text", "hello",
                 "--model", str(model), "--json"]) == 0
    [tok] = toks
    assert tok.where == (model / sub if sub else model)
    assert tok.calls == [("hello", False)] and calls[0][1] == [5, 1]
    capsys.readouterr()


def test_a_name_is_a_bundled_model(tmp_path, monkeypatch, capsys, key_file):
    _detector(monkeypatch)
    toks = _loader(monkeypatch)
    (tmp_path / "b" / "target").mkdir(parents=True)
    (tmp_path / "b" / "target" / "tokenizer.json").write_text("{}")
    monkeypatch.setattr(dflash2rt.bundled, "bundled_path", lambda name: tmp_path / name)
    assert main(["watermark", "detect", "--key-file", str(key_file), "--text", "x",
                 "--model", "b", "--json"]) == 0
    assert toks[0].where == tmp_path / "b" / "target"
    capsys.readouterr()


def test_a_directory_without_a_tokenizer(tmp_path, monkeypatch, capsys, key_file):
    _detector(monkeypatch)
    _loader(monkeypatch)
    (tmp_path / "m").mkdir()
    assert main(["watermark", "detect", "--key-file", str(key_file), "--text", "x",
                 "--model", str(tmp_path / "m")]) == 2
    assert capsys.readouterr().err == (
        f"dflash2rt: error: InvalidInputError: {tmp_path / 'm'} has no tokenizer.json (nor "
        "target/tokenizer.json); pass --tokens with token ids instead\n")


def test_parsed_defaults():
    args = build_parser().parse_args(["watermark", "detect", "--key-file", "k", "--text", "t"])
    assert (args.model, args.fpr, args.context_width, args.json, args.allow_shared) == \
        ("stdlib-code", 0.01, 4, False, False)
