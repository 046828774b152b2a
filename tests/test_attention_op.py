"""The attention op's grouped path (a step's few rows over a long context) against the float64
reference, and the op's choice between it and SDPA."""

from __future__ import annotations

import pytest
import torch

import dflash2rt.ops.attention as A
from dflash2rt.errors import InvalidInputError


def _case(r, t, nh, nkv, hd, n_keys, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    cap = n_keys + 5
    # head-major storage seen position-major, as the KV cache keeps it
    k = torch.randn(r, nkv, cap, hd, generator=g).transpose(1, 2)[:, :n_keys].to(dtype)
    v = torch.randn(r, nkv, cap, hd, generator=g).transpose(1, 2)[:, :n_keys].to(dtype)
    q = torch.randn(r, nh, t, hd, generator=g).transpose(1, 2).to(dtype)   # not contiguous
    hi = torch.randint(1, n_keys + 1, (r, t), generator=g)
    lo = (hi - torch.randint(1, n_keys + 1, (r, t), generator=g)).clamp(min=0)
    return q, k, v, lo, hi


@pytest.mark.parametrize("nh,nkv", [(4, 4), (8, 2), (16, 8), (8, 1)])
@pytest.mark.parametrize("t", [1, 9, 17])
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 1e-5),
                                       (torch.bfloat16, 3e-2)])
def test_grouped_attention_matches_the_float64_reference(nh, nkv, t, dtype, tol):
    """Ragged key ranges per row (lo..hi), GQA ratios 1-8, decode and verify rows, non-contiguous
    queries, cache views: the grouped products equal softmax(q·kᵀ)·v over each row's range."""
    q, k, v, lo, hi = _case(3, t, nh, nkv, 32, 70, dtype, seed=nh * 100 + t)
    got = A.grouped_attention(q, k, v, lo, hi, 0.2)
    ref = A.attend(q.double(), k.double(), v.double(), A.range_mask(lo, hi, 70), 0.2)
    assert got.dtype == dtype and got.shape == q.shape
    assert torch.allclose(got.double(), ref, atol=tol, rtol=tol)


def test_grouped_attention_is_per_head_and_per_row():
    """Each query head reads its own KV head (h // (nh / n_kv)) and each row only its range:
    changing a key outside a row's range, or another KV head's values, leaves it alone."""
    q, k, v, lo, hi = _case(2, 4, 8, 2, 16, 40, torch.float64, seed=3)
    lo[:], hi[:] = 10, 20
    base = A.grouped_attention(q, k, v, lo, hi, 0.3)
    k2, v2 = k.clone(), v.clone()
    k2[:, 25:] += 5.0                        # outside every row's range
    v2[:, :, 1] += 1.0                       # KV head 1: query heads 4..7 only
    got = A.grouped_attention(q, k2, v2, lo, hi, 0.3)
    assert torch.equal(got[:, :, :4], base[:, :, :4])
    assert not torch.allclose(got[:, :, 4:], base[:, :, 4:])


def test_attention_runs_grouped_only_for_few_rows_over_long_contexts(monkeypatch):
    calls = []
    grouped = A.grouped_attention
    monkeypatch.setattr(A, "grouped_attention",
                        lambda *a: calls.append(a[0].shape[1]) or grouped(*a))
    per_key = 8 * 128 * 4                              # bytes per key of 8 fp32 heads of 128
    long = A.GROUPED_MIN_BYTES // per_key
    for t, n_keys in ((1, long), (A.GROUPED_ROWS, long), (A.GROUPED_ROWS + 1, long + 40),
                      (1, long - 1)):
        q, k, v, lo, hi = _case(1, t, 8, 8, 128, n_keys, torch.float32)
        A.attention(q, k, v, lo, hi, 0.1)
    assert calls == [1, A.GROUPED_ROWS]


def _long_case(r, t, dtype, seed):
    """A case on the grouped path (GROUPED_MIN_BYTES of keys per request) or, with fewer keys,
    on SDPA's: 8 KV heads of 128, 16 query heads."""
    n_keys = A.GROUPED_MIN_BYTES // (8 * 128 * torch.empty((), dtype=dtype).element_size())
    return _case(r, t, 16, 8, 128, n_keys, dtype, seed=seed)


