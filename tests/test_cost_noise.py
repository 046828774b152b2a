"""The seeded distortion of measured step costs (``DFLASH2RT_PERTURB_COSTS``) that proves tests
do not depend on the machine's timings: deterministic per seed, wide enough that any block can
win, applied to what a measured schedule learns only, and reported by the run."""

from __future__ import annotations

import math

from dflash2rt import get_backend
from dflash2rt.engine.policy.table import PERTURB_ENV, CostNoise, cost_noise
from dflash2rt.engine.engine import Engine
from dflash2rt.engine.request import Request, SamplingParams
from dflash2rt.engine.policy.adaptive import AdaptivePolicy
from dflash2rt.api import measured_table

from tiny_models import fixed_policy, tiny_pair


def test_factors_are_per_entry_deterministic_and_wide():
    a, b = CostNoise("7"), CostNoise("7")
    keys = [(blk, k, m) for blk in (1, 2, 4, 8, 16) for k in (1, 2, 4, 8) for m in ("greedy",
                                                                                  "sampled")]
    fa = [a.step(1.0, *key) for key in keys]
    fb = [b.step(1.0, *key) for key in keys]
    # the same seed: the same entry factor, within the per-sample jitter e^±0.5
    assert all(abs(math.log(x / y)) <= 1.0 + 1e-9 for x, y in zip(fa, fb))
    logs = [math.log(x) for x in fa]
    assert max(logs) - min(logs) > 3.0 and all(abs(v) <= 3.0 + 1e-9 for v in logs)
    other = [CostNoise("8").step(1.0, *key) for key in keys]
    assert sum(abs(math.log(x / y)) > 1.0 for x, y in zip(fa, other)) > len(keys) // 3
    assert all(math.exp(-1) <= a.call(1.0) <= math.e for _ in range(100))


def test_only_the_variable_turns_it_on_and_runs_report_it(monkeypatch):
    monkeypatch.delenv(PERTURB_ENV, raising=False)
    assert cost_noise() is None
    monkeypatch.setenv(PERTURB_ENV, "3")
    assert cost_noise() is cost_noise() and cost_noise().seed == "3"
    pair = tiny_pair("dflash2", block=4, seed=2)
    reqs = [Request((1, 2, 3), SamplingParams(max_new_tokens=6, ignore_eos=True))]
    engine = Engine(pair, get_backend("cpu"))
    engine.policy = AdaptivePolicy.measured(pair.draft.cfg.block_size,
                                           measured_table(pair, engine.backend.device), track=0)
    monkeypatch.setattr(CostNoise, "step", lambda self, sec, *key: sec * 1e4)   # to be seen
    _, s = engine.generate(reqs)
    assert s.cost_noise == f"step costs perturbed ({PERTURB_ENV}=3)" and s.calibration_steps
    # the table holds the distorted calibration, the stats the real seconds of each step
    for b, per in s.observed_costs.items():
        for k, real in per.items():
            assert s.costs[b][k] > 100 * real
    engine.policy = fixed_policy(4)        # a fixed table: nothing measured, nothing to say
    _, fixed = engine.generate(reqs)
    assert fixed.cost_noise == "" and fixed.adaptive
    _, plain = engine.generate(reqs, block_size=4)
    assert plain.cost_noise == ""
