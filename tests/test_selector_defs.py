"""The selector's walk against the conformance suite's float64 reference where a sweep found
classes the other tests let through: flags of greedy rows beside sampled ones, a NaN the
constraint hides, output multipliers without a softcap, and a draw source that keeps the
plain draw (the watermark's repeated contexts) under a constraint and without one."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dflash2rt.ops.batch import BlockNoise, SamplingBatch
from dflash2rt.ops.draws import DrawSource
from dflash2rt.ops.selector import SelectorParams, select

from dflash2rt_conformance.reference import selector as ref


def _inputs(seed, r=4, gamma=4, v=30, rank=3):
    g = np.random.default_rng(seed)
    logits = g.normal(0.0, 2.0, (r, gamma, v))
    proj, (a, b) = g.normal(0.0, 1.0, (r, gamma, rank)), g.normal(0.0, 1.0, (2, v, rank))
    anchor, u = g.integers(0, v, r), g.uniform(0.02, 0.98, (r, gamma))
    return logits, proj, anchor, a, b, u


def f32(x):
    return torch.tensor(np.asarray(x), dtype=torch.float32)


def _run(logits, proj, anchor, a, b, u, k, temps, mult=1.0, cap=None, mask=None, table=None):
    r = len(temps)
    got = select(f32(logits), f32(proj), torch.tensor(anchor), f32(a), f32(b),
                 SelectorParams(k, mult, cap), SamplingBatch.build(temps, [0] * r, [1.0] * r),
                 f32(u), mask=mask)
    want = ref.select(logits, proj, anchor, a, b, k, mult, cap, temps,
                      [t == 0 for t in temps], u, table=table,
                      state=None if table is None else [0] * r)
    return got, want


@pytest.mark.parametrize("mult", [2.0, 0.5, 3.0, -1.0])
def test_an_output_multiplier_without_a_softcap_scales_the_unary_scores(mult):
    logits, proj, anchor, a, b, u = _inputs(3)
    temps = [0.0, 0.9, 0.0, 1.3]
    got, want = _run(logits, proj, anchor, a, b, u, 5, temps, mult=mult)
    assert got.draft.tolist() == want["draft"].tolist()
    torch.testing.assert_close(got.q.double(), torch.from_numpy(want["q"]), atol=1e-5,
                               rtol=1e-4)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("nan_row", [0, 1])
def test_a_bad_lattice_row_flags_greedy_and_sampled_rows_beside_each_other(seed, nan_row):
    """Row 0 greedy, row 1 sampled (others mixed): a NaN in the predecessor codebook row of
    ``nan_row``'s anchor makes the rows it reads bad; exactly the reference's rows are
    flagged."""
    logits, proj, anchor, a, b, u = _inputs(seed)
    a = a.copy()
    a[anchor[nan_row]] = np.nan
    temps = [0.0, 1.0, 0.7, 0.0]
    got, want = _run(logits, proj, anchor, a, b, u, 5, temps)
    assert bool(want["bad_lattice"][nan_row])
    assert got.bad_lattice.tolist() == want["bad_lattice"].tolist()


class _Forbid:
    """A walk mask that forbids one token at every slot."""

    def __init__(self, token: int) -> None:
        self.token = token

    def allowed(self, slot, cand):
        return cand != self.token

    def advance(self, token):
        pass


@pytest.mark.parametrize("temps", [[0.0, 0.0], [1.0, 0.8], [0.0, 1.0]])
def test_a_nan_at_a_forbidden_candidate_still_flags_the_row_read(temps):
    """The row the walk reads holds NaN at a candidate the constraint forbids: masking hides
    it, yet the row is not a finite law (module docstring), so its request is flagged; a row
    without that candidate is not."""
    logits, proj, anchor, a, b, u = _inputs(5, r=2)
    t = 7
    logits = logits.copy()
    logits[0, 0, t] = 50.0                       # t is a candidate of row 0's first slot
    logits[1, :, t] = -50.0                      # and never one of row 1's
    b = b.copy()
    b[t] = np.nan                                # the lattice column of t is NaN
    got = select(f32(logits), f32(proj), torch.tensor(anchor), f32(a), f32(b),
                 SelectorParams(4), SamplingBatch.build(temps, [0, 0], [1.0, 1.0]), f32(u),
                 mask=_Forbid(t))
    assert got.bad_lattice.tolist() == [True, False]
    assert t not in got.draft[0].tolist()


class _Plain:
    """A walk drawer that keeps the plain draw for every row and flags none (what the
    watermark's drawer does on a repeated context)."""

    def pick(self, slot, law, cand, plain, greedy):
        return plain.clone(), torch.zeros(len(plain), dtype=torch.bool)


@DrawSource.register
class _Source:
    def __init__(self, u):
        self.noise = BlockNoise(walk=u, accept=u, residual=u, bonus=u[:, 0])

    def walker(self, has_fp64=None):
        return _Plain()


class _AllowAll:
    def allowed(self, slot, cand):
        return torch.ones_like(cand, dtype=torch.bool)

    def advance(self, token):
        pass


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("constrained", [False, True])
def test_a_source_that_keeps_the_plain_draw_walks_as_the_uniforms_do(seed, constrained):
    logits, proj, anchor, a, b, u = _inputs(seed, r=5, gamma=5)
    temps = [1.0, 0.0, 0.6, 1.4, 2.0]
    sampling = SamplingBatch.build(temps, [0] * 5, [1.0] * 5)
    args = (f32(logits), f32(proj), torch.tensor(anchor), f32(a), f32(b), SelectorParams(4),
            sampling)
    mask = (lambda: _AllowAll()) if constrained else (lambda: None)
    plain = select(*args, f32(u), mask=mask())
    keyed = select(*args, _Source(f32(u)), mask=mask())
    assert keyed.draft.tolist() == plain.draft.tolist()
    assert torch.equal(keyed.q, plain.q)
    assert keyed.bad_lattice.tolist() == plain.bad_lattice.tolist() == [False] * 5
    firsts = (keyed.draft == keyed.candidates[..., 0])[torch.tensor(temps) > 0]
    assert firsts.any()                          # the top candidate is drawn somewhere
