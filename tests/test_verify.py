"""Verification decisions on hand-built cases (greedy and chain speculative sampling)."""

from __future__ import annotations

import pytest
import torch

from dflash2rt.errors import InvalidInputError, NonFiniteLogitsError
from dflash2rt.ops.batch import BlockNoise, SamplingBatch
from dflash2rt.ops.sampling import inverse_cdf, target_probs
from dflash2rt.ops.verify import sample_next, verify


def _noise(r, gamma, accept=0.5, residual=0.5, bonus=0.5):
    full = lambda v: torch.full((r, gamma), v, dtype=torch.float32)  # noqa: E731
    return BlockNoise(walk=full(0.5), accept=full(accept), residual=full(residual),
                      bonus=torch.full((r,), bonus, dtype=torch.float32))


def _onehot_draft(draft, k=3):
    """A deterministic draft: candidates start with the drafted token, q one-hot on it."""
    cand = torch.stack([draft, (draft + 1) % 7, (draft + 2) % 7], dim=-1)[..., :k]
    q = torch.zeros(*draft.shape, k)
    q[..., 0] = 1.0
    return cand, q


def test_greedy_longest_prefix_and_bonus():
    logits = torch.full((2, 4, 7), -1.0)
    for j, tok in enumerate([2, 5, 1, 6]):
        logits[:, j, tok] = 3.0
    logits[1, 2, 0] = 3.0  # tie with token 1 at row 2: the lower id (0) is the target's choice
    draft = torch.tensor([[2, 5, 1], [2, 5, 1]])
    cand, q = _onehot_draft(draft)
    out = verify(logits, draft, cand, q, SamplingBatch.greedy_batch(2), _noise(2, 3))
    assert out.accept_len.tolist() == [3, 2]
    assert out.tokens.tolist() == [[2, 5, 1, 6], [2, 5, 0, -1]]


def _sampled(r=1):
    return SamplingBatch.build([1.0] * r, [0] * r, [1.0] * r)


def test_u_exactly_at_p_over_q_is_rejected_and_one_ulp_below_accepted():
    logits = torch.tensor([[[0.3, 1.1, -0.4, 0.2], [0.0, 0.0, 0.0, 0.0]]])
    p = target_probs(logits, torch.ones(1), torch.zeros(1, dtype=torch.long), torch.ones(1))
    draft = torch.tensor([[1]])
    p_d = p[0, 0, 1]
    assert float(p_d) < 0.5
    cand = torch.tensor([[[1, 0]]])
    q = torch.tensor([[[float(2 * p_d), 1 - float(2 * p_d)]]])   # u · q(d) == p(d) exactly
    u = 0.5
    assert u * float(q[0, 0, 0]) == float(p_d)
    out = verify(logits, draft, cand, q, _sampled(), _noise(1, 1, accept=u))
    assert out.accept_len.tolist() == [0]
    below = float(torch.nextafter(torch.tensor(u), torch.tensor(0.0)))
    out = verify(logits, draft, cand, q, _sampled(), _noise(1, 1, accept=below))
    assert out.accept_len.tolist() == [1]


def test_zero_probability_tokens_are_never_emitted():
    logits = torch.tensor([[[2.0, 1.0, 0.5, 0.1, -1.0]] * 3])
    sampling = SamplingBatch.build([1.0], [2], [1.0])       # top-k 2: p = 0 for ids 2, 3, 4
    draft = torch.tensor([[4, 3]])
    cand, q = _onehot_draft(draft, k=1)
    seen = set()
    for i in range(64):
        u = (2 * i + 1) / 128
        out = verify(logits, draft, cand, q, sampling, _noise(1, 2, accept=2.0 ** -24,
                                                              residual=u, bonus=u))
        assert out.accept_len.tolist() == [0]               # p(d) = 0 is never accepted
        seen.add(int(out.tokens[0, 0]))
    assert seen == {0, 1}


def test_p_equal_q_always_accepts_and_samples_the_bonus_from_p():
    logits = torch.randn(1, 3, 6, generator=torch.Generator().manual_seed(1))
    sampling = _sampled()
    p = target_probs(logits, sampling.temperature, sampling.top_k, sampling.top_p)
    cand = torch.arange(6).expand(1, 2, 6)
    q = p[:, :2].clone()
    draft = torch.tensor([[4, 1]])
    for u in (2.0 ** -24, 0.5, 1 - 2.0 ** -24):
        out = verify(logits, draft, cand, q, sampling, _noise(1, 2, accept=u, bonus=u))
        assert out.accept_len.tolist() == [2]
        assert int(out.tokens[0, 2]) == int(inverse_cdf(p[0, 2].double(), torch.tensor(u)))


