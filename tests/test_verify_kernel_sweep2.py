"""``kernels.verify`` (under the interpreter) on what ``test_verify_kernel_sweep.py`` leaves out,
against the same float64 loops (``check`` there): the keyed draw of a rejected slot whose
residual (p - q)+ is empty, which is the Gumbel-max over p; and a draft listed twice among its
slot's candidates with a tiny q on each, whose q(d) is their exact sum in the float32
formulation too (no ``bad_q`` flag: q(d) > 0)."""

from __future__ import annotations

import math

import pytest
import torch

from dflash2rt.ops.batch import BlockNoise, SamplingBatch
from dflash2rt.plugin_kit import interpreting
from dflash2rt.watermark import generate as wmgen

pytest.importorskip("triton", reason="triton is not installed (pip install 'dflash2rt[triton]')")
if not interpreting():
    pytest.skip("TRITON_INTERPRET is off in this process (a GPU is present, see conftest.py)",
                allow_module_level=True)
from dflash2rt.kernels.tuning import Tuning  # noqa: E402
from test_verify_kernel_sweep import (FP64, _marked, _noise, check,  # noqa: E402
                                      rejected_covering)

INF = math.inf


@pytest.mark.parametrize("seed", [30, 31])
def test_keyed_draw_of_an_empty_residual_is_the_gumbel_max_over_p(seed):
    """Rows rejected at slot 0 (p(d) = 0) whose q is 1 on every token p gives mass: (p - q)+
    is 0 everywhere, so the keyed draw is over p (one of the three tokens with mass), not -1
    and not a token of the empty residual."""
    g = torch.Generator().manual_seed(seed)
    r, gamma, v = 4, 2, 40
    logits = torch.full((r, gamma + 1, v), -INF)
    logits[:, 1:] = torch.randn(r, gamma, v, generator=g)
    mass = torch.stack([torch.randperm(v - 1, generator=g)[:3] + 1 for _ in range(r)])  # [R, 3]
    for i in range(r):
        logits[i, 0, mass[i]] = torch.randn(3, generator=g)
    draft = torch.zeros(r, gamma, dtype=torch.long)             # id 0: p = 0 at slot 0
    cand = torch.zeros(r, gamma, 4, dtype=torch.long)
    cand[:, 0, 1:] = mass
    cand[:, 1] = torch.tensor([0, 5, 6, 7])
    q = torch.ones(r, gamma, 4)
    q[:, 1] = 0.25
    sampling = SamplingBatch.build([1.0] * r, [0] * r, [1.0] * r)
    noise = BlockNoise.draw(torch.arange(r), torch.zeros(r, dtype=torch.long),
                            torch.full((r,), seed), gamma)
    marks = _marked(draft, seed)
    assert bool(marks.fresh[:, 0].all())
    got = check(logits, draft, cand, q, sampling, noise, Tuning(block_v=16), marks=marks)
    assert got.accept_len.tolist() == [0] * r
    assert all(int(t) in mass[i].tolist() for i, t in enumerate(got.tokens[:, 0]))


@FP64
@pytest.mark.parametrize("tiny", [2.0 ** -62, 2.0 ** -66, 2.0 ** -100])
def test_a_draft_listed_twice_with_tiny_q_has_their_sum(fp64, tiny):
    """Row 0: the slot-0 draft is candidates 0 and 1, with a tiny q on each (q(d) = 2·tiny:
    accepted at u = 1/2, not flagged, however far below the float32 path's absolute slice
    grid), and runs to the bonus; row 1 the same with q = 1/4 on each (q(d) = 1/2, taken once
    off p(d) where the slot is rejected); row 2 one hit of the tiny q."""
    g = torch.Generator().manual_seed(32)
    r, gamma, v = 3, 2, 20
    logits = torch.randn(r, gamma + 1, v, generator=g)
    cand = torch.tensor([[[3, 3, 8, 9], [4, 10, 11, 12]]] * r)
    cand[2, 0, 1] = 13
    q = torch.tensor([[[tiny, tiny, 0.5, 0.5], [0.25] * 4],
                      [[0.25, 0.25, 0.25, 0.25], [0.25] * 4],
                      [[tiny, 0.5, 0.25, 0.25], [0.25] * 4]])
    draft = cand[..., 0].clone()
    noise = _noise([[0.5, 0.0]] * r, [[0.5, 0.5]] * r, [0.5] * r)
    sampling = SamplingBatch.build([1.0] * r, [0] * r, [1.0] * r)
    got = check(logits, draft, cand, q, sampling, noise, Tuning(block_v=16), fp64)
    assert got.accept_len[0] == gamma and got.accept_len[2] == gamma
    assert got.bad_q.tolist() == [False] * r


