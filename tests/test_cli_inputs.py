"""Bad values for ``train``, ``synth``, ``conformance`` and ``run --logit-bias``: each a typed
error naming what to fix, raised before any work (no tokenizer trained, no file written, no
pytest session), and never a value read as another one (a draft of 0 layers read as the
published 5, a shard of 0 GB as one tensor a shard)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from dflash2rt.cli import main
from dflash2rt.errors import InvalidInputError, SamplingParamsError
from dflash2rt.train.draft_init import DraftShape
from dflash2rt.train.recipe_config import RecipeConfig

COUNTS = ("threads", "vocab_size", "target_steps", "target_batch", "seq_len", "gen_prompts",
          "gen_new_tokens", "gen_batch", "soft_top", "draft_steps", "draft_seqs_per_step",
          "draft_anchors", "heldout_prompts", "eval_new_tokens")


def test_the_default_recipe_and_its_smallest_counts_pass():
    RecipeConfig().check()
    ones = dataclasses.replace(RecipeConfig(), **{k: 1 for k in COUNTS},
                               draft=DraftShape(layers=1, block_size=2, selector_top_k=1),
                               gen_prompt_tokens=(1, 1), heldout_tokens=(1, 1), max_files=1,
                               slot_decay=0, selector_weight=0, soft_weight=0, hard_weight=0)
    ones.check()


@pytest.mark.parametrize("name", COUNTS)
@pytest.mark.parametrize("value", [0, -1, 1.5, True, "2", None])
def test_each_count_below_one_or_not_an_integer(name, value):
    cfg = dataclasses.replace(RecipeConfig(), **{name: value})
    with pytest.raises(InvalidInputError, match=f"{name} must be an integer >= 1"):
        cfg.check()


@pytest.mark.parametrize("name", ["target_logit_scale", "target_lr", "draft_lr"])
@pytest.mark.parametrize("value", [0, 0.0, -1.0, math.nan, math.inf, "1", None, True])
def test_scales_and_rates_are_finite_and_positive(name, value):
    with pytest.raises(InvalidInputError, match=f"{name} must be a finite number > 0"):
        dataclasses.replace(RecipeConfig(), **{name: value}).check()
    dataclasses.replace(RecipeConfig(), **{name: 1e-9}).check()


@pytest.mark.parametrize("name", ["slot_decay", "selector_weight", "soft_weight", "hard_weight"])
@pytest.mark.parametrize("value", [-1e-9, math.nan, math.inf, "0", None])
def test_weights_are_finite_and_not_negative(name, value):
    with pytest.raises(InvalidInputError, match=f"{name} must be a finite number >= 0"):
        dataclasses.replace(RecipeConfig(), **{name: value}).check()


@pytest.mark.parametrize("name", ["gen_prompt_tokens", "heldout_tokens"])
@pytest.mark.parametrize("value", [(0, 5), (6, 5), (1,), [1, 5], (1.0, 5), 5])
def test_token_ranges(name, value):
    with pytest.raises(InvalidInputError, match=f"{name} must be \\(low, high\\)"):
        dataclasses.replace(RecipeConfig(), **{name: value}).check()


@pytest.mark.parametrize("shape, match", [
    (dict(layers=0), "draft layers must be an integer >= 1"),
    (dict(block_size=1), "draft block_size must be an integer >= 2"),
    (dict(block_size=0), "draft block_size must be an integer >= 2"),
    (dict(selector_top_k=0), "draft selector_top_k must be an integer >= 1"),
    (dict(selector_top_k=2049), "at most the vocabulary \\(2048\\), got 2049"),
])
def test_the_draft_shape(shape, match):
    cfg = dataclasses.replace(RecipeConfig(), draft=dataclasses.replace(DraftShape(), **shape))
    with pytest.raises(InvalidInputError, match=match):
        cfg.check()
    dataclasses.replace(cfg, draft=dataclasses.replace(DraftShape(), selector_top_k=2048)).check()


@pytest.mark.parametrize("seed", [-1, 2 ** 63, 1.0, None])
def test_the_seed(seed):
    with pytest.raises(InvalidInputError, match="seed must be an integer in \\[0, 2\\*\\*63\\)"):
        dataclasses.replace(RecipeConfig(), seed=seed).check()
    dataclasses.replace(RecipeConfig(), seed=2 ** 63 - 1).check()


@pytest.mark.parametrize("minutes", [0, -1, math.nan, math.inf, "5", True])
def test_minutes_are_a_positive_budget(minutes):
    with pytest.raises(InvalidInputError, match="minutes must be a number > 0"):
        RecipeConfig().scaled(minutes)


def test_scaling_keeps_counts_at_least_one():
    small = RecipeConfig().scaled(1e-6)
    small.check()
    assert (small.target_steps, small.draft_steps) == (1, 1)
    assert small.gen_prompts == small.gen_batch


def _no_work(monkeypatch):
    from dflash2rt.train import recipe

    def fail(*a, **k):
        raise AssertionError("the recipe started working on a config it should have refused")
    monkeypatch.setattr(recipe, "_tokenize_corpus", fail)


@pytest.mark.parametrize("flags, match", [
    (["--threads", "0"], "threads must be an integer >= 1"),
    (["--minutes", "0"], "minutes must be a number > 0"),
    (["--minutes", "-3"], "minutes must be a number > 0"),
    (["--target-steps", "0"], "target_steps must be an integer >= 1"),
    (["--draft-steps", "-1"], "draft_steps must be an integer >= 1"),
    (["--gen-prompts", "0"], "gen_prompts must be an integer >= 1"),
    (["--logit-scale", "0"], "target_logit_scale must be a finite number > 0"),
    (["--logit-scale", "nan"], "target_logit_scale must be a finite number > 0"),
    (["--block-size", "1"], "draft block_size must be an integer >= 2"),
    (["--selector-top-k", "0"], "draft selector_top_k must be an integer >= 1"),
    (["--draft-layers", "0"], "draft layers must be an integer >= 1"),
])
def test_train_refuses_before_any_work(flags, match, tmp_path, monkeypatch, capsys):
    _no_work(monkeypatch)
    assert main(["train", "--out", str(tmp_path / "o"), *flags]) == 2
    err = capsys.readouterr().err
    assert "InvalidInputError" in err and match in err.replace("\\", "")
    assert not (tmp_path / "o").exists()


def test_train_into_a_directory_it_cannot_create(tmp_path, monkeypatch):
    from dflash2rt.train.recipe import run_recipe

    _no_work(monkeypatch)
    (tmp_path / "file").write_text("x")
    with pytest.raises(InvalidInputError, match="output directory .*cannot create it"):
        run_recipe(tmp_path / "file" / "sub", RecipeConfig())


def test_synth_draft_layers_zero_is_refused_not_read_as_the_published_count(tmp_path):
    from dflash2rt.synth import synthesize
    from dflash2rt.synth.shapes import draft_config, get_shape

    shape = get_shape("toy-qwen3")
    for bad in (0, -1, 1.0, True):
        with pytest.raises(InvalidInputError, match="draft_layers must be an integer >= 1"):
            draft_config(shape, bad)
        with pytest.raises(InvalidInputError, match="draft_layers must be an integer >= 1"):
            synthesize("toy-qwen3", tmp_path / "x", draft_layers=bad)
    assert draft_config(shape, 2)["num_hidden_layers"] == 2
    assert draft_config(shape, None)["num_hidden_layers"] == 5          # the published count
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("gb", ["0", "-1", "nan", "inf", "1e-12"])
def test_synth_shard_size_must_be_positive(gb, tmp_path, capsys):
    assert main(["synth", "--shape", "toy-qwen3", "--out", str(tmp_path / "s"),
                 "--shard-gb", gb]) == 2
    err = capsys.readouterr().err
    assert "InvalidInputError" in err and ("--shard-gb" in err)
    assert not (tmp_path / "s").exists()


def test_synth_into_a_directory_it_cannot_create(tmp_path):
    from dflash2rt.synth import synthesize

    (tmp_path / "file").write_text("x")
    with pytest.raises(InvalidInputError, match="output directory .*cannot create it"):
        synthesize("toy-qwen3", tmp_path / "file" / "sub")


@pytest.mark.parametrize("backend", ["nope", "nope:0", "cpux"])
def test_conformance_on_an_unknown_backend_is_an_error_not_a_report(backend, monkeypatch,
                                                                      capsys):
    import pytest as pytest_mod

    monkeypatch.setattr(pytest_mod, "main", lambda args: pytest_mod.fail("pytest started"))
    assert main(["conformance", "--backend", backend]) == 2
    err = capsys.readouterr().err
    assert "UnknownBackendError" in err and "installed backends" in err


@pytest.mark.parametrize("backend", ["cpu", "cpu:0", "auto"])
def test_conformance_on_an_installed_backend_starts_the_suite(backend, monkeypatch):
    import pytest as pytest_mod

    seen = []
    monkeypatch.setattr(pytest_mod, "main", lambda args: seen.append(args) or 0)
    assert main(["conformance", "--backend", backend]) == 0
    assert seen and seen[0][seen[0].index("--dflash2rt-backend") + 1] == backend


def test_logit_bias_flags():
    from dflash2rt.cli.run_cmd import _logit_bias

    assert _logit_bias(["5=1", "7=-2.5", "0=100"]) == {5: 1.0, 7: -2.5, 0: 100.0}
    with pytest.raises(SamplingParamsError, match="token 5 twice \\(1 and 2\\)"):
        _logit_bias(["5=1", "7=0", "5=2"])
    with pytest.raises(SamplingParamsError, match="token 5 twice"):
        _logit_bias(["5=1", "05=1"])
    for bad in ("5", "a=1", "5=x", "=1", "5="):
        with pytest.raises(SamplingParamsError, match="ID=BIAS"):
            _logit_bias([bad])



def test_run_logprobs_without_json_is_refused_before_loading(monkeypatch, capsys):
    """The text output prints no log-probabilities: asking for them without --json is an error
    (never computed and dropped), raised before a model is loaded."""
    from dflash2rt.cli import run_cmd

    def refuse(*a, **k):
        raise AssertionError("a model was loaded before --logprobs was checked")
    monkeypatch.setattr(run_cmd, "_load", refuse)
    monkeypatch.setattr(run_cmd, "_run_tp", refuse)
    for extra in ([], ["--tp", "2"]):
        assert main(["run", "--backend", "cpu", "--prompt", "x", "--logprobs", "2", *extra]) == 2
        assert "--logprobs needs --json" in capsys.readouterr().err