@pytest.mark.parametrize("has_fp64", [True, False])
def test_zero_residual_falls_back_to_sampling_from_p(has_fp64):
    logits = torch.randn(1, 2, 6, generator=torch.Generator().manual_seed(4))
    sampling = _sampled()
    p = target_probs(logits, sampling.temperature, sampling.top_k, sampling.top_p)
    cand = torch.arange(6).view(1, 1, 6)
    q = p[:, :1].clone()
    draft = torch.tensor([[2]])
    q[0, 0, 2] = torch.nextafter(p[0, 0, 2], torch.tensor(1.0)) * 1.001  # q ≥ p everywhere
    for u_res in (0.1, 0.6, 0.95):
        out = verify(logits, draft, cand, q, sampling,
                     _noise(1, 1, accept=1 - 2.0 ** -24, residual=u_res), has_fp64=has_fp64)
        assert out.accept_len.tolist() == [0]
        want = int(inverse_cdf(p[0, 0].double(), torch.tensor(u_res)))
        assert int(out.tokens[0, 0]) == want


def test_duplicated_candidates_sum_their_mass():
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]])  # p(d) = 0.25
    cand = torch.tensor([[[2, 2, 0]]])
    q = torch.tensor([[[0.25, 0.25, 0.5]]])                 # q(2) = 0.5
    draft = torch.tensor([[2]])
    accept = verify(logits, draft, cand, q, _sampled(), _noise(1, 1, accept=0.49))
    reject = verify(logits, draft, cand, q, _sampled(), _noise(1, 1, accept=0.5))
    assert accept.accept_len.tolist() == [1] and reject.accept_len.tolist() == [0]
    assert int(reject.tokens[0, 0]) in (1, 3)               # residual mass only on 1 and 3


def test_nan_logits_raise_typed_error_or_flag_without_check():
    logits = torch.zeros(2, 3, 5)
    logits[1, 2, 3] = float("nan")
    draft = torch.tensor([[0, 0], [0, 0]])
    cand, q = _onehot_draft(draft)
    with pytest.raises(NonFiniteLogitsError, match=r"request\(s\) \[1\]"):
        verify(logits, draft, cand, q, SamplingBatch.greedy_batch(2), _noise(2, 2))
    out = verify(logits, draft, cand, q, SamplingBatch.greedy_batch(2), _noise(2, 2),
                 check=False)
    assert out.bad.tolist() == [False, True]


def test_draft_outside_its_own_law_is_an_error():
    logits = torch.zeros(1, 2, 5)
    draft = torch.tensor([[3]])
    cand = torch.tensor([[[0, 1]]])
    q = torch.tensor([[[0.5, 0.5]]])
    with pytest.raises(InvalidInputError, match="q = 0"):
        verify(logits, draft, cand, q, _sampled(), _noise(1, 1))


def test_mixed_batch_rows_equal_solo_runs():
    g = torch.Generator().manual_seed(7)
    logits = torch.randn(3, 4, 9, generator=g)
    draft = torch.randint(0, 9, (3, 3), generator=g)
    cand, q = _onehot_draft(draft)
    temps, topk, topp = [0.0, 0.9, 1.7], [0, 3, 0], [1.0, 1.0, 0.8]
    noise = BlockNoise.draw(torch.tensor([1, 2, 3]), torch.zeros(3, dtype=torch.long),
                            torch.tensor([5, 9, 0]), 3)
    both = verify(logits, draft, cand, q, SamplingBatch.build(temps, topk, topp), noise)
    for r in range(3):
        one = BlockNoise(noise.walk[r:r + 1], noise.accept[r:r + 1], noise.residual[r:r + 1],
                         noise.bonus[r:r + 1])
        solo = verify(logits[r:r + 1], draft[r:r + 1], cand[r:r + 1], q[r:r + 1],
                      SamplingBatch.build(temps[r:r + 1], topk[r:r + 1], topp[r:r + 1]), one)
        assert torch.equal(solo.tokens[0], both.tokens[r])


