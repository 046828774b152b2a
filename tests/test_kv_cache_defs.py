"""KVCache's checks, commits, side buffers and compaction against loops over plain lists."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dflash2rt.errors import InvalidInputError
from dflash2rt.models.kv_cache import KVCache

DIMS = dict(num_layers=2, batch=3, max_len=7, n_kv_heads=2, head_dim=3)


def _cache(seed=0, dtype=torch.float64, **kw) -> KVCache:
    d = {**DIMS, **kw}
    cache = KVCache.empty(*d.values(), dtype, "cpu")
    g = torch.Generator().manual_seed(seed)
    for buf in (*cache.k, *cache.v):
        buf.copy_(torch.randn(buf.shape, generator=g, dtype=torch.float64))
    return cache


def _new(t, seed=1, r=3, layers=2, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return [tuple(torch.randn(r, t, 2, 3, generator=g, dtype=torch.float64).to(dtype)
                  for _ in range(2)) for _ in range(layers)]


def _i64(*xs):
    return torch.tensor(xs, dtype=torch.int64)


@pytest.mark.parametrize("name", list(DIMS))
@pytest.mark.parametrize("value", [0, -1])
def test_empty_refuses_each_non_positive_size_alone(name, value):
    with pytest.raises(InvalidInputError, match=f"{name} must be positive, got {value}"):
        KVCache.empty(*{**DIMS, name: value}.values(), torch.float32, "cpu")


def test_empty_sizes_zeros_and_head_major_storage():
    c = KVCache.empty(3, 2, 5, 4, 6, torch.bfloat16, "cpu")
    assert (c.num_layers, c.batch_size, c.max_len) == (3, 2, 5)
    assert c.dtype == torch.bfloat16 and c.device == torch.device("cpu") and c.side == ()
    assert len(c.k) == len(c.v) == 3
    ptrs = {b.data_ptr() for b in (*c.k, *c.v)}
    assert len(ptrs) == 6                                     # every buffer its own storage
    for b in (*c.k, *c.v):
        assert b.shape == (2, 5, 4, 6) and not b.any()
        assert b.transpose(1, 2).is_contiguous()              # [R, n_kv, max_len, hd] storage
    one = KVCache.empty(1, 2, 1, 1, 1, torch.float16, "cpu")          # a one-layer draft
    assert one.k[0].shape == (2, 1, 1, 1)
    assert (one.num_layers, one.batch_size, one.max_len) == (1, 2, 1)
    assert one.dtype == torch.float16 and one.device == torch.device("cpu")


def test_the_cache_is_frozen():
    """Its buffers are fixed (captured graphs hold their pointers): no field is reassigned."""
    c = _cache()
    for name in ("k", "v", "side"):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(c, name, ())


def _expect_commit(before, new, lens, counts, max_len):
    """Each buffer as lists: row t < counts[r] of request r at (lens[r] + t) mod max_len."""
    want = [b.clone() for b in before]
    for i, w in enumerate(want):
        layer, kv = i % len(new), i // len(new)
        for r in range(w.shape[0]):
            for t in range(int(counts[r])):
                w[r, (int(lens[r]) + t) % max_len] = new[layer][kv][r, t].to(w.dtype)
    return want


@pytest.mark.parametrize("lens, counts, t", [
    ((0, 3, 6), (1, 0, 1), 1),
    ((0, 3, 6), (4, 0, 1), 4),       # the last request's rejected rows wrap to 0 .. 2
    ((2, 5, 0), (3, 2, 7), 7),       # T = max_len: every slot of the row written or kept
    ((1, 1, 1), (0, 0, 0), 3),
])
def test_commit_writes_exactly_the_accepted_rows(lens, counts, t):
    c = _cache()
    before = [b.clone() for b in (*c.k, *c.v)]
    new = _new(t)
    c.commit(new, _i64(*lens), _i64(*counts))
    want = _expect_commit(before, new, lens, counts, 7)
    for got, w in zip((*c.k, *c.v), want):
        assert torch.equal(got, w)


def test_commit_casts_to_the_cache_dtype():
    c = _cache(dtype=torch.float32)
    before = [b.clone() for b in (*c.k, *c.v)]
    new = _new(2, dtype=torch.float64)
    c.commit(new, _i64(0, 2, 5), _i64(2, 1, 2))
    for got, w in zip((*c.k, *c.v), _expect_commit(before, new, (0, 2, 5), (2, 1, 2), 7)):
        assert got.dtype == torch.float32 and torch.equal(got, w)


def test_commit_checks_each_condition_alone():
    c = _cache()
    ok_lens, ok_counts = _i64(0, 1, 2), _i64(1, 1, 1)
    c.commit(_new(2), ok_lens, ok_counts)                                  # all good
    c.commit(_new(7), _i64(0, 0, 0), ok_counts)                            # T == max_len
    bad = [
        ((_new(2, layers=1), ok_lens, ok_counts), "got 1 layers of new KV, cache has 2"),
        ((_new(2, layers=3), ok_lens, ok_counts), "got 3 layers"),
        ((_new(2), _i64(0, 1), ok_counts), r"lens \(2,\)"),
        ((_new(2), ok_lens, _i64(1, 1, 1, 1)), r"counts \(4,\)"),
        ((_new(2), ok_lens[:, None], ok_counts), "must be"),
        ((_new(2, r=2), _i64(0, 1), _i64(1, 1)), r"new KV batch \(2\)"),
        ((_new(8), _i64(0, 0, 0), ok_counts), "8 new rows exceed max_len 7"),
        ((_new(2), ok_lens.int(), ok_counts), "int64, got torch.int32 and torch.int64"),
        ((_new(2), ok_lens, ok_counts.int()), "int64, got torch.int64 and torch.int32"),
    ]
    for args, needle in bad:
        with pytest.raises(InvalidInputError, match=needle):
            c.commit(*args)


@pytest.mark.parametrize("layer, kv", [(0, 0), (0, 1), (1, 0), (1, 1)])
def test_commit_checks_each_tensor_shape_alone(layer, kv):
    c = _cache()
    new = [list(p) for p in _new(2)]
    new[layer][kv] = new[layer][kv][..., :2]                                # head_dim 2, not 3
    with pytest.raises(InvalidInputError, match=rf"layer {layer} new KV has shape "
                       r"\(3, 2, 2, 2\), expected \(3, 2, 2, 3\)"):
        c.commit(new, _i64(0, 1, 2), _i64(1, 1, 1))


def _side_cache(seed=3):
    kv = _cache()
    g = torch.Generator().manual_seed(seed)
    sides = (torch.randn(3, 7, 5, generator=g), torch.randn(3, 7, 2, 2, generator=g))
    return KVCache(kv.k, kv.v, sides)


@pytest.mark.parametrize("i", [0, 1])
def test_side_commit_and_read_against_loops(i):
    c = _side_cache()
    before = [s.clone() for s in c.side]
    kvs = [b.clone() for b in (*c.k, *c.v)]
    g = torch.Generator().manual_seed(4)
    new = torch.randn((3, 3, *c.side[i].shape[2:]), generator=g)
    lens, counts = (6, 0, 4), (2, 3, 0)              # request 0's second row wraps to slot 0
    c.commit_side(i, new, _i64(*lens), _i64(*counts))
    for j, (s, b) in enumerate(zip(c.side, before)):
        want = b.clone()
        if j == i:
            for r in range(3):
                for t in range(counts[r]):
                    want[r, (lens[r] + t) % 7] = new[r, t]
        assert torch.equal(s, want)
    assert all(torch.equal(a, b) for a, b in zip((*c.k, *c.v), kvs))
    pos = torch.tensor([[6, 0, 3], [1, 1, 1], [0, 4, 6]])
    got = c.read_side(i, pos)
    assert got.shape == (3, 3, *c.side[i].shape[2:])
    for r in range(3):
        for t in range(3):
            assert torch.equal(got[r, t], c.side[i][r, int(pos[r, t])])


def test_side_commit_checks_each_condition_alone():
    c = _side_cache()
    new = torch.zeros(3, 2, 5)
    c.commit_side(0, new, _i64(0, 0, 0), _i64(1, 1, 1))
    for lens, counts in ((_i64(0, 0), _i64(1, 1, 1)), (_i64(0, 0, 0), _i64(1, 1)),
                         (_i64(0, 0, 0, 0), _i64(1, 1, 1, 1))):
        with pytest.raises(InvalidInputError, match="commit_side"):
            c.commit_side(0, new, lens, counts)
    with pytest.raises(InvalidInputError, match="side buffer 1 has shape"):
        c.commit_side(1, new, _i64(0, 0, 0), _i64(1, 1, 1))


def test_rows_are_views_of_the_first_slots():
    c = _side_cache()
    v = c.rows(2)
    assert v.batch_size == 2 and v.max_len == 7 and v.num_layers == 2
    for a, b in zip((*v.k, *v.v, *v.side), (*c.k, *c.v, *c.side)):
        assert a.shape[0] == 2 and a.data_ptr() == b.data_ptr() and a.stride() == b.stride()
    before = [b.clone() for b in (*c.k, *c.v)]
    new = _new(2, r=2)
    v.commit(new, _i64(5, 0), _i64(2, 1))
    want = _expect_commit([b[:2] for b in before], new, (5, 0), (2, 1), 7)
    for got, w, old in zip((*c.k, *c.v), want, before):
        assert torch.equal(got[:2], w) and torch.equal(got[2], old[2])


def _expect_compact(before, idx, upto):
    want = [b.clone() for b in before]
    for w, b in zip(want, before):
        for j, s in enumerate(idx):
            w[j, :upto] = b[s, :upto]
    return want


@pytest.mark.parametrize("host", [True, False])
@pytest.mark.parametrize("idx, upto, moved_upto", [
    ([2, 0, 1], None, 7), ([1], 3, 3), ([2, 1], 100, 7), ([0, 2], 7, 7), ([1, 2], 6, 6),
    ([2, 1, 0], 1, 1),
])
def test_compact_moves_requests_against_loops(host, idx, upto, moved_upto):
    c = _side_cache()
    bufs = (*c.k, *c.v, *c.side)
    before = [b.clone() for b in bufs]
    ptrs = [b.data_ptr() for b in bufs]
    c.compact_(idx if host else torch.tensor(idx), upto)
    for got, w in zip(bufs, _expect_compact(before, idx, moved_upto)):
        assert torch.equal(got, w)
    assert [b.data_ptr() for b in (*c.k, *c.v, *c.side)] == ptrs


@pytest.mark.parametrize("host", [True, False])
def test_compact_index_count_edges(host):
    c = _cache()
    before = [b.clone() for b in (*c.k, *c.v)]
    c.compact_([2, 1, 0] if host else torch.tensor([2, 1, 0]))                # n == batch
    for got, w in zip((*c.k, *c.v), _expect_compact(before, [2, 1, 0], 7)):
        assert torch.equal(got, w)
    with pytest.raises(InvalidInputError, match="4 indices for a cache of 3 requests"):
        c.compact_([0, 1, 2, 0] if host else torch.tensor([0, 1, 2, 0]))


def test_compact_upto_zero_and_identity_move_nothing():
    c = _cache()
    before = [b.clone() for b in (*c.k, *c.v)]
    c.compact_([2, 0], 0)
    c.compact_([0, 1])
    c.compact_([])
    assert all(torch.equal(a, b) for a, b in zip((*c.k, *c.v), before))


def test_a_one_layer_cache_commits():
    c = KVCache.empty(1, 2, 4, 1, 2, torch.float64, "cpu")
    k, v = torch.arange(8.0).view(2, 2, 1, 2), -torch.arange(8.0).view(2, 2, 1, 2)
    c.commit([(k, v)], _i64(1, 3), _i64(2, 1))
    want_k, want_v = torch.zeros(2, 4, 1, 2, dtype=torch.float64), torch.zeros(2, 4, 1, 2)
    want_k[0, 1:3], want_k[1, 3] = k[0], k[1, 0]
    want_v[0, 1:3], want_v[1, 3] = v[0], v[1, 0]
    assert torch.equal(c.k[0], want_k) and torch.equal(c.v[0], want_v.double())
