"""Block verification (``ops.block_verify``, ``ops.verify`` with ``block``): its output law is
the target's, by exact enumeration of every draft path of small context-dependent laws with the
module's own keep probabilities and residuals; it keeps at least as many drafts in expectation
as token verification (more on some cases); its decisions equal a float64 loop written here
from the rule's definition; greedy rows, unflagged rows and bad draft laws behave as under
token verification."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dflash2rt.errors import BackendError, InvalidInputError
from dflash2rt.ops import block_verify
from dflash2rt.ops.batch import BlockNoise, SamplingBatch
from dflash2rt.ops.sampling import target_probs
from dflash2rt.ops.verify import verify


def _laws(rng, v, gamma, zero=0.3):
    """Context-dependent target and draft laws: prefix tuple → law over v tokens, some zeros."""
    def law():
        x = rng.random(v) ** 3
        x[rng.random(v) < zero] = 0.0
        if x.sum() == 0:
            x[rng.integers(v)] = 1.0
        return x / x.sum()
    mb, ms = {}, {}
    for n in range(gamma + 1):
        for pre in itertools.product(range(v), repeat=n):
            mb[pre], ms[pre] = law(), law()
    return mb, ms


def _paths(mb, ms, v, gamma):
    """Every draft path with positive draft probability: (path, its probability, p [γ+1, V],
    q [γ, V]) as the verify pass sees them."""
    out = []
    for x in itertools.product(range(v), repeat=gamma):
        px = np.prod([ms[x[:i]][x[i]] for i in range(gamma)])
        if px > 0:
            p = np.stack([mb[x[:j]] for j in range(gamma + 1)])
            q = np.stack([ms[x[:j]] for j in range(gamma)])
            out.append((x, px, p, q))
    return out


def _module_law(paths, v, gamma):
    """The module's output law: for each path and each τ, P(τ) from its keep probabilities and
    the emitted law it returns when the uniforms force that τ."""
    n = len(paths)
    p = torch.tensor(np.stack([c[2] for c in paths]), dtype=torch.float64)       # [n, γ+1, V]
    q = torch.tensor(np.stack([c[3] for c in paths]), dtype=torch.float64)       # [n, γ, V]
    draft = torch.tensor([c[0] for c in paths], dtype=torch.int64)               # [n, γ]
    cand = torch.arange(v).expand(n, gamma, v).contiguous()
    q_d = q.gather(-1, draft.unsqueeze(-1)).squeeze(-1)
    w = block_verify.keep_weights(p[:, :gamma].gather(-1, draft.unsqueeze(-1)).squeeze(-1), q_d)
    h = block_verify.keep_probs(w, p, *block_verify.distinct(cand, q)).numpy()   # [n, γ]
    out: dict[tuple, float] = {}
    kept = 0.0
    for t in range(gamma + 1):
        accept = torch.ones(n, gamma, dtype=torch.float64)       # 1.0 < h never holds
        if t:
            accept[:, t - 1] = 0.0                               # 0 < h_t where h_t > 0
        tau, law, _ = block_verify.verify_block_sampled(
            p, draft, cand, q, q_d, accept, torch.full((n, gamma), 0.5), torch.full((n,), 0.5))
        law = law.numpy()
        for i, (x, px, _, _) in enumerate(paths):
            pt = (h[i, t - 1] if t else 1.0) * np.prod(1.0 - h[i, t:])
            if pt <= 0:
                continue
            assert int(tau[i]) == t
            kept += px * pt * t
            for y in range(v):
                if law[i, y] > 0:
                    s = x[:t] + (y,)
                    out[s] = out.get(s, 0.0) + px * pt * law[i, y] / law[i].sum()
    return out, kept


def _token_kept(paths, gamma):
    """Token verification's expected kept drafts: Σ_i Π_{j≤i} min(1, p_j(d_j) / q_j(d_j))."""
    total = 0.0
    for x, px, p, q in paths:
        a = np.cumprod([min(1.0, p[j, x[j]] / q[j, x[j]]) for j in range(gamma)])
        total += px * a.sum()
    return total


@pytest.mark.parametrize("v,gamma,seed", [(3, 1, 0), (3, 2, 1), (3, 3, 2), (2, 4, 3),
                                          (4, 2, 4), (3, 3, 5), (2, 3, 6)])
