"""The recipe's knobs (``dflash2rt.train.recipe_config``) against what they must reproduce and
definitions written anew: the default recipe is the one the shipped pair's report records (every
count, rate, weight, the generation mix and the evaluation settings), ``scaled`` by hand-computed
counts for a budget of about 35 minutes, ``mix_settings`` by a bisection over the cumulative
shares of a ``random.Random`` stream; and a generation mix no run can draw from is refused by
``check`` before any work."""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import json
import math
import random

import pytest

from dflash2rt.bundled import bundled_path
from dflash2rt.errors import InvalidInputError
from dflash2rt.train.recipe_config import EVAL_SETTINGS, GEN_MIX, RecipeConfig, mix_settings


def _report() -> dict:
    return json.loads((bundled_path("stdlib-code") / "train_report.json").read_text())


def test_the_default_recipe_is_the_shipped_pairs():
    """The shipped draft was distilled by the default recipe for the shipped target: its
    report's config is the defaults' (tuples as JSON lists)."""
    cfg = dataclasses.replace(RecipeConfig(), target_dir="stdlib-code")
    assert json.loads(json.dumps(cfg.as_dict())) == _report()["config"]
    assert RecipeConfig().gen_mix == GEN_MIX
    assert RecipeConfig().as_dict()["draft"]["block_size"] == 8


def test_the_evaluation_settings_are_the_reports():
    report = _report()
    assert [(k, report[k]["temperature"], report[k]["top_p"]) for k, _, _ in EVAL_SETTINGS] \
        == list(EVAL_SETTINGS)
    assert [k for k, _, _ in EVAL_SETTINGS] == ["eval_greedy", "eval_t07_p095", "eval_t1"]


@pytest.mark.parametrize("minutes, steps, prompts, draft_steps", [
    (35.0, 1200, 5760, 4000),       # the defaults' own budget: nothing changes
    (35, 1200, 5760, 4000),
    (17.5, 600, 2880, 2000),
    (70.0, 2400, 11520, 8000),
    (7.0, 240, 1152, 800),
    (1.0, 34, 165, 114),            # 34.29, 164.57, 114.29 rounded
    (0.5, 17, 128, 57),             # 82.3 prompts: at least one batch of 128
    (0.01, 1, 128, 1),
])
def test_scaled_counts_by_hand(minutes, steps, prompts, draft_steps):
    base = RecipeConfig()
    got = base.scaled(minutes)
    assert (got.target_steps, got.gen_prompts, got.draft_steps) == (steps, prompts, draft_steps)
    assert dataclasses.replace(got, target_steps=1200, gen_prompts=5760, draft_steps=4000) == base


def test_scaled_rounds_half_to_even_and_keeps_a_batch_of_prompts():
    cfg = RecipeConfig(target_steps=5, gen_prompts=30, draft_steps=7, gen_batch=10)
    got = cfg.scaled(17.5)                       # 2.5, 15, 3.5
    assert (got.target_steps, got.gen_prompts, got.draft_steps) == (2, 15, 4)
    got = cfg.scaled(3.5)                        # 0.5, 3, 0.7
    assert (got.target_steps, got.gen_prompts, got.draft_steps) == (1, 10, 1)
    assert RecipeConfig().scaled(1e-300).check() is None


def _mix_reference(mix, count, seed):
    """Per prompt, u = r × Σ shares with r the next number of ``random.Random(seed)``; the
    setting is the first whose cumulative share exceeds u (the last one if rounding leaves
    none)."""
    rng = random.Random(seed)
    cum = list(itertools.accumulate(w for _, _, w in mix))
    picks = [mix[min(bisect.bisect_right(cum, rng.random() * cum[-1]), len(mix) - 1)]
             for _ in range(count)]
    return [float(t) for t, _, _ in picks], [float(p) for _, p, _ in picks]


