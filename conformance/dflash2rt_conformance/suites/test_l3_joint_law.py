"""L3: the joint law of the first L tokens over several rounds of the backend's select + verify,
with context-dependent tables, equals the target's law (TV ≤ 1e-12; exact on the lattice).
An off-by-one verify row shows TV ≈ 0.9 here and is invisible with identical rows. A request's
own candidate count (``SamplingParams.num_candidates``): each row limited to its count, then
the backend's select at a wider batch width (candidates past the count at −inf, q = 0).
``--dflash2rt-small`` (sizes.py): γ = 2, L = 2, verify once per distinct draft. Block sizes that
change from step to step (adaptive speculation): ``test_l3_adaptive.py``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dflash2rt.engine import candidates
from dflash2rt.errors import DFlash2Error
from dflash2rt_conformance import lattice
from dflash2rt_conformance.compare import ConformanceFailure
from dflash2rt_conformance.harness import DTYPES
from dflash2rt_conformance.reference import laws

pytestmark = pytest.mark.dflash2rt_level("L3")

V, K = 4, 3
PROMPT = (0,)


def _case(sizes, salt: str) -> str:
    return f"V{V}-g{sizes.l3_gamma}-K{K}-L{sizes.l3_length}-{salt}"


def _tables(salt: str):
    return lattice.context_tables(salt, V, K)


def _joint(backend, sizes, salt, dtype, temperature=1.0, own=None, width=None):
    """``own``, ``width``: tables of ``own`` candidates per slot, selected at ``width``
    through the engine's limit of every row to ``own`` (default: K candidates, no limit)."""
    p_fn, sel = _tables(salt) if own is None else lattice.context_tables(salt, V, own)
    def limit(x):
        r = x.shape[0]
        return candidates.limit(x, [own] * r, torch.full((r,), own, device=x.device), width)

    if own is not None:
        sel = lattice.SelectorTables(V, width, sel.q_fn, sel.cand_fn)
    memo: dict = {}
    case = _case(sizes, salt)

    def round_law(ctx):        # the backend's inputs depend on (last token, position) only
        if (ctx[-1], len(ctx)) not in memo:
            try:
                memo[(ctx[-1], len(ctx))] = lattice.round_law_backend(
                    backend, ctx, p_fn, sel, sizes.l3_gamma, dtype, temperature,
                    dedup=sizes.l3_dedup, limit=None if own is None else limit)
            except DFlash2Error as exc:
                raise ConformanceFailure(
                    f"[L3 joint law case={case} dtype={dtype}] the backend raised "
                    f"{type(exc).__name__} on lattice-exact inputs from context {ctx}: {exc}"
                ) from exc
        return {k: v for k, v in memo[(ctx[-1], len(ctx))].items()}

    law = laws.joint_law(round_law, PROMPT, sizes.l3_length)
    return law, p_fn


@pytest.mark.parametrize("salt,dtype", [
    pytest.param("s1", "float32", id="float32-s1"),
    pytest.param("s2", "float32", id="float32-s2", marks=pytest.mark.dflash2rt_exhaustive),
    pytest.param("s3", "bfloat16", id="bfloat16-s3", marks=pytest.mark.dflash2rt_exhaustive)])
def test_joint_law_sampled(salt, dtype, backend, results, sizes):
    if DTYPES[dtype] not in backend.dtypes:
        pytest.skip(f"backend {backend.name} does not declare {dtype}")
    law, p_fn = _joint(backend, sizes, salt, DTYPES[dtype])
    target = laws.target_law(p_fn, PROMPT, sizes.l3_length)
    tv = float(laws.tv(law, target))
    case = _case(sizes, salt)
    results.metric("L3", f"TV sampled {case} {dtype}", tv)
    zero = [s for s in law if s not in target and law[s] > 0]
    assert not zero, f"[L3 joint law case={case} dtype={dtype}] mass on p = 0 sequences: " \
                     f"{[(s, law[s]) for s in zero[:5]]}"
    assert tv <= 1e-12, f"[L3 joint law case={case} dtype={dtype}] TV = {tv:.4g} > 1e-12 " \
                        f"(lattice-exact tables); worst: {lattice.worst(law, target)}"


def test_joint_law_greedy(backend, results, sizes):
    """T = 0: the emitted chain is the target's greedy chain (lowest id on ties)."""
    law, p_fn = _joint(backend, sizes, "g1", torch.float32, temperature=0.0)
    chain, ctx = (), PROMPT
    for _ in range(sizes.l3_length):
        p = np.asarray(p_fn(ctx + chain), float)
        chain += (int(np.flatnonzero(p == p.max())[0]),)
    assert law == {chain: 1.0}, f"[L3 greedy case=V{V}-g{sizes.l3_gamma}-L" \
                                f"{sizes.l3_length}] law {law} ≠ {chain}"
    results.metric("L3", "greedy chain", str(chain))


@pytest.mark.parametrize("own,width,salt", [
    pytest.param(2, 4, "c1", id="own2-width4"),
    pytest.param(2, 3, "c2", id="own2-width3"),
    pytest.param(3, 4, "c3", id="own3-width4", marks=pytest.mark.dflash2rt_exhaustive)])
def test_joint_law_at_a_request_s_own_candidate_count(own, width, salt, backend, results,
                                                     sizes):
    """Rows limited to ``own`` candidates and selected at ``width`` > ``own`` (|S| < K): the
    joint law is still the target's, with no mass on p = 0 sequences."""
    law, p_fn = _joint(backend, sizes, salt, torch.float32, own=own, width=width)
    target = laws.target_law(p_fn, PROMPT, sizes.l3_length)
    tv = float(laws.tv(law, target))
    case = f"V{V}-g{sizes.l3_gamma}-own{own}-width{width}-L{sizes.l3_length}-{salt}"
    results.metric("L3", f"TV sampled {case}", tv)
    zero = [s for s in law if s not in target and law[s] > 0]
    assert not zero, f"[L3 candidate count case={case}] mass on p = 0 sequences: {zero[:5]}"
    assert tv <= 1e-12, f"[L3 candidate count case={case}] TV = {tv:.4g} > 1e-12; worst: " \
                        f"{lattice.worst(law, target)}"