def test_output_law_is_the_target_law_by_exact_enumeration(v, gamma, seed):
    rng = np.random.default_rng(seed)
    mb, ms = _laws(rng, v, gamma)
    paths = _paths(mb, ms, v, gamma)
    out, kept = _module_law(paths, v, gamma)
    for z in itertools.product(range(v), repeat=gamma + 1):
        want = np.prod([mb[z[:i]][z[i]] for i in range(gamma + 1)])
        got = sum(out.get(z[:n], 0.0) * np.prod([mb[z[:i]][z[i]] for i in range(n, gamma + 1)])
                  for n in range(1, gamma + 2))
        assert got == pytest.approx(want, abs=1e-12)
    assert kept >= _token_kept(paths, gamma) - 1e-12


def test_keeps_more_than_token_verification_where_draft_and_target_disagree():
    """The paper's example: context-free laws a:b = 1:2 (target) and 2:1 (draft), γ = 2: token
    verification keeps 10/9 drafts, block verification 11/9."""
    mb = {pre: np.array([1 / 3, 2 / 3]) for n in range(3)
          for pre in itertools.product(range(2), repeat=n)}
    ms = {pre: np.array([2 / 3, 1 / 3]) for pre in mb}
    paths = _paths(mb, ms, 2, 2)
    _, kept = _module_law(paths, 2, 2)
    assert _token_kept(paths, 2) == pytest.approx(10 / 9)
    assert kept == pytest.approx(11 / 9)


def test_equal_laws_keep_every_draft():
    w = block_verify.keep_weights(torch.tensor([[0.2, 0.7, 0.4]], dtype=torch.float64),
                                  torch.tensor([[0.2, 0.7, 0.4]], dtype=torch.float64))
    assert w.tolist() == [[1.0, 1.0, 1.0, 1.0]]
    p = torch.full((1, 4, 3), 1 / 3, dtype=torch.float64)
    cand = torch.arange(3).expand(1, 3, 3)
    assert block_verify.keep_probs(w, p, *block_verify.distinct(cand, p[:, :3])).tolist() == \
        [[1.0, 1.0, 1.0]]


def test_keep_weights_carry_the_surplus_and_cap_at_one():
    p_d = torch.tensor([[0.125, 0.75, 1.0, 0.25, 0.0, 0.5]], dtype=torch.float64)
    q_d = torch.tensor([[0.5, 0.25, 0.5, 0.5, 0.5, 0.5]], dtype=torch.float64)
    assert block_verify.keep_weights(p_d, q_d).tolist() == \
        [[1.0, 0.25, 0.75, 1.0, 0.5, 0.0, 0.0]]


def test_distinct_merges_repeated_candidates_at_their_first_place():
    cand = torch.tensor([[[5, 2, 5, 9, 2, 5]]])
    q = torch.tensor([[[0.25, 0.125, 0.25, 0.0625, 0.0625, 0.25]]])
    ids, mass = block_verify.distinct(cand, q)
    assert ids.tolist() == [[[2, 2, 5, 5, 5, 9]]]
    assert mass.dtype == torch.float64
    assert mass.tolist() == [[[0.1875, 0.0, 0.75, 0.0, 0.0, 0.0625]]]


def test_keep_probs_count_a_repeated_candidate_once():
    """The same law as two candidate lists, one with repeats: the same h."""
    w = torch.tensor([[1.0, 0.5, 0.75]], dtype=torch.float64)
    p = torch.tensor([[[0.25] * 4, [0.5, 0.125, 0.125, 0.25], [0.25] * 4]],
                     dtype=torch.float64)
    plain = block_verify.distinct(torch.tensor([[[0, 1, 2], [0, 3, 1]]]),
                                  torch.tensor([[[0.5, 0.25, 0.25], [0.125, 0.5, 0.375]]]))
    twice = block_verify.distinct(torch.tensor([[[0, 1, 2, 2], [3, 0, 3, 1]]]),
                                  torch.tensor([[[0.5, 0.25, 0.125, 0.125],
                                                 [0.25, 0.125, 0.25, 0.375]]]))
    h = block_verify.keep_probs(w, p, *plain)
    assert torch.equal(h, block_verify.keep_probs(w, p, *twice))
    r = 0.5 * 1.0 - (min(0.25, 0.125) + min(0.0625, 0.375) + min(0.125, 0.5))
    assert h[0, 0].item() == pytest.approx(r / (r + 0.5), rel=1e-15) and h[0, 1].item() == 0.75


