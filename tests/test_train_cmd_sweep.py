"""``dflash2rt train`` with the recipe replaced by a recorder: the RecipeConfig its flags make
(defaults, --minutes scaling, overrides, the draft's shape, --target) and the summary it prints,
written out here by hand."""

from __future__ import annotations

import dataclasses
import json

import pytest

from dflash2rt.cli import build_parser, main
from dflash2rt.errors import InvalidInputError
from dflash2rt.train import recipe
from dflash2rt.train.recipe_config import RecipeConfig


def _report():
    ev = {"eval_greedy": (3.0, 0.9, 2.5), "eval_t07_p095": (2.0, 0.8, None),
          "eval_t1": (1.5, 0.7, None)}
    rep = {k: {"tau": tau, "topk_mass": mass, "speedup_vs_target_only": sp}
           for k, (tau, mass, sp) in ev.items()}
    return {"seconds": {"target": 1}, "total_seconds": 9, "bytes": 100, "other": "x",
            "eval_summary": {"spec_step_cost_vs_target_only": 1.25}, **rep}


def _recipe(monkeypatch):
    calls = []

    def run_recipe(out, cfg):
        calls.append((out, cfg))
        return _report()

    monkeypatch.setattr(recipe, "run_recipe", run_recipe)
    return calls


def test_out_is_required(capsys):
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["train"])
    assert exc.value.code == 2
    capsys.readouterr()


def test_defaults_are_the_recipes_and_the_summary_is_printed(tmp_path, monkeypatch, capsys):
    calls = _recipe(monkeypatch)
    assert main(["train", "--out", str(tmp_path / "o")]) == 0
    [(out, cfg)] = calls
    assert out == tmp_path / "o" and cfg == RecipeConfig(seed=0, threads=2)
    text = capsys.readouterr().out
    assert json.loads(text) == {
        "seconds": {"target": 1}, "total_seconds": 9, "bytes": 100, "tau_t0": 3.0,
        "tau_t07_p095": 2.0, "tau_t1": 1.5,
        "topk_mass": {"eval_greedy": 0.9, "eval_t07_p095": 0.8, "eval_t1": 0.7},
        "speedup": 2.5, "spec_step_cost_vs_target_only": 1.25}
    assert text.startswith('{\n  "seconds": {\n    "target": 1\n  },\n')


def test_minutes_scale_the_recipe_and_flags_override_it(tmp_path, monkeypatch, capsys):
    calls = _recipe(monkeypatch)
    assert main(["train", "--out", str(tmp_path), "--seed", "3", "--threads", "1",
                 "--minutes", "2", "--draft-steps", "7", "--logit-scale", "1"]) == 0
    base = RecipeConfig(seed=3, threads=1).scaled(2.0)
    assert calls[0][1] == dataclasses.replace(base, draft_steps=7, target_logit_scale=1.0)
    assert calls[0][1] != RecipeConfig(seed=3, threads=1)
    capsys.readouterr()


def test_each_override_alone(tmp_path, monkeypatch, capsys):
    calls = _recipe(monkeypatch)
    assert main(["train", "--out", str(tmp_path), "--target-steps", "5", "--gen-prompts",
                 "6"]) == 0
    assert calls[0][1] == dataclasses.replace(RecipeConfig(), target_steps=5, gen_prompts=6)
    capsys.readouterr()


def test_draft_shape_flags_replace_only_what_they_name(tmp_path, monkeypatch, capsys):
    calls = _recipe(monkeypatch)
    assert main(["train", "--out", str(tmp_path), "--block-size", "4"]) == 0
    assert main(["train", "--out", str(tmp_path), "--draft-layers", "2", "--selector-top-k",
                 "8"]) == 0
    d = RecipeConfig().draft
    assert calls[0][1] == dataclasses.replace(RecipeConfig(),
                                              draft=dataclasses.replace(d, block_size=4))
    assert calls[1][1] == dataclasses.replace(
        RecipeConfig(), draft=dataclasses.replace(d, layers=2, selector_top_k=8))
    capsys.readouterr()


def test_target_is_checked_first_then_passed_on(tmp_path, monkeypatch, capsys):
    calls = _recipe(monkeypatch)
    checked = []

    def target_dir(value):
        checked.append(value)
        if value == "nope":
            raise InvalidInputError("no such model 'nope'")
        return tmp_path

    monkeypatch.setattr(recipe, "target_dir", target_dir)
    assert main(["train", "--out", str(tmp_path), "--target", "nope"]) == 2
    assert calls == [] and checked == ["nope"]
    assert "no such model 'nope'" in capsys.readouterr().err
    assert main(["train", "--out", str(tmp_path), "--target", "stdlib-code"]) == 0
    assert calls[0][1] == dataclasses.replace(RecipeConfig(), target_dir="stdlib-code")
    capsys.readouterr()
