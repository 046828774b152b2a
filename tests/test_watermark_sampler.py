"""Watermarked draws: the Gumbel-max draw has the exact law p over contexts (χ²), the mapping
values → token is exact (ties, zeros, non-laws; bit-equal to the float64 reference), the sparse
draw is the dense one restricted, and the A / B draws and the C coin are mutually independent."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dflash2rt.ops.exact32 import without_fp64
from dflash2rt.watermark import WatermarkKey, sampler, values
from dflash2rt_conformance.reference import watermark as ref
from dflash2rt_conformance.stats import chi2_test, detectable_tv

KEY = WatermarkKey(bytes(range(32)))
N = 120_000


def _contexts(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return values.context_hash(torch.randint(0, 1000, (n, 4), generator=g))


def _laws():
    """A flat-ish law with zeros and tiny masses, and a peaked one (T = 0.7 with top-p)."""
    flat = torch.tensor([0.3, 0.0, 0.2, 1e-4, 0.15, 0.0, 0.2499, 0.1])
    logits = torch.tensor([2.0, 1.5, 1.0, 0.2, -0.5, -1.0, -3.0])
    peaked = torch.softmax(logits / 0.7, -1)
    peaked = torch.where(torch.cumsum(peaked, 0) - peaked < 0.95, peaked, 0.0)
    return {"flat_with_zeros": flat.float(),
            "peaked_T0.7_top_p0.95": (peaked / peaked.sum()).float()}


@pytest.mark.parametrize("name", list(_laws()))
@pytest.mark.parametrize("side", ["A", "B"])
def test_gumbel_max_has_the_law_p(name, side):
    p = _laws()[name]
    tokens = sampler.draw_dense(KEY.subkey(side), _contexts(N), p.expand(N, -1))
    counts = dict(zip(*np.unique(tokens.numpy(), return_counts=True)))
    expected = {i: float(x) for i, x in enumerate(p.double())}
    stat, dof, pval = chi2_test(counts, expected, N)
    print(f"{name}/{side}: chi2 {stat:.1f} dof {dof} p {pval:.3g}; detectable TV "
          f"{detectable_tv(N, dof + 1, 1e-4, 0.9):.4f}")
    assert pval > 1e-4
    assert all(p[t] > 0 for t in counts)                 # p = 0 never chosen


def test_dense_and_sparse_match_reference():
    g = torch.Generator().manual_seed(3)
    r, v, k = 40, 301, 17
    ctx = _contexts(r, 1)
    probs = torch.softmax(torch.randn(r, v, generator=g) * 3, -1)
    probs[probs < 1e-3] = 0.0
    probs[5] = float("nan")
    probs[6] = 0.0
    probs[7, 3] = -0.1
    for s in (KEY.draft, KEY.target):
        sub = (s.k0, s.k1, s.word)
        got = sampler.draw_dense(s, ctx, probs)
        assert np.array_equal(got.numpy(), ref.draw_dense(sub, ctx.numpy(), probs.double().numpy()))
        assert got[5] == -1 and got[6] == -1 and got[7] == -1
        ids = torch.randint(0, v, (r, k), generator=g)
        q = torch.rand(r, k, generator=g)
        q[q < 0.3] = 0.0
        pos = sampler.draw_sparse(s, ctx, ids, q)
        assert np.array_equal(pos.numpy(),
                              ref.draw_sparse(sub, ctx.numpy(), ids.numpy(), q.double().numpy()))
    assert np.array_equal(sampler.coin(KEY.coin, ctx).double().numpy(),
                          ref.coin((KEY.coin.k0, KEY.coin.k1, KEY.coin.word), ctx.numpy()))


def test_sparse_is_dense_restricted_to_the_candidates():
    g = torch.Generator().manual_seed(4)
    r, v, k = 200, 97, 6
    ctx = _contexts(r, 2)
    ids = torch.stack([torch.randperm(v, generator=g)[:k] for _ in range(r)])
    q = torch.rand(r, k, generator=g)
    dense = torch.zeros(r, v).scatter(1, ids, q)
    pos = sampler.draw_sparse(KEY.draft, ctx, ids, q)
    assert torch.equal(ids.gather(1, pos.view(-1, 1)).view(-1),
                       sampler.draw_dense(KEY.draft, ctx, dense))


def test_ties_go_to_the_lower_id_and_zeros_never_win():
    e = torch.tensor([[2.0, 1.0, 1.0, 0.5], [1.0, 1.0, 1.0, 1.0], [0.1, 3.0, 3.0, 3.0]],
                     dtype=torch.float64)
    p = torch.tensor([[1.0, 0.5, 0.5, 0.0], [0.25, 0.25, 0.25, 0.25], [0.0, 0.2, 0.2, 0.6]])
    assert sampler.exp_min_index(p, e).tolist() == [0, 0, 3]
    # Sparse: equal keys → lower token id, then the lower position (a repeated id).
    ids = torch.tensor([[9, 4, 4, 2]])
    assert sampler.exp_min_candidates(torch.tensor([[1.0, 1.0, 1.0, 0.0]]), ids,
                                      torch.ones(1, 4, dtype=torch.float64)).tolist() == [1]
    for bad in (float("inf"), float("nan"), -1.0):
        row = torch.tensor([[0.5, bad, 0.5]])
        assert sampler.exp_min_index(row, torch.ones(1, 3, dtype=torch.float64)).tolist() == [-1]


def test_a_b_draws_and_coin_are_independent():
    """The joint law of (A draw, B draw, coin < 1/2) over contexts is p ⊗ p ⊗ Bernoulli(1/2):
    a shared key or a coin reusing a draw's value would fail this χ²."""
    p = torch.tensor([0.4, 0.3, 0.2, 0.1])
    ctx = _contexts(N, 5)
    a = sampler.draw_dense(KEY.draft, ctx, p.expand(N, -1)).numpy()
    b = sampler.draw_dense(KEY.target, ctx, p.expand(N, -1)).numpy()
    c = (sampler.coin(KEY.coin, ctx) < 0.5).numpy().astype(int)
    cells = a * 8 + b * 2 + c
    counts = dict(zip(*np.unique(cells, return_counts=True)))
    pd = p.double().numpy()
    expected = {i * 8 + j * 2 + k: pd[i] * pd[j] * 0.5
                for i in range(4) for j in range(4) for k in range(2)}
    stat, dof, pval = chi2_test(counts, expected, N)
    assert pval > 1e-4, (stat, dof)
    # The draw's own value is high for the chosen token: the coin must not be that value.
    u_b = values.keyed_uniforms(KEY.target, ctx, torch.from_numpy(b))
    assert float(u_b.double().mean()) > 0.6
    assert abs(float(sampler.coin(KEY.coin, ctx).double().mean()) - 0.5) < 0.005


