"""``ops.sampling.bad_rows``: a row is bad when it holds NaN or +inf, or has no finite entry;
-inf alone is a mask. Checked against a per-row Python rule over rows built from every mix of
the special values, in each float dtype, at a small and at the 151,936 vocabulary."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from dflash2rt.ops.sampling import bad_rows

SPECIAL = (0.5, -2.0, float("inf"), float("-inf"), float("nan"))


def _rule(row: list[float]) -> bool:
    return any(math.isnan(v) or v == math.inf for v in row) or \
        not any(math.isfinite(v) for v in row)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_every_mix_of_special_values(dtype):
    rows = [list(r) for r in itertools.product(SPECIAL, repeat=3)]
    got = bad_rows(torch.tensor(rows, dtype=dtype)).tolist()
    assert got == [_rule(r) for r in rows]


def test_large_vocabulary_rows_and_leading_dims():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 4, 151_936, generator=g)
    x[0, 1, 150_000] = float("nan")
    x[0, 2, 7] = float("inf")
    x[1, 0] = float("-inf")                         # no finite entry
    x[1, 3, :151_935] = float("-inf")               # one finite entry left: good
    want = [[False, True, True, False], [True, False, False, False]]
    assert bad_rows(x).tolist() == want
