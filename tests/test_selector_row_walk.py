"""The walk that scores only the lattice rows it reads (``ops.selector.ROW_WALK_MIN_K``
candidates on): every selector test again through it, the dispatch at the bound, and both
walks' picks, laws and flags equal on random tie-heavy inputs (integer-valued scores, so that
both sum exactly and any difference is a difference of rule, not of rounding)."""

from __future__ import annotations

import pytest
import torch

import test_selector
import test_selector_defs
from dflash2rt.ops import selector
from dflash2rt.ops.batch import SamplingBatch
from dflash2rt.ops.selector import SelectorParams, select

SHIPPED_BOUND = selector.ROW_WALK_MIN_K

# Every test of the selector's two test files, collected here once more: the fixture below
# sends each of their unmasked walks through the row walk, whatever its K.
for _module in (test_selector, test_selector_defs):
    for _name, _test in vars(_module).items():
        if _name.startswith("test_") and callable(_test):
            globals()[f"{_name}__row_walk"] = _test


@pytest.fixture(autouse=True)
def _row_walk_for_every_k(monkeypatch):
    monkeypatch.setattr(selector, "ROW_WALK_MIN_K", 1)


def _case(seed: int, r: int, gamma: int, v: int, k: int, rank: int):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randint(-3, 4, (r, gamma, v), generator=g).float()      # many ties
    proj = torch.randint(-2, 3, (r, gamma, rank), generator=g).float()
    a = torch.randint(-2, 3, (v, rank), generator=g).float()
    b = torch.randint(-2, 3, (v, rank), generator=g).float()
    anchor = torch.randint(0, v, (r,), generator=g)
    u = torch.rand(r, gamma, generator=g)
    return logits, proj, anchor, a, b, u


def _both(monkeypatch, *args, **kw):
    outs = []
    for bound in (10 ** 9, 1):                              # the whole lattice, then the rows
        monkeypatch.setattr(selector, "ROW_WALK_MIN_K", bound)
        outs.append(select(*args, **kw))
    return outs


def _assert_same(whole, rows):
    assert torch.equal(rows.candidates, whole.candidates)
    assert torch.equal(rows.draft, whole.draft)
    assert rows.bad.tolist() == whole.bad.tolist()
    assert rows.bad_lattice.tolist() == whole.bad_lattice.tolist()
    torch.testing.assert_close(rows.q, whole.q, rtol=0, atol=1e-6, equal_nan=True)


@pytest.mark.parametrize("seed", range(40))
def test_both_walks_pick_the_same_path_with_the_same_law_and_flags(monkeypatch, seed):
    g = torch.Generator().manual_seed(1000 + seed)
    r, gamma = int(torch.randint(1, 5, (1,), generator=g)), int(torch.randint(1, 6, (1,),
                                                                               generator=g))
    v = int(torch.randint(2, 48, (1,), generator=g))
    k, rank = int(torch.randint(1, v + 1, (1,), generator=g)), seed % 5
    logits, proj, anchor, a, b, u = _case(seed, r, gamma, v, k, rank)
    if seed % 4 == 0:
        logits[0, 0, : v // 2] = float("-inf")                        # a masked tail
    if seed % 6 == 1:
        logits[-1, -1, 0] = float("nan")                                # a bad draft row
    if seed % 9 == 2 and rank:
        a[int(anchor[0])] = float("inf")                                # a bad lattice row
    temps = [(0.0, 0.6, 1.0, 1.7)[(seed + i) % 4] for i in range(r)]
    sampling = SamplingBatch.build(temps, [0] * r, [1.0] * r)
    params = SelectorParams(k, (1.0, 0.5, 2.0)[seed % 3], None if seed % 2 else 3.0)
    whole, rows = _both(monkeypatch, logits, proj, anchor, a, b, params, sampling, u,
                        has_fp64=seed % 2 == 0)
    _assert_same(whole, rows)


@pytest.mark.parametrize("seed", range(6))
def test_both_walks_take_a_draw_source_s_picks_and_flags(monkeypatch, seed):
    logits, proj, anchor, a, b, u = _case(seed, 3, 4, 30, 9, 3)
    sampling = SamplingBatch.build([0.9, 0.0, 1.2], [0] * 3, [1.0] * 3)
    outs, sources = [], []
    for bound in (10 ** 9, 1):
        monkeypatch.setattr(selector, "ROW_WALK_MIN_K", bound)
        sources.append(test_selector._Source(u, flag_rows={seed % 3}))
        outs.append(select(logits, proj, anchor, a, b, SelectorParams(9), sampling,
                           sources[-1]))
    _assert_same(*outs)
    for whole, rows in zip(sources[0].drawer.laws, sources[1].drawer.laws):
        torch.testing.assert_close(rows, whole, rtol=0, atol=1e-6)


@pytest.mark.parametrize("k,whole_lattice", [(SHIPPED_BOUND - 1, True), (SHIPPED_BOUND, False)])
@pytest.mark.parametrize("temps", [[0.0, 0.0], [1.0, 0.0]])
def test_the_whole_lattice_is_built_below_the_bound_only(monkeypatch, k, whole_lattice,
                                                         temps):
    monkeypatch.setattr(selector, "ROW_WALK_MIN_K", SHIPPED_BOUND)
    built = []
    real = selector.lattice
    monkeypatch.setattr(selector, "lattice", lambda *a: built.append(a) or real(*a))
    logits, proj, anchor, a, b, u = _case(7, 2, 3, SHIPPED_BOUND + 5, k, 4)
    out = select(logits, proj, anchor, a, b, SelectorParams(k),
                 SamplingBatch.build(temps, [0, 0], [1.0, 1.0]), u)
    assert bool(built) == whole_lattice
    assert out.candidates.shape == (2, 3, k) and out.q.shape == (2, 3, k)


def test_a_constrained_walk_builds_the_whole_lattice_at_any_k(monkeypatch):
    built = []
    real = selector.lattice
    monkeypatch.setattr(selector, "lattice", lambda *a: built.append(a) or real(*a))
    logits, proj, anchor, a, b, u = _case(3, 1, 2, 20, 6, 2)
    select(logits, proj, anchor, a, b, SelectorParams(6), SamplingBatch.greedy_batch(1), u,
           mask=test_selector._AllowAll())
    assert len(built) == 1
