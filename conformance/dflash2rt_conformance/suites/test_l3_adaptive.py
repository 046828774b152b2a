"""L3, adaptive block size (docs/adaptive.md; docs/verification.md, "Extensions"): the block
size changes from step to step as a deterministic function of the past
(``reference/schedules.py``: the previous accept length, the committed prefix, a hash of both,
per-slot acceptance against a fixed cost table; block 1 = a target-only step, the runtime's
``sample_next`` on the bonus lattice) and drives the backend's real ``select`` + ``verify`` over
several steps on the L3 quarter tables. The joint law of the first L tokens must equal the
target's (TV ≤ 1e-12; exact on the lattice). A schedule that peeks at the current step's
acceptance coin (``reference/mutants.py``) must be detected on the same backend (TV > 1e-3): the
test is sharp for the bug it exists for. ``--dflash2rt-small`` (sizes.py): blocks 1..2, L = 3,
verify once per distinct draft."""

from __future__ import annotations

import importlib

import pytest

from dflash2rt.errors import DFlash2Error
from dflash2rt_conformance import lattice
from dflash2rt_conformance.compare import ConformanceFailure
from dflash2rt_conformance.harness import DTYPES
from dflash2rt_conformance.reference import laws, mutants, schedules

pytestmark = pytest.mark.dflash2rt_level("L3")

V, K = 4, 3
PROMPT = (0,)
SALT = "ad1"
_ROUNDS: dict = {}     # step laws shared by the schedules: they depend on (last, position, block)


def _case(sizes, name: str) -> str:
    return f"adaptive-V{V}-b{sizes.l3_adaptive_bmax}-K{K}-L{sizes.l3_adaptive_length}-{name}"


def _law(backend, sizes, schedule, dtype, case: str):
    """→ (the backend's joint law under ``schedule``, the target law, block sizes chosen)."""
    p_fn, sel = lattice.context_tables(SALT, V, K)

    def step_law(ctx, block):
        key = (id(backend), dtype, sizes, ctx[-1], len(ctx), block)
        if key not in _ROUNDS:
            try:
                if block == 1:         # target-only: the slot-0 coin exists but is not read
                    law = lattice.target_only_law_backend(backend, ctx, p_fn, dtype)
                    _ROUNDS[key] = {(k, seq): w / lattice.M_ACCEPT for seq, w in law.items()
                                    for k in range(lattice.M_ACCEPT)}
                else:
                    _ROUNDS[key] = lattice.round_law_backend(
                        backend, ctx, p_fn, sel, block - 1, dtype, dedup=sizes.l3_dedup,
                        key_first_accept=True)
            except (DFlash2Error, AssertionError) as exc:
                raise ConformanceFailure(
                    f"[L3 adaptive case={case} dtype={dtype}] the backend raised "
                    f"{type(exc).__name__} on lattice-exact inputs from context {ctx}, block "
                    f"{block}: {exc}") from exc
        return _ROUNDS[key]

    used: set = set()
    law = laws.adaptive_joint_law(step_law, schedule, PROMPT, sizes.l3_adaptive_length,
                                  lattice.M_ACCEPT, used)
    return law, laws.target_law(p_fn, PROMPT, sizes.l3_adaptive_length), used


def _check(backend, results, sizes, name, schedule, dtype_name):
    dtype = DTYPES[dtype_name]
    if dtype not in backend.dtypes:
        pytest.skip(f"backend {backend.name} does not declare {dtype_name}")
    case = _case(sizes, name)
    law, target, used = _law(backend, sizes, schedule, dtype, case)
    tv = float(laws.tv(law, target))
    results.metric("L3", f"TV {case} {dtype_name} (blocks {sorted(used)})", tv)
    head = f"[L3 adaptive case={case} dtype={dtype_name}]"
    assert len(used) > 1, f"{head} the schedule never changed the block size: {sorted(used)}"
    zero = [s for s in law if s not in target and law[s] > 0]
    assert not zero, f"{head} mass on p = 0 sequences: {[(s, law[s]) for s in zero[:5]]}"
    assert tv <= 1e-12, f"{head} TV = {tv:.4g} > 1e-12 (lattice-exact tables, blocks " \
                        f"{sorted(used)}); worst: {lattice.worst(law, target)}"


