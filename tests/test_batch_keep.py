"""Dropping rows from a batch: ``fewest_moves`` orders the kept rows so that only the rows past
the new size move, and ``BatchState.keep`` in any order carries each kept row's whole state
(cache rows, lengths, anchors, seeds, keys, sampling parameters, row ids) with it."""

from __future__ import annotations

import itertools

import pytest
import torch

from dflash2rt.engine.request import Request, SamplingParams
from dflash2rt.engine.state import fewest_moves, new_state
from dflash2rt.models.kv_cache import KVCache

R, MAX_LEN = 5, 7


def _subsets(n: int):
    return [list(c) for k in range(n + 1) for c in itertools.combinations(range(n), k)]


@pytest.mark.parametrize("alive", _subsets(R))
def test_fewest_moves_keeps_rows_in_place_and_moves_only_the_tail(alive):
    order = fewest_moves(alive)
    n = len(alive)
    assert sorted(order) == alive, "every kept row exactly once"
    for j, src in enumerate(order):
        if src < n:
            assert src == j, f"row {src} lies in the kept slots and must stay in slot {src}"
    moved = sum(src != j for j, src in enumerate(order))
    assert moved == sum(i >= n for i in alive), "one move per freed slot below the new size"


def _state():
    reqs = [Request((1 + i,), SamplingParams(temperature=0.1 * i, top_k=i, seed=100 + i),
                    key=10 + i) for i in range(R)]
    target = KVCache.empty(2, R, MAX_LEN, 2, 3, torch.float64, "cpu")
    draft = KVCache.empty(1, R, MAX_LEN, 1, 2, torch.float64, "cpu")
    for cache in (target, draft):
        for buf in (*cache.k, *cache.v):
            for r in range(R):                 # row r holds r + position / 10 everywhere
                buf[r].copy_((r + torch.arange(MAX_LEN) / 10.0).view(-1, 1, 1)
                             .expand_as(buf[r]))
    st = new_state(reqs, target, draft, torch.device("cpu"))
    st.lens.copy_(torch.tensor([3 + (i % 3) for i in range(R)]))
    st.anchor.copy_(torch.tensor([50 + i for i in range(R)]))
    st.host_lens[:] = st.lens.tolist()
    st.rows[:] = [200 + i for i in range(R)]
    return st


@pytest.mark.parametrize("alive", [a for a in _subsets(R) if a])
@pytest.mark.parametrize("ordering", ["fewest moves", "in order"])
def test_keep_carries_every_kept_rows_state_to_its_new_slot(alive, ordering):
    st = _state()
    before = {name: getattr(st, name).clone() for name in ("lens", "anchor", "seed", "key")}
    temp = st.sampling.temperature.clone()
    order = fewest_moves(alive) if ordering == "fewest moves" else alive
    kept = st.keep(order)
    assert kept.size == len(alive)
    assert kept.rows == [200 + i for i in order]
    assert kept.host_lens == [before["lens"][i].item() for i in order]
    for name, was in before.items():
        assert getattr(kept, name).tolist() == was[order].tolist(), name
    assert kept.sampling.temperature.tolist() == temp[order].tolist()
    for cache in (kept.target_cache, kept.draft_cache):
        for buf in (*cache.k, *cache.v):
            for j, src in enumerate(order):
                upto = int(before["lens"][src])
                want = (src + torch.arange(upto) / 10.0).view(-1, 1, 1).expand_as(buf[j, :upto])
                assert torch.equal(buf[j, :upto], want), f"slot {j} must hold row {src}'s cache"


def test_retain_keeps_the_batch_when_no_row_leaves_and_moves_only_the_tail_otherwise():
    st = _state()
    assert st.retain(list(range(R))) is st
    kept = _state().retain([0, 2, 4])               # slot 1 freed: row 4 moves into it
    assert kept.rows == [200, 204, 202]