@pytest.mark.parametrize("grouped", [True, False])
@pytest.mark.parametrize("t", [1, 3])
def test_attention_with_every_key_visible_or_not_matches_the_reference(grouped, t):
    """The op attends without a mask only when every row sees every key: all rows full, one
    row short of the last key, one row starting after the first key."""
    q, k, v, _, _ = _long_case(2, t, torch.float32, seed=7 + t)
    if not grouped:
        k, v = k[:, :100], v[:, :100]
    assert (k[0].numel() * k.element_size() >= A.GROUPED_MIN_BYTES) == grouped
    n = k.shape[1]
    full = torch.full((2, t), n)
    for lo, hi in ((torch.zeros_like(full), full),
                   (torch.zeros_like(full), full - torch.tensor([[0], [1]])),
                   (torch.tensor([[0], [5]]).expand(2, t).clone(), full)):
        A.visible_mask.entry = None
        got = A.attention(q, k, v, lo, hi, 0.09)
        ref = A.attend(q.double(), k.double(), v.double(), A.range_mask(lo, hi, n), 0.09)
        assert torch.allclose(got.double(), ref, atol=1e-5, rtol=1e-5)


def test_the_memoised_mask_follows_key_ranges_changed_in_place():
    """The mask is built once per forward (the same lo / hi for every layer), keyed by their
    values: changing hi in place, from every key visible to fewer, or back, rebuilds it."""
    q, k, v, _, _ = _long_case(1, 2, torch.float32, seed=11)
    n = k.shape[1]
    lo, hi = torch.zeros(1, 2, dtype=torch.int64), torch.full((1, 2), n)
    for new_hi in (n, n // 3, n, 3, n):
        hi.fill_(new_hi)
        got = A.attention(q, k, v, lo, hi, 0.09)
        ref = A.attend(q.double(), k.double(), v.double(), A.range_mask(lo, hi, n), 0.09)
        assert torch.allclose(got.double(), ref, atol=1e-5, rtol=1e-5), new_hi
        if new_hi < n:                   # the keys past hi do not matter
            kk, vv = k[:, :new_hi], v[:, :new_hi]
            assert torch.allclose(got, A.attend(q, kk, vv, A.range_mask(lo, hi, new_hi), 0.09),
                                  atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("op,wrong", [(op, w) for op in ("attention", "attend")
                                      for w in ("heads", "kv heads", "k vs v", "head dim",
                                                "rows")]
                         + [("attention", "lo"), ("attention", "hi")])
def test_each_shape_mismatch_alone_is_refused(op, wrong):
    """q [R, T, nh, hd], k = v [R, L, n_kv, hd] with n_kv dividing nh, and for ``attention``
    lo / hi [R, T]: every other shape consistent, one wrong → a typed error, never a
    broadcast."""
    r, t, nh, n_kv, hd, n = 2, 3, 4, 2, 8, 5
    q, k, v = torch.zeros(r, t, nh, hd), torch.zeros(r, n, n_kv, hd), torch.zeros(r, n, n_kv, hd)
    lo, hi = torch.zeros(r, t, dtype=torch.int64), torch.full((r, t), n, dtype=torch.int64)
    if wrong == "heads":
        k, v = torch.zeros(r, n, 3, hd), torch.zeros(r, n, 3, hd)
    elif wrong == "kv heads":                       # more KV heads than query heads
        k, v = torch.zeros(r, n, 2 * nh, hd), torch.zeros(r, n, 2 * nh, hd)
    elif wrong == "k vs v":
        v = torch.zeros(r, n + 1, n_kv, hd)
    elif wrong == "head dim":
        k, v = torch.zeros(r, n, n_kv, hd // 2), torch.zeros(r, n, n_kv, hd // 2)
    elif wrong == "rows":
        k, v = torch.zeros(r + 1, n, n_kv, hd), torch.zeros(r + 1, n, n_kv, hd)
    elif wrong == "lo":
        lo = torch.zeros(r, t + 1, dtype=torch.int64)
    else:
        hi = torch.full((r + 1, t), n, dtype=torch.int64)
    with pytest.raises(InvalidInputError, match=op):
        if op == "attention":
            A.attention(q, k, v, lo, hi, hd ** -0.5)
        else:
            A.attend(q, k, v, torch.ones(r, t, n, dtype=torch.bool))


def _naive(q, k, v, lo, hi, scale):
    """float64, one row and head at a time, over k[r, lo:hi] sliced out (no mask helper of
    the op's own)."""
    r, t, nh, hd = q.shape
    g = nh // k.shape[2]
    out = torch.zeros(r, t, nh, hd, dtype=torch.float64)
    for i in range(r):
        for j in range(t):
            a, b = int(lo[i, j]), int(hi[i, j])
            for h in range(nh):
                kk, vv = k[i, a:b, h // g].double(), v[i, a:b, h // g].double()
                w = torch.softmax(kk @ q[i, j, h].double() * scale, dim=0)
                out[i, j, h] = w @ vv
    return out


@pytest.mark.parametrize("grouped", [True, False])
def test_attention_reads_exactly_each_row_s_key_range(grouped):
    """Against slices of the cache, not a mask the op also builds: lo inclusive, hi
    exclusive, per row and query row, GQA; key ranges of one key, ranges starting past 0, a
    row of every key. ``range_mask`` itself, position by position."""
    q, k, v, _, _ = _long_case(2, 3, torch.float32, seed=5)
    if not grouped:
        k, v = k[:, :40], v[:, :40]
    n = k.shape[1]
    lo = torch.tensor([[0, 7, n - 1], [3, 0, 12]])
    hi = torch.tensor([[n, 8, n], [4, n - 2, 30]])
    A.visible_mask.entry = None
    got = A.attention(q, k, v, lo, hi, 0.09)
    assert torch.allclose(got.double(), _naive(q, k, v, lo, hi, 0.09), atol=1e-5, rtol=1e-5)
    m = A.range_mask(lo, hi, n)
    for i in range(2):
        for j in range(3):
            want = [int(lo[i, j]) <= p < int(hi[i, j]) for p in range(n)]
            assert m[i, j].tolist() == want


def test_attend_gives_a_row_that_sees_no_key_every_key():
    """A query row whose mask is all False attends uniformly over every key (finite), and the
    other rows keep their own keys."""
    q, k, v, _, _ = _case(1, 2, 2, 2, 4, 6, torch.float64, seed=2)
    mask = torch.tensor([[[False] * 6, [True, True, False, False, False, False]]])
    got = A.attend(q, k, v, mask, 0.5)
    every = _naive(q, k, v, torch.tensor([[0, 0]]), torch.tensor([[6, 2]]), 0.5)
    assert torch.allclose(got, every, atol=1e-12)


def test_attend_scales_by_the_head_dim_unless_told():
    q, k, v, lo, hi = _case(2, 3, 4, 2, 16, 9, torch.float64, seed=4)
    mask = A.range_mask(lo, hi, 9)
    want = _naive(q, k, v, lo, hi, 16 ** -0.5)
    assert torch.allclose(A.attend(q, k, v, mask), want, atol=1e-12)
    assert torch.allclose(A.attend(q, k, v, mask, 0.7), _naive(q, k, v, lo, hi, 0.7),
                          atol=1e-12)


def test_the_memoised_mask_follows_the_key_count():
    """The same lo / hi over caches of different lengths (the draft's and the target's in
    one step): each call attends its own keys."""
    q, k, v, _, _ = _case(2, 3, 4, 4, 8, 60, torch.float32, seed=6)
    lo, hi = torch.zeros(2, 3, dtype=torch.int64), torch.full((2, 3), 20)
    for n in (20, 35, 60, 20):
        got = A.attention(q, k[:, :n], v[:, :n], lo, hi, 0.3)
        assert torch.allclose(got.double(), _naive(q, k, v, lo, hi, 0.3), atol=1e-5), n