def test_keep_probs_by_hand():
    """w_1 = 0.5; r_1 = Σ (0.5 · (0.6, 0.4) − (0.1, 0.9))_+ = 0.2; h_1 = 0.2 / (0.2 + 0.5);
    h_2 = w_2."""
    w = torch.tensor([[1.0, 0.5, 0.3]], dtype=torch.float64)
    p = torch.tensor([[[0.5, 0.5], [0.6, 0.4], [1.0, 0.0]]], dtype=torch.float64)
    q = torch.tensor([[[0.5, 0.5], [0.1, 0.9]]], dtype=torch.float64)
    h = block_verify.keep_probs(w, p, *block_verify.distinct(torch.arange(2).expand(1, 2, 2), q))
    assert h[0, 0].item() == pytest.approx(0.2 / 0.7, rel=1e-15)
    assert h[0, 1].item() == 0.3


def _case(seed, r, gamma, v, k, temp=1.0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(r, gamma + 1, v, generator=g) * 2.0
    logits[torch.rand(r, gamma + 1, v, generator=g) < 0.2] = float("-inf")
    logits[..., 0] = logits[..., 0].clamp(min=-5.0)                 # every row has a token
    cand = torch.topk(logits[:, :gamma] / temp + torch.rand(r, gamma, v, generator=g), k).indices
    cand[:, :, -1] = cand[:, :, 0]                                  # a duplicate: masses add
    near = logits[:, :gamma].gather(-1, cand).clamp(min=-30.0) / temp
    q = torch.softmax(near + 0.5 * torch.randn(r, gamma, k, generator=g), dim=-1)
    pick = torch.multinomial(q.view(-1, k), 1, generator=g).view(r, gamma)
    draft = cand.gather(-1, pick.unsqueeze(-1)).squeeze(-1)
    noise = BlockNoise(walk=torch.rand(r, gamma, generator=g),
                       accept=torch.rand(r, gamma, generator=g),
                       residual=torch.rand(r, gamma, generator=g),
                       bonus=torch.rand(r, generator=g))
    temps = [temp if i % 4 else 0.0 for i in range(r)]               # every 4th row greedy
    sampling = SamplingBatch.build(temps, [0] * r, [0.9 if i % 3 == 1 else 1.0 for i in range(r)])
    return logits, draft, cand, q, noise, sampling


def _reference(p, draft, cand, q, noise):
    """The rule written out per row in float64: (kept drafts, emitting law)."""
    r, rows, v = p.shape
    gamma = rows - 1
    res = []
    for i in range(r):
        qd = np.zeros((gamma, v))
        for j in range(gamma):
            for c, m in zip(cand[i, j].tolist(), q[i, j].double().tolist()):
                qd[j, c] += m
        pi = p[i].double().numpy()
        w = [1.0]
        for j in range(gamma):
            d = int(draft[i, j])
            w.append(min(1.0, w[-1] * pi[j, d] / qd[j, d]))
        h = []
        for j in range(1, gamma):
            rj = np.clip(w[j] * pi[j] - qd[j], 0, None).sum()
            h.append(1.0 if rj + 1 - w[j] <= 0 else rj / (rj + 1 - w[j]))
        h.append(w[gamma])
        tau = max([j + 1 for j in range(gamma) if float(noise.accept[i, j]) < h[j]], default=0)
        if tau == gamma:
            law = pi[gamma]
        else:
            law = np.clip(w[tau] * pi[tau] - qd[tau], 0, None)
            if law.sum() <= 0:
                law = pi[tau]
        res.append((tau, law))
    return res


def _draw(law, u):
    c = np.cumsum(law)
    return int(np.searchsorted(c, u * c[-1], side="right"))


@pytest.mark.parametrize("seed,gamma,k", [(0, 3, 4), (1, 7, 6), (2, 1, 3), (3, 5, 16)])
def test_block_rows_match_the_rule_written_out(seed, gamma, k):
    logits, draft, cand, q, noise, sampling = _case(seed, 24, gamma, 20, k)
    block = torch.tensor([i % 2 == 0 for i in range(24)])
    out = verify(logits, draft, cand, q, sampling, noise, block=block, has_fp64=True)
    tok = verify(logits, draft, cand, q, sampling, noise, has_fp64=True)
    p = target_probs(logits, sampling.temperature, sampling.top_k, sampling.top_p,
                     top_k_max=sampling.top_k_max, top_p_rows=sampling.top_p_rows)
    ref = _reference(p, draft, cand, q, noise)
    moved = 0
    for i in range(24):
        if bool(sampling.greedy[i]) or not bool(block[i]):          # as token verification
            assert out.tokens[i].tolist() == tok.tokens[i].tolist()
            continue
        tau, law = ref[i]
        assert int(out.accept_len[i]) == tau
        u = float(noise.bonus[i]) if tau == gamma else float(noise.residual[i, tau])
        want = draft[i, :tau].tolist() + [_draw(law, u)]
        assert out.tokens[i, :tau + 1].tolist() == want
        assert (out.tokens[i, tau + 1:] == -1).all()
        moved += out.tokens[i].tolist() != tok.tokens[i].tolist()
    if gamma == 1:                                  # h_1 = min(1, p/q): the token rule
        assert torch.equal(out.tokens, tok.tokens)
    else:
        assert moved > 0                            # the rule decides otherwise on some rows
    assert not out.bad.any() and not out.bad_q.any()


def test_no_block_rows_is_token_verification():
    logits, draft, cand, q, noise, sampling = _case(7, 12, 4, 16, 5)
    none = torch.zeros(12, dtype=torch.bool)
    a = verify(logits, draft, cand, q, sampling, noise, block=none, has_fp64=True)
    b = verify(logits, draft, cand, q, sampling, noise, has_fp64=True)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.accept_len, b.accept_len)


