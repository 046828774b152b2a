"""``dflash2rt run``'s stats lines against whole lines written out by hand from hand-set stats:
each optional part (calibration, cost noise, adaptive blocks, candidates, fallbacks, model pass)
present and absent alone, the rounding of every number."""

from __future__ import annotations

from types import SimpleNamespace

from dflash2rt.cli.stats_line import counts, spec_summary, stats_line, tp_stats_line


def _stats(**kw) -> SimpleNamespace:
    base = dict(mode="speculative", backend="cpu", generated=120, wall_s=1.2345,
                tokens_per_s=97.25, tau=3.14159, block_size=8, adaptive=False,
                block_sizes={16: 1, 4: 2}, candidates={}, block_verified=0, accept_hist=[1, 0, 2],
                time={"draft": 0.12345, "verify": 0.5}, calibration_steps=0,
                calibration_s=0.0, cost_noise="", fallbacks=[], model_pass="",
                num_drafts=5, num_accepted_tokens=7, num_draft_tokens=35,
                mean_acceptance_length=2.4, acceptance_rate_per_pos=[0.5, 0.125],
                conditional_acceptance_rate_per_pos=[0.5, 0.25],
                tensor_parallel="tp 2")
    base.update(kw)
    return SimpleNamespace(**base)


SPEC = ("5 drafts, 7/35 draft tokens accepted, mean acceptance length 2.40, per position "
        "[0.50 0.12] (of drafts; of those reaching it [0.50 0.25])")
HEAD = "[speculative on cpu] 120 tokens in 1.23s = 97.2 tok/s, tau 3.14"


def test_spec_summary():
    assert spec_summary(_stats()) == SPEC
    empty = _stats(acceptance_rate_per_pos=[], conditional_acceptance_rate_per_pos=[])
    assert spec_summary(empty).endswith("per position [] (of drafts; of those reaching it [])")


def test_counts():
    assert counts(_stats()) == ""
    assert counts(_stats(candidates={16: 2})) == "candidates 16x2, "
    assert counts(_stats(candidates={64: 1, 16: 2})) == "candidates 64x1, 16x2, "


def test_plain_line():
    assert stats_line(_stats()) == (
        f"{HEAD} (block 8), accept histogram [1, 0, 2]; {SPEC}; draft 0.123s, verify 0.500s; "
        "fallbacks: none")


def test_each_optional_part_alone():
    tail = "; draft 0.123s, verify 0.500s"
    assert stats_line(_stats(calibration_steps=3, calibration_s=0.25)) == (
        f"{HEAD} (block 8), accept histogram [1, 0, 2]; {SPEC}{tail}, calibration 0.250s "
        "(3 steps); fallbacks: none")
    assert stats_line(_stats(calibration_s=0.25)) == stats_line(_stats())
    assert stats_line(_stats(cost_noise="cost noise 2%")) == (
        f"{HEAD} (block 8), accept histogram [1, 0, 2]; {SPEC}{tail}, cost noise 2%; "
        "fallbacks: none")
    assert stats_line(_stats(adaptive=True)) == (
        f"{HEAD} (adaptive blocks 4x2, 16x1), accept histogram [1, 0, 2]; {SPEC}{tail}; "
        "fallbacks: none")
    assert stats_line(_stats(candidates={4: 1})) == (
        f"{HEAD} (block 8), candidates 4x1, accept histogram [1, 0, 2]; {SPEC}{tail}; "
        "fallbacks: none")
    assert stats_line(_stats(fallbacks=["verify: x"])) == (
        f"{HEAD} (block 8), accept histogram [1, 0, 2]; {SPEC}{tail}; "
        "fallbacks: ['verify: x']")
    assert stats_line(_stats(model_pass="model pass 1.0s")) == (
        f"{HEAD} (block 8), accept histogram [1, 0, 2]; {SPEC}{tail}; "
        "fallbacks: none; model pass 1.0s")


def test_all_parts_together():
    s = _stats(calibration_steps=1, calibration_s=0.0004, cost_noise="noisy", adaptive=True,
               candidates={2: 3}, fallbacks="f", model_pass="m", time={"host": 0.0014})
    assert stats_line(s) == (
        f"{HEAD} (adaptive blocks 4x2, 16x1), candidates 2x3, accept histogram [1, 0, 2]; "
        f"{SPEC}; host 0.001s, calibration 0.000s (1 steps), noisy; fallbacks: f; m")


def test_tp_line():
    assert tp_stats_line(_stats()) == (
        "[speculative on cpu, tp 2] 120 tokens in 1.23s = 97.2 tok/s, tau 3.14; "
        f"{SPEC}; fallbacks: none")
    assert tp_stats_line(_stats(candidates={3: 1}, fallbacks=["x"])) == (
        "[speculative on cpu, tp 2] 120 tokens in 1.23s = 97.2 tok/s, tau 3.14; candidates 3x1, "
        f"{SPEC}; fallbacks: ['x']")


def test_no_stage_times_leave_no_stray_separator():
    """Without stage times the calibration and noise parts open the section themselves."""
    line = stats_line(_stats(time={}, calibration_steps=2, calibration_s=0.5,
                             cost_noise="cost noise 3%"))
    assert f"{SPEC}; calibration 0.500s (2 steps), cost noise 3%; fallbacks: none" in line