@pytest.mark.parametrize("name,dtype", [
    *[pytest.param(n, "float32", id=f"float32-{n}") for n in schedules.SCHEDULES],
    pytest.param("hashed", "bfloat16", id="bfloat16-hashed",
                 marks=pytest.mark.dflash2rt_exhaustive)])
def test_adaptive_joint_law(name, dtype, backend, results, sizes):
    _check(backend, results, sizes, name, schedules.SCHEDULES[name][0](sizes.l3_adaptive_bmax),
           dtype)


# The engine schedule's fixed cost table: a target-only step is cheap enough that a rejected
# first slot switches to block 1, and a full block pays off at the prior acceptance.
ENGINE_COSTS = {1: 1.0, 2: 1.7, 3: 2.2, 4: 2.6, 5: 3.0, 6: 3.4, 7: 3.8, 8: 4.2}


def _engine_schedule(bmax: int):
    """The engine's per-step rule, ``AdaptiveSchedule`` (``dflash2rt.engine.policy.schedule``;
    ``dflash2rt.engine.schedule`` in earlier versions), with candidates 1..bmax and a fixed cost
    table, as a function of the past: a fresh schedule replays the history — choose (its probe
    state lives there), which must give the recorded block, then observe — and chooses (one
    row)."""
    try:
        module = importlib.import_module("dflash2rt.engine.policy.schedule")
    except ModuleNotFoundError as exc:
        if exc.name not in ("dflash2rt.engine.policy", "dflash2rt.engine.policy.schedule"):
            raise
        module = importlib.import_module("dflash2rt.engine.schedule")
    cls = module.AdaptiveSchedule
    cands = tuple(range(1, bmax + 1))

    def schedule(history: tuple, ctx: tuple, peek: float) -> int:
        s = cls(cands, costs={b: ENGINE_COSTS[b] for b in cands})
        for block, acc in history:
            again = int(s.choose([0]))
            assert again == block, f"AdaptiveSchedule is not a function of the past: replaying " \
                                   f"{history} chose {again}, first {block}"
            s.observe([0], block, [acc], None)
        return int(s.choose([0]))
    return schedule


def test_adaptive_engine_schedule(backend, results, sizes):
    try:
        schedule = _engine_schedule(sizes.l3_adaptive_bmax)
    except ModuleNotFoundError as exc:
        if exc.name != "dflash2rt.engine.schedule":
            raise
        pytest.skip("AdaptiveSchedule (dflash2rt.engine.policy.schedule) is not in this dflash2rt")
    _check(backend, results, sizes, "engine-AdaptiveSchedule", schedule, "float32")


@pytest.mark.parametrize("mutant", list(mutants.SCHEDULE_MUTANTS))
def test_adaptive_peeking_schedule_is_detected(mutant, backend, results, sizes):
    """Sharpness on this backend: the same enumeration with a schedule that reads the current
    step's slot-0 acceptance coin must be far from the target law."""
    case = _case(sizes, mutant)
    law, target, used = _law(backend, sizes, mutants.peeking_schedule(sizes.l3_adaptive_bmax),
                             DTYPES["float32"], case)
    tv = float(laws.tv(law, target))
    results.metric("L3", f"TV {case} (mutant, must be > 1e-3)", tv)
    assert tv > 1e-3, f"[L3 adaptive-sharpness case={case} dtype=float32] the peeking " \
                      f"schedule was NOT detected ({mutants.SCHEDULE_MUTANTS[mutant]}): " \
                      f"TV {tv:.3g}, blocks {sorted(used)}"
