"""The race's mapping from values to a token against sampler.py's definition, written anew in
loops: argmin E / p in float64 over p > 0, ties to the lower token id (then the lower position
of a sparse candidate set), and -1, exactly, for a row that is not a law (NaN, ±inf, a negative
mass or no positive mass), each defect alone and beside good rows.

Classes of bug held: a flag value other than -1 for a broken row (callers test for -1); a law
check that joins its conditions the wrong way (one defect alone passes); a row's flag or winner
that depends on the other rows of the batch."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from dflash2rt.watermark import sampler

NAN, INF = float("nan"), float("inf")


def is_law(p: list[float]) -> bool:
    return all(math.isfinite(x) and x >= 0 for x in p) and any(x > 0 for x in p)


def dense_reference(p: list[float], e: list[float]) -> int:
    if not is_law(p):
        return -1
    best, arg = INF, -1
    for i, (x, ei) in enumerate(zip(p, e)):
        if x > 0 and ei / x < best:                        # strict: the lower id keeps a tie
            best, arg = ei / x, i
    return arg


def sparse_reference(p: list[float], ids: list[int], e: list[float]) -> int:
    if not is_law(p):
        return -1
    keys = [(ei / x, t, j) for j, (x, t, ei) in enumerate(zip(p, ids, e)) if x > 0]
    return min(keys)[2]                                     # key, then token id, then position


def _batch(seed: int, v: int = 7):
    """Rows: each defect alone between good rows (some with zeros, ties and repeated ids)."""
    g = np.random.default_rng(seed)
    rows = []
    defects = [None, ("nan", NAN), None, ("+inf", INF), ("-inf", -INF), None,
               ("negative", -1e-30), ("all zero", 0.0), None, ("nan-in-zeros", NAN)]
    for d in defects:
        p = g.random(v).astype(np.float32)
        p[g.random(v) < 0.3] = 0.0
        p[g.integers(0, v)] = np.float32(0.25)
        if d is None:
            rows.append(p)
            continue
        name, value = d
        if name == "all zero":
            p[:] = 0.0
        elif name == "nan-in-zeros":
            p[:] = 0.0
            p[g.integers(0, v)] = value
        else:
            p[g.integers(0, v)] = value
        rows.append(p)
    probs = np.stack(rows)
    e = g.exponential(size=probs.shape)
    e[0, :] = 1.0                                           # ties in the first row
    probs[0, :] = np.float32(0.5)
    probs[0, 0] = 0.0
    return probs, e


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dense_race_and_flags_equal_the_definition_row_by_row(seed):
    probs, e = _batch(seed)
    got = sampler.exp_min_index(torch.from_numpy(probs), torch.from_numpy(e)).tolist()
    want = [dense_reference(p.astype(np.float64).tolist(), x.tolist())
            for p, x in zip(probs, e)]
    assert got == want
    assert got.count(-1) == 6 and got[0] == 1
    for r in range(len(probs)):                             # each row alone: the same answer
        assert sampler.exp_min_index(torch.from_numpy(probs[r:r + 1]),
                                     torch.from_numpy(e[r:r + 1])).tolist() == [want[r]]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sparse_race_and_flags_equal_the_definition_row_by_row(seed):
    probs, e = _batch(seed)
    g = np.random.default_rng(100 + seed)
    ids = g.integers(0, 5, probs.shape)                     # repeated ids in a row
    ids[0] = [0, 3, 3, 9, 1, 1, 7]          # tie: id 1 at position 4 wins (id 0 has p = 0)
    got = sampler.exp_min_candidates(torch.from_numpy(probs), torch.from_numpy(ids),
                                     torch.from_numpy(e)).tolist()
    want = [sparse_reference(p.astype(np.float64).tolist(), i.tolist(), x.tolist())
            for p, i, x in zip(probs, ids, e)]
    assert got == want
    assert got.count(-1) == 6 and got[0] == 4
    for r in range(len(probs)):
        assert sampler.exp_min_candidates(
            torch.from_numpy(probs[r:r + 1]), torch.from_numpy(ids[r:r + 1]),
            torch.from_numpy(e[r:r + 1])).tolist() == [want[r]]
