"""L0, adaptive block size (docs/adaptive.md; docs/verification.md, "Extensions"): on the
reference, a block size chosen per step from the past alone (``reference/schedules.py``, 1 = a
target-only step with the bonus coin) keeps the joint law of the first L tokens equal to the
target's — exactly, in Fractions — and a schedule that peeks at the current step's acceptance
coin (``reference/mutants.SCHEDULE_MUTANTS``) is detected (TV > 1e-3)."""

from __future__ import annotations

import pytest

from dflash2rt_conformance.reference import laws, mutants, schedules

pytestmark = pytest.mark.dflash2rt_level("L0")

PROMPT = (0,)
M = 4
V, BMAX, LENGTH = 3, 3, 3        # blocks 1..3 (γ ≤ 2), the first 3 tokens


def _law(schedule, salt: str, exact: bool):
    p_fn, q_fn = laws.quarter_tables(V, exact, salt)
    memo: dict = {}

    def step_law(ctx, block):
        if (ctx, block) not in memo:
            memo[(ctx, block)] = laws.enumerate_law(
                lambda d: laws.spec_step(d, ctx, p_fn, q_fn, block), M, exact)
        return memo[(ctx, block)]

    used: set = set()
    law = laws.adaptive_joint_law(step_law, schedule, PROMPT, LENGTH, M, used)
    return law, laws.target_law(p_fn, PROMPT, LENGTH), used


@pytest.mark.parametrize("name", list(schedules.SCHEDULES))
def test_adaptive_law_in_fractions(name, results):
    law, target, used = _law(schedules.SCHEDULES[name][0](BMAX), "ad", exact=True)
    tv = laws.tv(law, target)
    case = f"adaptive-fraction-V{V}-b{BMAX}-L{LENGTH}-{name}"
    results.metric("L0", f"TV Fraction {case} (blocks {sorted(used)})", str(tv))
    assert len(used) > 1, f"[L0 law case={case}] the schedule never changed the block: {used}"
    assert tv == 0, f"[L0 law case={case}] TV = {tv} ≠ 0 (blocks {sorted(used)})"
    assert sum(law.values()) == 1


@pytest.mark.parametrize("mutant", list(mutants.SCHEDULE_MUTANTS))
def test_schedule_mutation_is_detected(mutant, results):
    law, target, used = _law(mutants.peeking_schedule(BMAX), "ad", exact=False)
    tv = float(laws.tv(law, target))
    results.metric("L0", f"mutant {mutant} TV", tv)
    assert tv > 1e-3, f"[L0 mutation case={mutant}] NOT detected " \
                      f"({mutants.SCHEDULE_MUTANTS[mutant]}): TV {tv:.3g}"