def test_draws_refuse_a_device_without_float64():
    """No silent fallback: the race is float64; the coin (integer work) still runs."""
    ctx, p = _contexts(2, 6), torch.full((2, 3), 1 / 3)
    ids = torch.zeros(2, 3, dtype=torch.int64)
    with without_fp64():
        for call in (lambda: sampler.draw_dense(KEY.target, ctx, p),
                     lambda: sampler.draw_sparse(KEY.draft, ctx, ids, p)):
            with pytest.raises(sampler.WatermarkUnsupportedError, match="no float64"):
                call()
        assert sampler.coin(KEY.coin, ctx).shape == (2,)


def test_every_draw_path_refuses_before_any_float64_outside_run_context():
    """A backend without float64 passes has_fp64=False to the watermarked ops; with no
    run_context() around them (a conformance harness, a direct call) the keyed walk, the marks'
    emit and the ops must still refuse with the typed error before making any float64 tensor
    (the float64 guard of cpu-nofp64 would raise on the first one)."""
    from dflash2rt.cpu.nofp64 import Float64Forbidden
    from dflash2rt.kernels.smoke import cases
    from dflash2rt.ops import selector, verify

    args = dict(cases(torch.float32))
    wm_select = args["select-watermarked"][1]()
    wm_verify = args["verify-watermarked"][1]()
    wm = wm_select[-1].wm                                     # the KeyedDraws' batch
    law, cand = torch.full((2, 3), 1 / 3), torch.zeros(2, 3, dtype=torch.int64)
    calls = {
        "select": lambda: selector.select(*wm_select, has_fp64=False),
        "verify": lambda: verify.verify(*wm_verify, has_fp64=False),
        "walk": lambda: wm.walk(False).pick(0, law, cand, torch.zeros(2, dtype=torch.int64),
                                           torch.zeros(2, dtype=torch.bool)),
        "emit": lambda: wm.marks(cand[:, :2], False).emit(law, torch.zeros(2, dtype=torch.int64),
                                                         torch.zeros(2, dtype=torch.int64)),
    }
    for name, call in calls.items():
        with Float64Forbidden(), pytest.raises(sampler.WatermarkUnsupportedError):
            call()