@pytest.mark.parametrize("has_fp64", [True, False])
def test_the_bonus_is_drawn_from_p_whatever_the_last_slot_s_candidates(has_fp64):
    """After a fully accepted block the bonus comes from p of the last row: the last slot's q
    (here on 2 of 6 tokens) takes nothing off it."""
    logits = torch.randn(1, 3, 6, generator=torch.Generator().manual_seed(2))
    sampling = _sampled()
    p = target_probs(logits, sampling.temperature, sampling.top_k, sampling.top_p)
    draft = torch.tensor([[1, 4]])
    cand = torch.tensor([[[1, 3], [4, 0]]])
    q = torch.tensor([[[1.0, 0.0], [0.75, 0.25]]])
    seen = set()
    for i in range(64):
        u = (2 * i + 1) / 128
        out = verify(logits, draft, cand, q, sampling, _noise(1, 2, accept=2.0 ** -24, bonus=u),
                     has_fp64=has_fp64)
        assert out.accept_len.tolist() == [2]
        want = int(inverse_cdf(p[0, 2].double(), torch.tensor(u)))
        assert int(out.tokens[0, 2]) == want, (u, has_fp64)
        seen.add(want)
    assert {4, 0} & seen                   # the sweep reaches the last slot's candidates


def _special(kind: str, v: int, seed: int) -> torch.Tensor:
    row = torch.randn(v, generator=torch.Generator().manual_seed(seed))
    if kind == "nan":
        row[1] = float("nan")
    elif kind == "+inf":
        row[2] = float("inf")
    elif kind == "no finite":
        row[:] = float("-inf")
    return row


KINDS = ("finite", "nan", "+inf", "no finite")


@pytest.mark.parametrize("has_fp64", [True, False])
@pytest.mark.parametrize("order", [0, 1, 2])
def test_a_row_s_flags_and_tokens_do_not_depend_on_the_other_rows(has_fp64, order):
    """Every mix of greedy / sampled rows with finite, NaN, +inf and all −inf target logits, in
    one batch in several orders: each row's bad / bad_q flags (verify and sample_next), and a
    good row's tokens, are what it gets alone."""
    combos = [(g, k) for g in (True, False) for k in KINDS]
    perm = torch.randperm(len(combos), generator=torch.Generator().manual_seed(order)).tolist()
    combos = [combos[i] for i in perm]
    r, gamma, v = len(combos), 2, 7
    logits = torch.stack([torch.stack([_special(k if j == order else "finite", v,
                                                10 * i + j) for j in range(gamma + 1)])
                          for i, (_, k) in enumerate(combos)])
    draft = torch.tensor([[i % v, (i + 3) % v] for i in range(r)])
    cand, q = _onehot_draft(draft)
    temps = [0.0 if g else 0.8 for g, _ in combos]

    def batch(rows):
        return SamplingBatch.build([temps[i] for i in rows], [0] * len(rows),
                                   [1.0] * len(rows))

    noise = _noise(r, gamma, accept=0.3, residual=0.6, bonus=0.4)
    both = verify(logits, draft, cand, q, batch(range(r)), noise, check=False,
                  has_fp64=has_fp64)
    u = torch.full((r,), 0.4)
    nxt, nxt_bad = sample_next(logits[:, 0], batch(range(r)), u, has_fp64=has_fp64)
    for i in range(r):
        solo = verify(logits[i:i + 1], draft[i:i + 1], cand[i:i + 1], q[i:i + 1], batch([i]),
                      _noise(1, gamma, accept=0.3, residual=0.6, bonus=0.4), check=False,
                      has_fp64=has_fp64)
        assert (bool(both.bad[i]), bool(both.bad_q[i])) == \
            (bool(solo.bad[0]), bool(solo.bad_q[0])), combos[i]
        if not bool(solo.bad[0]):
            assert torch.equal(both.tokens[i], solo.tokens[0]), combos[i]
        t1, b1 = sample_next(logits[i:i + 1, 0], batch([i]), u[:1], has_fp64=has_fp64)
        assert bool(nxt_bad[i]) == bool(b1[0]), combos[i]
        if not bool(b1[0]):
            assert int(nxt[i]) == int(t1[0]), combos[i]
    # the special values sit in verify row ``order`` (prefill's sample_next reads row 0 only)
    assert both.bad.tolist() == [k != "finite" for _, k in combos]
    assert nxt_bad.tolist() == [k != "finite" and order == 0 for _, k in combos]


@pytest.mark.parametrize("bad", ["draft", "candidates", "q"])
def test_each_shape_mismatch_alone_is_refused(bad):
    logits = torch.zeros(2, 3, 5)
    draft = torch.zeros(2, 2, dtype=torch.long)
    cand, q = _onehot_draft(draft)
    args = {"draft": draft, "candidates": cand, "q": q}
    args[bad] = {"draft": torch.zeros(2, 3, dtype=torch.long),
                 "candidates": torch.zeros(1, 2, 3, dtype=torch.long),
                 "q": torch.zeros(2, 2, 2)}[bad]
    with pytest.raises(InvalidInputError, match="verify shapes disagree"):
        verify(logits, args["draft"], args["candidates"], args["q"],
               SamplingBatch.greedy_batch(2), _noise(2, 2))