def test_a_draft_token_the_target_forbids_is_never_kept():
    """p(d_2) = 0: however small the uniforms, the block keeps at most d_1."""
    r, gamma, v = 6, 3, 5
    logits = torch.zeros(r, gamma + 1, v)
    logits[:, 1, 3] = float("-inf")
    draft = torch.tensor([[1, 3, 2]] * r)
    cand = torch.tensor([[[1, 3, 2]] * gamma] * r)
    q = torch.full((r, gamma, 3), 1 / 3)
    tiny = 2.0 ** -24
    noise = BlockNoise(torch.full((r, gamma), 0.5), torch.full((r, gamma), tiny),
                       torch.rand(r, gamma), torch.rand(r))
    out = verify(logits, draft, cand, q, SamplingBatch.build([1.0] * r, [0] * r, [1.0] * r),
                 noise, block=torch.ones(r, dtype=torch.bool), has_fp64=True)
    assert (out.accept_len <= 1).all()
    assert (out.tokens != 3).all() or (out.tokens[:, 1] != 3).all()


def test_a_draft_law_without_the_draft_token_is_flagged():
    logits, draft, cand, q, noise, sampling = _case(8, 4, 3, 12, 4)
    q = q.clone()
    hit = cand == draft.unsqueeze(-1)
    q[1] = torch.where(hit[1], 0.0, q[1])                          # row 1: q(d) = 0
    out = verify(logits, draft, cand, q, SamplingBatch.build([1.0] * 4, [0] * 4, [1.0] * 4),
                 noise, check=False, block=torch.ones(4, dtype=torch.bool), has_fp64=True)
    assert out.bad_q.tolist() == [False, True, False, False]
    with pytest.raises(InvalidInputError, match="q = 0"):
        out.raise_if_bad()


def test_without_float64_block_verification_is_refused():
    logits, draft, cand, q, noise, sampling = _case(9, 4, 3, 12, 4)
    with pytest.raises(BackendError, match="float64"):
        verify(logits, draft, cand, q, sampling, noise, block=torch.ones(4, dtype=torch.bool),
               has_fp64=False)


def _last_slot_at(p, q, draft, eta):
    """verify_block_sampled with every uniform at 1 but the last slot's, ``eta`` → τ."""
    gamma = draft.shape[1]
    cand = torch.arange(p.shape[-1]).expand(1, gamma, -1).contiguous()
    q_d = q.gather(-1, draft.unsqueeze(-1)).squeeze(-1)
    at = torch.ones(1, gamma, dtype=torch.float64)
    at[0, -1] = eta
    return int(block_verify.verify_block_sampled(p, draft, cand, q, q_d, at,
                                                 torch.full((1, gamma), 0.5),
                                                 torch.full((1,), 0.5))[0])


@pytest.mark.parametrize("p_rows,q_rows,h", [
    ([[0.125, 0.375, 0.25, 0.25]], [[0.5, 0.25, 0.125, 0.125]], 0.25),   # γ = 1: h_1 = p/q
    ([[0.5, 0.25, 0.125, 0.125], [0.25] * 4],                             # γ = 2: h_1 = 1,
     [[0.5, 0.25, 0.125, 0.125]] * 2, 0.5),                               # h_2 = w_2 = 0.5
])
def test_a_uniform_equal_to_the_keep_probability_does_not_keep(p_rows, q_rows, h):
    gamma = len(q_rows)
    p = torch.tensor([p_rows + [[0.25] * 4]], dtype=torch.float64)
    q = torch.tensor([q_rows], dtype=torch.float64)
    draft = torch.zeros(1, gamma, dtype=torch.int64)
    below = torch.nextafter(torch.tensor(h, dtype=torch.float64), torch.tensor(0.0)).item()
    assert _last_slot_at(p, q, draft, h) == 0
    assert _last_slot_at(p, q, draft, below) == gamma