@pytest.mark.parametrize("mix", [
    GEN_MIX,
    ((0.0, 1.0, 1.0),),
    ((0.5, 0.9, 0.0), (1, 1, 2.0), (0.2, 0.8, 0.0), (0.0, 1.0, 1.0)),
    ((0.3, 0.5, 3), (0.6, 0.7, 1)),
])
@pytest.mark.parametrize("seed", [0, 3, 2 ** 40])
def test_mix_settings_are_the_seeded_draws(mix, seed):
    temps, top_ps = mix_settings(mix, 300, seed)
    assert (temps, top_ps) == _mix_reference(mix, 300, seed)
    assert all(type(x) is float for x in temps + top_ps)
    shared = [(t, p) for t, p, w in mix if w > 0]
    assert set(zip(temps, top_ps)) == set(shared)


def test_mix_settings_by_hand():
    """random.Random(0) starts 0.844, 0.758, 0.421, 0.259, 0.511, 0.405, 0.784, 0.303, 0.477,
    0.583: with GEN_MIX's cumulative shares 0.4 / 0.7 / 1.0 the settings are 3 3 2 1 2 2 3 1 2 2
    (1: greedy, 2: T = 1, 3: T = 0.7 top-p 0.95)."""
    temps, top_ps = mix_settings(GEN_MIX, 10, 0)
    assert temps == [0.7, 0.7, 1.0, 0.0, 1.0, 1.0, 0.7, 0.0, 1.0, 1.0]
    assert top_ps == [0.95, 0.95, 1.0, 1.0, 1.0, 1.0, 0.95, 1.0, 1.0, 1.0]
    assert mix_settings(GEN_MIX, 0, 0) == ([], [])
    # shares need not sum to 1: twice GEN_MIX's shares draw the same settings
    double = tuple((t, p, 2 * w) for t, p, w in GEN_MIX)
    assert mix_settings(double, 10, 0) == (temps, top_ps)


@pytest.mark.parametrize("mix, match", [
    ((), "gen_mix must be .* a share > 0, got \\(\\)"),
    (((0.0, 1.0, 0.0), (1.0, 1.0, 0.0)), "a share > 0"),         # all would be the last one
    (((0.0, 1.0, -0.5), (1.0, 1.0, 1.0)), "share >= 0"),
    (((0.0, 1.0, math.nan),), "share >= 0"),
    (((0.0, 1.0, True),), "share >= 0"),
    (((0.0, 1.0),), "triples"),
    ([(0.0, 1.0, 1.0)], "triples"),
    (((0.0, 2.0, 1.0),), "gen_mix: top_p must be a number in \\(0, 1\\]"),
    (((0.7, 0.0, 1.0),), "gen_mix: top_p must be a number in \\(0, 1\\]"),
    (((-1.0, 1.0, 1.0),), "gen_mix: temperature must be a finite number >= 0"),
    (((math.inf, 1.0, 1.0),), "gen_mix: temperature must be a finite number >= 0"),
    (((1e-50, 1.0, 1.0),), "gen_mix: temperature 1e-50 rounds to 0 in float32"),
])
def test_a_generation_mix_no_run_can_draw_from_is_refused_before_any_work(mix, match):
    """The mix is drawn from after the target stage: a setting a request may not carry, or
    shares that leave nothing to draw, are refused by ``check`` with the knob's name."""
    with pytest.raises(InvalidInputError, match=match):
        RecipeConfig(gen_mix=mix).check()


def test_a_generation_mix_with_zero_shares_beside_positive_ones_passes():
    RecipeConfig(gen_mix=((0.0, 1.0, 0.0), (1, 1, 2))).check()
    RecipeConfig(gen_mix=((0.0, 1.0, 1),)).check()


def test_a_draw_on_a_share_boundary_takes_the_next_setting():
    """Setting i is drawn for u in [c_(i-1), c_i): with shares (r, 1 - r), r the stream's first
    number, the first draw is exactly c_1 and takes the second setting."""
    r = random.Random(0).random()
    mix = ((0.0, 1.0, r), (1.0, 0.9, 1 - r))
    assert mix_settings(mix, 1, 0) == ([1.0], [0.9])
    assert mix_settings(mix, 3, 0) == _mix_reference(mix, 3, 0)


def test_a_recipe_is_immutable_and_scaling_makes_a_new_one():
    cfg = RecipeConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.draft_steps = 5
    half = cfg.scaled(17.5)
    assert cfg.draft_steps == 4000 and half.draft_steps == 2000
    assert hash(RecipeConfig()) == hash(cfg) and len({cfg, RecipeConfig(), half}) == 2
