"""L2: the exact law the backend's verifier induces over a uniform lattice equals the float64
reference's on the same lattice (≤ 1e-12) and puts zero mass on p = 0 tokens. On quarter
tables the lattice law is the continuous law, so it also equals the closed-form law.
``--dflash2rt-small`` (sizes.py): γ = 2 quarter blocks and a 4-point lattice on float tables."""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np
import pytest

from dflash2rt_conformance import lattice
from dflash2rt_conformance.harness import DTYPES
from dflash2rt_conformance.reference import laws
from dflash2rt_conformance.reference.sampling import target_probs
from dflash2rt_conformance.verify_lattice import verify_law_backend, verify_law_reference

pytestmark = pytest.mark.dflash2rt_level("L2")


def _quarter_block(salt, v=5, gamma=3, k=3):
    """Slot rows p_j on the quarter lattice (zeros included) and q_j with lattice-exact
    residuals; logits = log p (−inf for p = 0)."""
    g = np.random.default_rng(zlib.crc32(salt.encode()))
    p = np.stack([laws.quarter_row((salt, j), v, False) for j in range(gamma + 1)])
    q = np.stack([laws.draft_row((salt, j), v, False, p[j], k) for j in range(gamma)])
    cand = np.stack([np.concatenate([np.flatnonzero(q[j] > 0), g.permutation(
        np.flatnonzero(q[j] == 0))])[:k] for j in range(gamma)])   # support first, then fillers
    return lattice.log_or_neg(p), p, cand, np.take_along_axis(q, cand, 1)


def _float_block(salt, v=7, gamma=2, k=3):
    g = np.random.default_rng(zlib.crc32(salt.encode()))
    logits = g.normal(0, 1.5, (gamma + 1, v))
    cand = np.stack([g.choice(v, k, replace=False) for _ in range(gamma)])
    cand[0, 1] = cand[0, 0]                                     # a duplicated candidate
    q = g.dirichlet(np.ones(k), gamma).astype(np.float32).astype(np.float64)
    return logits, cand, q


def _zero_mass(law, p):
    return [(s, w) for s, w in law.items() if w > 0 and any(p[j, t] == 0 for j, t in
                                                          enumerate(s))]


# V = 3001 (> every tuned verify chunk, 1024 / 2048): the five quarter-table tokens spread over
# different chunks, so residual and bonus draws cross chunk boundaries.
SPREAD = np.array([10, 1500, 2100, 2900, 3000])


def _spread(logits, p, cand, v=3001):
    big = np.full((logits.shape[0], v), -np.inf)
    big[:, SPREAD] = logits
    p_big = np.zeros((p.shape[0], v))
    p_big[:, SPREAD] = p
    return big, p_big, SPREAD[cand]


@pytest.mark.parametrize("salt", ["q1", pytest.param("q2", marks=pytest.mark.dflash2rt_exhaustive),
                                  pytest.param("q1-v3001", marks=pytest.mark.dflash2rt_exhaustive)])
def test_quarter_tables_exact_law(salt, backend, results, sizes):
    logits, p, cand, q = _quarter_block(salt.split("-")[0], gamma=sizes.l2_quarter_gamma)
    if salt.endswith("v3001"):
        logits, p, cand = _spread(logits, p, cand)
    law = verify_law_backend(backend, logits, cand, q, 1.0, 0, 1.0, DTYPES["float32"], 4, 4)
    ref = verify_law_reference(logits, cand, q, 1.0, 0, 1.0, 4, 4)
    exact = laws.closed_form_round((), lambda c: p[len(c)],
                                   lambda c, e: _dense(cand, q, e, p.shape[1]), cand.shape[0])
    tv_ref, tv_exact = float(laws.tv(law, ref)), float(laws.tv(law, exact))
    results.metric("L2", f"TV backend vs reference, quarter [{salt}]", tv_ref)
    results.metric("L2", f"TV backend vs exact law, quarter [{salt}]", tv_exact)
    assert not _zero_mass(law, p), f"[L2 law case=quarter-{salt}] mass on p = 0 tokens: " \
                                   f"{_zero_mass(law, p)[:5]}"
    assert tv_ref <= 1e-12, f"[L2 law case=quarter-{salt}] TV(backend, reference) = " \
                            f"{tv_ref:.3g}; worst: {lattice.worst(law, ref)}"
    assert tv_exact <= 1e-12, f"[L2 law case=quarter-{salt}] TV(backend, exact) = " \
                              f"{tv_exact:.3g}; worst: {lattice.worst(law, exact)}"


def _dense(cand, q, e, v):
    out = np.zeros(v)
    np.add.at(out, cand[e], q[e])
    return out


@dataclass(frozen=True, kw_only=True)
class FloatCase:
    """A random float block (``_float_block(name)``) verified at these sampling parameters."""

    name: str
    temperature: float
    top_k: int
    top_p: float
    dtype: str
    tier: str = "small"


FLOAT_CASES = [
    FloatCase(name="plain", temperature=1.0, top_k=0, top_p=1.0, dtype="float32"),
    FloatCase(name="filtered", temperature=0.8, top_k=4, top_p=0.9, dtype="float32"),
    FloatCase(name="filtered_bf16", temperature=1.3, top_k=5, top_p=0.85, dtype="bfloat16",
              tier="exhaustive"),
    FloatCase(name="filtered_f64", temperature=0.7, top_k=3, top_p=1.0, dtype="float64",
              tier="exhaustive"),
]


@pytest.mark.parametrize("case,dtype", [     # "dtype": the session counts dtype skips by it
    pytest.param(c, c.dtype, id=c.name,
                 marks=[pytest.mark.dflash2rt_exhaustive] if c.tier == "exhaustive" else [])
    for c in FLOAT_CASES])
def test_float_tables_law_equals_reference(case, dtype, backend, results, sizes):
    name, temp, top_k, top_p = case.name, case.temperature, case.top_k, case.top_p
    if DTYPES[dtype] not in backend.dtypes:
        pytest.skip(f"backend {backend.name} does not declare {dtype}")
    logits, cand, q = _float_block(name)
    rounded = np.asarray(__import__("torch").tensor(logits).to(DTYPES[dtype]).double())
    m = sizes.l2_float_points
    law = verify_law_backend(backend, logits, cand, q, temp, top_k, top_p, DTYPES[dtype], m, m)
    t32 = float(np.float32(temp))
    ref = verify_law_reference(rounded, cand, q, t32, top_k, float(np.float32(top_p)), m, m)
    p = target_probs(rounded[None], np.array([t32]), np.array([top_k]),
                     np.array([float(np.float32(top_p))]))[0]
    tv = float(laws.tv(law, ref))
    results.metric("L2", f"TV backend vs reference, {name} {dtype}", tv)
    assert not _zero_mass(law, p), f"[L2 law case={name} dtype={dtype}] mass on p = 0 " \
                                   f"tokens: {_zero_mass(law, p)[:5]}"
    assert tv <= 1e-12, f"[L2 law case={name} dtype={dtype}] TV(backend, reference) = " \
                        f"{tv:.3g} on the {m}-point lattice; worst: {lattice.worst(law, ref)}"