def test_an_empty_residual_emits_from_the_target_row():
    """Rounding aside, a block stops before a slot whose residual is empty only when its
    uniforms are at 1: with p = q the residual (p − q)_+ is 0, and the emitted token is drawn
    from p (never -1 from a zero law)."""
    p = torch.tensor([[[0.5, 0.25, 0.25], [0.25, 0.5, 0.25]]], dtype=torch.float64)
    q = p[:, :1].clone()
    draft, cand = torch.tensor([[1]]), torch.arange(3).view(1, 1, 3)
    q_d = torch.tensor([[0.25]], dtype=torch.float64)
    for u, want in ((0.1, 0), (0.6, 1), (0.9, 2)):
        tau, law, tok = block_verify.verify_block_sampled(
            p, draft, cand, q, q_d, torch.ones(1, 1, dtype=torch.float64),
            torch.full((1, 1), u), torch.full((1,), 0.5))
        assert tau.tolist() == [0] and law.tolist() == [[0.5, 0.25, 0.25]]
        assert tok.tolist() == [want]


def test_block_true_is_every_row_and_false_is_no_row():
    logits, draft, cand, q, noise, sampling = _case(1, 24, 7, 20, 6)
    run = lambda block: verify(logits, draft, cand, q, sampling, noise, has_fp64=True,  # noqa
                               block=block).tokens
    every = run(torch.ones(24, dtype=torch.bool))
    assert torch.equal(run(True), every)
    assert torch.equal(run(False), run(None))
    assert not torch.equal(every, run(None))              # True is not the token rule


@settings(max_examples=60, deadline=None, database=None, derandomize=True)
@given(seed=st.integers(0, 2**31 - 1), r=st.integers(1, 5), gamma=st.integers(1, 8),
       v=st.integers(2, 40), k=st.integers(1, 12), temp=st.sampled_from([0.3, 0.7, 1.0, 1.7]),
       sharp=st.sampled_from([0.0, 0.5, 1.0]))
def test_block_rows_match_the_rule_on_random_inputs(seed, r, gamma, v, k, temp, sharp):
    """Any shapes, temperatures and draft laws (from near the target's to unrelated, some
    candidates repeated, some target tokens at p = 0): the op keeps what the rule written out
    keeps and emits the token its law's inverse CDF gives."""
    k = min(k, v)
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(r, gamma + 1, v, generator=g) * 3.0
    logits[torch.rand(r, gamma + 1, v, generator=g) < 0.3] = float("-inf")
    logits[..., 0] = logits[..., 0].clamp(min=-5.0)
    cand = torch.randint(0, v, (r, gamma, k), generator=g)
    near = logits[:, :gamma].gather(-1, cand).clamp(min=-30.0) / temp
    q = torch.softmax(sharp * near + torch.randn(r, gamma, k, generator=g), dim=-1)
    pick = torch.multinomial(q.view(-1, k), 1, generator=g).view(r, gamma)
    draft = cand.gather(-1, pick.unsqueeze(-1)).squeeze(-1)
    noise = BlockNoise(torch.rand(r, gamma, generator=g), torch.rand(r, gamma, generator=g),
                       torch.rand(r, gamma, generator=g), torch.rand(r, generator=g))
    sampling = SamplingBatch.build([temp] * r, [0] * r, [1.0] * r)
    out = verify(logits, draft, cand, q, sampling, noise, block=True, has_fp64=True,
                 check=False)
    p = target_probs(logits, sampling.temperature, sampling.top_k, sampling.top_p)
    for i, (tau, law) in enumerate(_reference(p, draft, cand, q, noise)):
        assert int(out.accept_len[i]) == tau
        u = float(noise.bonus[i]) if tau == gamma else float(noise.residual[i, tau])
        assert out.tokens[i, :tau + 1].tolist() == draft[i, :tau].tolist() + [_draw(law, u)]
        assert law[out.tokens[i, tau]] > 0                       # never a token the law lacks
    assert not out.bad.any() and not out.bad_q.any()
