"""``dflash2rt synth`` with the writer replaced by a recorder: required flags, the shape
choices, defaults, the shard size in bytes, the refusal of a non-positive size and the printed
summary, written out here by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

import dflash2rt.synth
from dflash2rt.cli import build_parser, main
from dflash2rt.synth.shapes import SHAPES, TOY_SHAPES
from dflash2rt.synth.write import GB


@pytest.mark.parametrize("argv", [["synth", "--out", "o"], ["synth", "--shape", "toy-qwen3"],
                                  ["synth", "--shape", "no-such", "--out", "o"]])
def test_shape_and_out_are_required_and_checked(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(argv)
    assert exc.value.code == 2
    capsys.readouterr()


def test_every_published_and_toy_shape_is_a_choice():
    for shape in [*SHAPES, *TOY_SHAPES]:
        assert build_parser().parse_args(["synth", "--shape", shape, "--out", "o"]).shape == shape


def _synth(monkeypatch):
    calls = []

    def synthesize(*a, **kw):
        calls.append((a, kw))
        return {"target": "t", "shards": [1, 2]}

    monkeypatch.setattr(dflash2rt.synth, "synthesize", synthesize)
    return calls


def test_defaults_and_the_summary(monkeypatch, capsys):
    calls = _synth(monkeypatch)
    assert main(["synth", "--shape", "toy-qwen3", "--out", "o"]) == 0
    assert calls == [(("toy-qwen3", Path("o"), 0, None, None),
                      dict(max_shard_bytes=4 * GB, draft_format="dflash2", draft_vocab=None,
                           layout=None))]
    assert capsys.readouterr().out == \
        '{\n  "target": "t",\n  "shards": [\n    1,\n    2\n  ]\n}\n'


@pytest.mark.parametrize("gb, nbytes", [("0.5", GB // 2), ("0.25", GB // 4), ("3", 3 * GB)])
def test_shard_sizes_in_bytes(monkeypatch, capsys, gb, nbytes):
    calls = _synth(monkeypatch)
    assert main(["synth", "--shape", "toy-qwen3", "--out", "o", "--shard-gb", gb, "--seed",
                 "5"]) == 0
    assert calls[0][0][2] == 5 and calls[0][1]["max_shard_bytes"] == nbytes
    capsys.readouterr()


@pytest.mark.parametrize("gb", ["0", "-1", "inf", "nan", "-inf"])
def test_a_size_not_above_zero_or_not_finite_is_refused(monkeypatch, capsys, gb):
    calls = _synth(monkeypatch)
    assert main(["synth", "--shape", "toy-qwen3", "--out", "o", f"--shard-gb={gb}"]) == 2
    assert calls == []
    assert capsys.readouterr().err == ("dflash2rt: error: InvalidInputError: --shard-gb must be "
                                       f"a size in GB > 0, got {float(gb)}\n")
