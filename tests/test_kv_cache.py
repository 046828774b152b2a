"""KVCache: masked commits write exactly the accepted rows; reset, select and compact keep the layout."""

from __future__ import annotations

import pytest
import torch

from dflash2rt.errors import InvalidInputError
from dflash2rt.models.kv_cache import KVCache

LAYERS, R, MAX_LEN, NKV, HD = 2, 4, 11, 2, 3  # prime max_len, batch includes a full-length request


def _random_cache(seed: int = 0) -> KVCache:
    cache = KVCache.empty(LAYERS, R, MAX_LEN, NKV, HD, torch.float64, "cpu")
    g = torch.Generator().manual_seed(seed)
    for buf in (*cache.k, *cache.v):
        buf.copy_(torch.randn(buf.shape, generator=g, dtype=torch.float64))
    return cache


def _new_kv(t: int, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return [tuple(torch.randn(R, t, NKV, HD, generator=g, dtype=torch.float64) for _ in range(2))
            for _ in range(LAYERS)]


@pytest.mark.parametrize("t", [1, 5])
def test_commit_writes_accepted_rows_and_leaves_everything_else_bit_identical(t):
    cache = _random_cache()
    before = [b.clone() for b in (*cache.k, *cache.v)]
    lens = torch.tensor([0, 3, 9, 10])  # lens + T runs past max_len for the last two requests
    counts = torch.tensor([t, 0, min(t, 2), 1])
    new = _new_kv(t)
    cache.commit(new, lens, counts)
    for i, (buf, old) in enumerate(zip((*cache.k, *cache.v), before)):
        layer, side = i % LAYERS, i // LAYERS
        expect = old.clone()
        for r in range(R):
            n, start = int(counts[r]), int(lens[r])
            expect[r, start : start + n] = new[layer][side][r, :n]
        assert torch.equal(buf, expect), f"layer {layer} side {'kv'[side]}: cache differs outside accepted rows"


def test_commit_with_zero_counts_is_a_no_op():
    cache = _random_cache()
    before = [b.clone() for b in (*cache.k, *cache.v)]
    cache.commit(_new_kv(4), torch.tensor([1, 7, 10, 0]), torch.zeros(R, dtype=torch.int64))
    assert all(torch.equal(a, b) for a, b in zip((*cache.k, *cache.v), before))


def test_commit_rejects_bad_shapes():
    cache = _random_cache()
    lens = torch.zeros(R, dtype=torch.int64)
    with pytest.raises(InvalidInputError, match="layers"):
        cache.commit(_new_kv(2)[:1], lens, lens)
    with pytest.raises(InvalidInputError, match="int64"):
        cache.commit(_new_kv(2), lens.int(), lens)
    with pytest.raises(InvalidInputError, match="exceed max_len"):
        cache.commit(_new_kv(MAX_LEN + 1), lens, lens)


def test_compact_keeps_the_storage():
    cache = _random_cache()
    idx = torch.tensor([3, 0])
    ptr = cache.k[0].data_ptr()
    expect = [b[idx].clone() for b in cache.v]
    cache.compact_(idx)
    assert cache.k[0].data_ptr() == ptr, "compact_ must keep the static storage"
    assert all(torch.equal(b[:2], e) for b, e in zip(cache.v, expect))



@pytest.mark.parametrize("idx", [[3, 0], [0, 1], [0, 2, 3], [1, 3], [2, 1, 0]])
def test_compact_with_host_indices_moves_live_rows_only(idx):
    """A host list moves each kept request's first ``upto`` positions into its new slot, leaves
    the rest of every buffer bit-identical, and copies nothing when no slot changes."""
    cache = _random_cache()
    before = [b.clone() for b in (*cache.k, *cache.v)]
    upto = 3
    cache.compact_(idx, upto)
    for buf, old in zip((*cache.k, *cache.v), before):
        want = old.clone()
        for j, src in enumerate(idx):
            want[j, :upto] = old[src, :upto]
        assert torch.equal(buf, want)
    ptr = cache.k[0].data_ptr()
    cache.compact_(list(range(len(idx))), upto)       # nothing moves
    assert cache.k[0].data_ptr() == ptr
    with pytest.raises(InvalidInputError, match="indices"):
        cache.compact_(list(range(cache.batch_size + 1)))

def test_side_buffers_commit_masked_and_move_with_the_cache():
    """A side buffer (the draft's deferred context hidden) is written like K/V — rows past a
    request's count untouched, bit for bit — read back at any positions, and moved by ``rows``
    and ``compact_`` with the K/V it belongs to."""
    kv = KVCache.empty(1, 3, 8, 1, 2, torch.float32, "cpu")
    side = torch.randn(3, 8, 5)
    cache = KVCache(kv.k, kv.v, (side,))
    before = side.clone()
    new = torch.randn(3, 2, 5)
    lens, counts = torch.tensor([0, 3, 6]), torch.tensor([2, 1, 0])
    cache.rows(3).commit_side(0, new, lens, counts)
    want = before.clone()
    want[0, 0:2], want[1, 3] = new[0], new[1, 0]
    assert torch.equal(side, want)
    pos = torch.tensor([[1, 0], [3, 3], [7, 6]])
    assert torch.equal(cache.read_side(0, pos), torch.stack([want[i, pos[i]] for i in range(3)]))
    with pytest.raises(InvalidInputError):
        cache.commit_side(0, torch.randn(3, 2, 4), lens, counts)
    cache.compact_(torch.tensor([2, 0]))
    assert torch.equal(side[0], want[2]) and torch.equal(side[1], want[0])
    assert cache.rows(2).side[0].data_ptr() == side.data_ptr()
