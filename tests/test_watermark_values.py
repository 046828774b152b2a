"""Keyed watermark values: known answers, the NumPy and limb Philox paths equal, bit-exact against
the float64 reference, the device-exact -log accurate, and subkeys A / B / C independent."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dflash2rt.watermark import WatermarkKey, values
from dflash2rt_conformance.reference import watermark as ref

KEY = WatermarkKey(bytes(range(32)))


def _sub(s):
    return (s.k0, s.k1, s.word)


@pytest.fixture(params=["numpy", "limbs"])
def path(request, monkeypatch):
    """Run on the uint64 NumPy path (CPU tensors) and on the int64-limb path other devices take."""
    if request.param == "limbs":
        monkeypatch.setattr(values, "use_numpy", lambda device: False)
    return request.param


def test_known_answers(path):
    h = values.context_hash(torch.tensor([[-1, -1, 5, 7], [1, 2, 3, 4]]))
    assert h.tolist() == [-6324932000113581416, 3688132256423666022]
    assert values.keyed_bits(KEY.target, h, torch.tensor([0, 151935])).tolist() == \
        [4154319853, 977270351]


def test_bit_exact_against_reference(path):
    g = torch.Generator().manual_seed(1)
    for width in range(1, 10):                      # the one-call width and the chained ones
        w = torch.randint(-1, 2**32 - 1, (500, width), generator=g)
        assert np.array_equal(values.context_hash(w).numpy(), ref.context_hash(w.numpy())), width
    win = torch.randint(-1, 2**32 - 1, (3000, 5), generator=g)
    h = values.context_hash(win)
    assert np.array_equal(h.numpy(), ref.context_hash(win.numpy()))
    tok = torch.randint(0, 2**32 - 1, (3000,), generator=g)
    for s in (KEY.draft, KEY.target, KEY.coin):
        u = values.keyed_uniforms(s, h, tok)
        assert u.dtype == torch.float32
        want = ref.keyed_uniforms(_sub(s), h.numpy(), tok.numpy())
        assert np.array_equal(u.double().numpy(), want)
        assert np.array_equal(values.neg_log(u).numpy(), ref.neg_log(want))


def test_context_hash_separates_order_padding_and_width():
    h = values.context_hash(torch.tensor([[1, 2, 3], [2, 1, 3], [-1, 0, 3], [0, 0, 3],
                                          [-1, -1, 3]]))
    assert len(set(h.tolist())) == 5
    assert values.context_hash(torch.tensor([[3]])).item() != \
        values.context_hash(torch.tensor([[-1, 3]])).item()
    # zero padding never makes a short window collide with a longer one, nor pairs past 4
    assert len({values.context_hash(torch.tensor([[-1] * n + [3]])).item()
                for n in range(0, 8)}) == 8
    assert values.context_hash(torch.tensor([[1, 2, 3, 4, 5]])).item() != \
        values.context_hash(torch.tensor([[1, 2, 3, 4, 5, -1]])).item()


def test_windows():
    w = values.windows(torch.tensor([10, 11, 12, 13]), 3)
    assert w.tolist() == [[-1, -1, -1], [-1, -1, 10], [-1, 10, 11], [10, 11, 12]]


def test_join_split_round_trip():
    lo = torch.tensor([0, 1, 2**32 - 1, 5, 0])
    hi = torch.tensor([0, 2**31, 2**32 - 1, 2**31 - 1, 2**31])
    x = values.join64(lo, hi)
    back = values.split64(x)
    assert torch.equal(back[0], lo) and torch.equal(back[1], hi)
    assert x.tolist()[2] == -1 and x.tolist()[4] == -2**63


def test_neg_log_accuracy_and_range():
    k = np.concatenate([np.arange(0, 2**23, 97), [0, 1, 2**22, 2**23 - 2, 2**23 - 1]])
    u = (2 * k + 1) * 2.0 ** -24
    got = values.neg_log(torch.tensor(u, dtype=torch.float32)).numpy()
    want = -np.log(u)
    assert np.all(got > 0)
    assert np.max(np.abs(got - want) / want) < 1e-15      # a few ulp, also next to u = 1
    assert np.array_equal(got, ref.neg_log(u))


def test_values_uniform_on_the_grid():
    h = values.context_hash(torch.arange(50_000).view(-1, 1))
    u = values.keyed_uniforms(KEY.draft, h, 7).double()
    assert bool((u > 0).all()) and bool((u < 1).all())
    k = u * 2**24
    assert torch.equal(k, torch.round(k)) and bool((k.long() % 2 == 1).all())
    counts = torch.histc(u, bins=20, min=0, max=1)
    chi2 = float(((counts - 2500) ** 2 / 2500).sum())
    assert chi2 < 54.0                                   # χ²_19 at p = 1e-5


def test_subkeys_independent():
    """Pearson and rank-sign correlations of A / B / C values over 200k (context, token) pairs,
    and against the runtime's seeded stream, all within 5 standard errors of 0."""
    n = 200_000
    g = torch.Generator().manual_seed(2)
    h = values.context_hash(torch.randint(0, 50_000, (n, 4), generator=g))
    tok = torch.randint(0, 50_000, (n,), generator=g)
    a = values.keyed_uniforms(KEY.draft, h, tok).double()
    b = values.keyed_uniforms(KEY.target, h, tok).double()
    c = values.keyed_uniforms(KEY.coin, h, values.COIN_TOKEN).double()
    c_tok = values.keyed_uniforms(KEY.coin, h, tok).double()
    other = values.keyed_uniforms(WatermarkKey(bytes(range(1, 33))).target, h, tok).double()
    bound = 5 / n ** 0.5
    series = {"A": a, "B": b, "C": c, "C_tok": c_tok, "B'": other}
    names = list(series)
    for i, x in enumerate(names):
        for y in names[i + 1:]:
            u, v = series[x], series[y]
            r = float(torch.corrcoef(torch.stack([u, v]))[0, 1])
            assert abs(r) < bound, (x, y, r)
            assert abs(float(((u > 0.5) == (v > 0.5)).double().mean()) - 0.5) < 2.5 / n ** 0.5