@FP64
def test_a_rejection_at_the_last_slot_draws_that_slots_residual(fp64):
    """Slots 0 and 1 accepted (u = 0, p(d) > 0), slot 2's draft has p = 0: the emitting law is
    (p_2 - q_2)+ with slot 2's uniform, and q_2 = 1 on p_2's three likeliest tokens takes them
    out of it (slot 1's candidates and uniform are other ones)."""
    r, gamma = 4, 3
    logits, top, cand, q = rejected_covering(33, r, gamma, slot=2)
    draft = cand[..., 0].clone()
    noise = _noise([[0.0, 0.0, 0.5]] * r, [[0.1, 0.3, 0.6], [0.2, 0.9, 0.4], [0.7, 0.05, 0.95],
                                           [0.5, 0.5, 0.01]], [0.5] * r)
    sampling = SamplingBatch.build([1.0] * r, [0] * r, [1.0] * r)
    got = check(logits, draft, cand, q, sampling, noise, Tuning(block_v=16), fp64)
    assert got.accept_len.tolist() == [2] * r
    assert not any(int(t) in top[i].tolist() for i, t in enumerate(got.tokens[:, 2]))


@FP64
def test_a_target_on_a_breakpoint_draws_the_next_token_with_mass(fp64):
    """Laws of 2 or 4 tokens of equal mass (exact: 1/2, 1/4) across chunks: u·total equal to a
    prefix sum counts it (cdf ≤ target), so the draw is the next token with mass, and u = 0
    draws the first one, never a token without mass before it. Rows 0-2: the residual of a
    rejected slot 0 (p(d) = 0); row 3: the bonus."""
    r, gamma, v = 4, 2, 40
    logits = torch.full((r, gamma + 1, v), -INF)
    logits[:, :, [5, 21]] = 0.0
    logits[2, 0, [12, 30]] = 0.0
    draft = torch.tensor([[2, 5]] * 3 + [[5, 21]])
    cand = torch.stack([draft, draft + 1, draft + 2], -1)
    q = torch.full((r, gamma, 3), 0.25)
    noise = _noise([[0.5, 0.5]] * 3 + [[0.0, 0.0]], [[0.5, 0.5], [0.0, 0.0], [0.75, 0.5],
                                                      [0.5, 0.5]], [0.5] * r)
    sampling = SamplingBatch.build([1.0] * r, [0] * r, [1.0] * r)
    got = check(logits, draft, cand, q, sampling, noise, Tuning(block_v=16), fp64)
    assert got.tokens.tolist() == [[21, -1, -1], [5, -1, -1], [30, -1, -1], [5, 21, 21]]


def test_the_keyed_draw_follows_the_emitting_slots_own_freshness():
    """Fully accepted blocks (p(d) = 1): the bonus is the keyed draw at slot γ's own context
    where that context is fresh (rows 0 and 2), and the ordinary draw with the bonus uniform
    where it is not (rows 1 and 3), whatever the freshness of the row's other slots and of the
    other rows' slots."""
    g = torch.Generator().manual_seed(34)
    r, gamma, v = 4, 2, 40
    logits = torch.full((r, gamma + 1, v), -INF)
    logits[:, gamma] = torch.randn(r, v, generator=g)
    draft = torch.tensor([[4, 9], [11, 2], [30, 17], [6, 25]])
    for j in range(gamma):
        logits[torch.arange(r), j, draft[:, j]] = 0.0
    cand = torch.stack([draft, draft + 1, draft + 2], -1)
    q = torch.full((r, gamma, 3), 0.25)
    sampling = SamplingBatch.build([1.0] * r, [0] * r, [1.0] * r)
    noise = _noise([[0.5, 0.5]] * r, [[0.5, 0.5]] * r, [0.3, 0.6, 0.9, 0.1])
    marks = _marked(draft, 34)
    fresh = torch.tensor([[True, True, True], [True, True, False], [True, True, True],
                          [True, False, False]])
    marks = wmgen.Marks(marks.key, marks.ctx, fresh)
    got = check(logits, draft, cand, q, sampling, noise, Tuning(block_v=16), marks=marks)
    assert got.accept_len.tolist() == [gamma] * r


@FP64
def test_q_of_zero_on_another_candidate_is_not_broken(fp64):
    """q = 0 on candidates other than the draft (row 0: at an accepted slot, row 1: at the
    rejected one, where they take nothing off p) is a law: no ``bad_q``; q = 0 on the draft
    (row 2) is flagged."""
    g = torch.Generator().manual_seed(35)
    r, gamma, v = 3, 2, 20
    logits = torch.randn(r, gamma + 1, v, generator=g)
    cand = torch.tensor([[[3, 4, 5, 6], [7, 8, 9, 10]]] * r)
    q = torch.tensor([[[0.5, 0.0, 0.5, 0.0], [0.25] * 4],
                      [[0.25] * 4, [1.0, 0.0, 0.0, 0.0]],
                      [[0.0, 0.5, 0.5, 0.0], [0.25] * 4]])
    draft = cand[..., 0].clone()
    noise = _noise([[0.0, 0.0], [0.0, 1.0], [0.0, 0.0]], [[0.5, 0.5]] * r, [0.5] * r)
    sampling = SamplingBatch.build([1.0] * r, [0] * r, [1.0] * r)
    got = check(logits, draft, cand, q, sampling, noise, Tuning(block_v=16), fp64)
    assert got.bad_q.tolist() == [False, False, True]
    assert got.accept_len.tolist()[:2] == [gamma, 1]
