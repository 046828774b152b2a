"""Compile variants on the interpreter: a run's keys, one keyed variant, the plan covers them."""

from __future__ import annotations

import pytest
import torch

from dflash2rt.plugin_kit import interpreting

pytest.importorskip("triton", reason="triton is not installed (pip install 'dflash2rt[triton]')")
if not interpreting():
    pytest.skip("TRITON_INTERPRET is off in this process (a GPU is present, see conftest.py): the "
                "kernels compile for the device there", allow_module_level=True)

from dflash2rt.api import resolve_model  # noqa: E402
from dflash2rt.engine.engine import Engine  # noqa: E402
from dflash2rt.engine.policy.schedule import default_candidates  # noqa: E402
from dflash2rt.engine.precompile import kernel_plan  # noqa: E402
from dflash2rt.engine.request import Request, SamplingParams  # noqa: E402
from dflash2rt.kernels.launch import recording  # noqa: E402
from dflash2rt.watermark import WatermarkKey  # noqa: E402

from backends import available  # noqa: E402
from tiny_models import fixed_policy  # noqa: E402

WALK, VERIFY = "selector._walk_kernel", "verify._verify_kernel"
KEY = WatermarkKey(bytes(range(32)))


@pytest.fixture(scope="module")
def setup():
    backend = available()
    return resolve_model("stdlib-code", "cpu", torch.float32), backend


def _requests(pair, temps, new=8):
    prompts = ("def parse(self, text):\n", "import os\n", "class Node:\n")
    return [Request(tuple(pair.tokenizer.encode(p)),
                    SamplingParams(max_new_tokens=new, temperature=t, seed=i))
            for i, (p, t) in enumerate(zip(prompts, temps))]


@pytest.fixture(scope="module")
def runs(setup):
    """Every launch of: a watermarked adaptive call (a fixed cost table: no timing decides)
    of sampled and greedy requests, the same at a fixed block 2 (γ = 1) and 5, then plain
    greedy and plain sampled adaptive calls → (recorded launches, spec blocks per call)."""
    pair, backend = setup
    blocks = []
    with recording() as rec, Engine(pair, backend) as engine:
        engine.policy = fixed_policy(pair.draft.cfg.block_size)
        for temps, block, key in (((1.0, 0.7, 0.0), None, KEY), ((1.0, 0.0), 2, KEY),
                                  ((0.7,), 5, KEY), ((0.0, 0.0), None, None),
                                  ((1.0, 0.7), None, None)):
            engine.generate(_requests(pair, temps), block_size=block, watermark=key)
            blocks.append({b for b in engine.runner.blocks_used if b > 1})
    return rec, blocks


@pytest.mark.slow                   # five engine calls on the interpreter (over 10 s on 2 cores)
def test_watermarked_runs_launch_one_variant_of_the_keyed_kernels(runs):
    """Whatever the block sizes (γ = 1, powers of two and others), the keyed walk and the keyed
    verification compile once each: γ is neither specialized nor a tile."""
    rec, blocks = runs
    marked = set().union(*blocks[:3])
    assert len(marked) >= 3 and 2 in marked and 5 in marked, blocks
    assert len(rec.variants(WALK, MARKED=True)) == 1
    assert len(rec.variants(VERIFY, MARKED=True)) == 1
    for name in (WALK, VERIFY):                     # greedy, sampled, watermarked: one each
        assert len(rec.variants(name)) == 3, [x.constexprs() for x in rec.variants(name)]


@pytest.mark.slow                   # the same five calls (shared with the test above)
def test_the_compile_plan_covers_every_variant_the_runs_launch(setup, runs):
    pair, backend = setup
    rec, blocks = runs
    planned = {x.key for x in kernel_plan(pair, backend, set(
        default_candidates(pair.draft.cfg.block_size)) | set().union(*blocks))}
    missing = rec.keys() - planned
    assert not missing, sorted(k[0] for k in missing)


def test_the_plan_has_one_keyed_walk_and_verify_for_every_block(setup):
    """The adaptive candidates and odd block sizes: one variant per kernel and sampling mode;
    conv's two (prepare, finish) and attention's tiles."""
    pair, backend = setup
    cands = default_candidates(pair.draft.cfg.block_size)
    plan = kernel_plan(pair, backend, cands)
    by = {}
    for x in plan:
        by.setdefault(x.name, []).append(x.constexprs())
    assert sorted((c["SAMPLED"], c["MARKED"]) for c in by[WALK]) == \
        [(False, False), (True, False), (True, True)]
    assert sorted((c["SAMPLED"], c["MARKED"]) for c in by[VERIFY]) == \
        [(False, False), (True, False), (True, True)]
    assert sorted(c["RESIDUAL"] for c in by["conv._conv_kernel"]) == [False, True]
    more = kernel_plan(pair, backend, (*cands, 3, 5, 7, 12), prefill=False)
    assert {x.key for x in more} <= {x.key for x in plan}


def test_a_plan_launches_nothing_and_leaves_the_pair_alone(setup):
    pair, backend = setup
    before = {n: p.clone() for n, p in pair.target.named_parameters()}
    with recording() as rec:
        plan = kernel_plan(pair, backend, (2,))
    assert plan and rec.count == 0                     # collected, never run
    assert all(torch.equal(p, before[n]) for n, p in pair.target.named_parameters())
    assert all(p.device.type == "cpu" for p in pair.target.parameters())
