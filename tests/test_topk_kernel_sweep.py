"""``kernels.topk`` (under the interpreter) against top-k and the bad-row flag written anew over
plain Python lists: the k largest non-NaN values, lowest index first on ties (-0.0 equal to
+0.0), their values as float32; a row is bad where it holds a NaN or a +inf, or no finite value
(an all -inf row among them); on a bad row only the ranked non-NaN entries are compared, the
rest being in range."""

from __future__ import annotations

import math

import pytest
import torch

from dflash2rt.plugin_kit import interpreting

pytest.importorskip("triton", reason="triton is not installed (pip install 'dflash2rt[triton]')")
if not interpreting():
    pytest.skip("TRITON_INTERPRET is off in this process (a GPU is present, see conftest.py)",
                allow_module_level=True)
from dflash2rt.kernels import topk  # noqa: E402

INF, NAN = math.inf, math.nan


def ref_topk(row: list[float], k: int) -> tuple[list[int], bool]:
    """(ids of the k largest non-NaN values, lowest index on ties; the row's bad flag)."""
    ranked = sorted((i for i, x in enumerate(row) if x == x), key=lambda i: (-row[i], i))[:k]
    bad = any(x != x or x == INF for x in row) or not any(abs(x) < INF for x in row)
    return ranked, bad


def _check(rows: list[list[float]], k: int) -> None:
    x = torch.tensor(rows, dtype=torch.float32)
    vals, ids, bad = topk.topk(x, k)
    for r, row in enumerate(rows):
        want, want_bad = ref_topk(row, k)
        assert bool(bad[r]) == want_bad, (row, bad[r])
        assert ids[r, :len(want)].tolist() == want, (row, ids[r])
        assert vals[r, :len(want)].tolist() == [row[i] for i in want]
        assert all(0 <= i < len(row) for i in ids[r].tolist())


@pytest.mark.parametrize("rows, k", [
    ([[-INF] * 5, [-INF, 0.0, -INF, -INF, -INF]], 3),       # all -inf: bad; one zero: good
    ([[-INF], [2.0], [NAN], [INF]], 1),                     # one value a row
    ([[NAN, -INF, NAN, -INF], [-INF, NAN, NAN, NAN], [1.0, NAN, -INF, 1.0]], 2),
    ([[INF, 1.0, -INF, 5.0, 1.0], [-0.0, 0.0, -1.0, 0.0, -0.0]], 5),
])
def test_topk_kernel_flags_and_ranks_like_the_definition(rows, k):
    _check(rows, k)


def test_an_all_minus_inf_row_is_flagged_and_ranked_by_index():
    """Hand-written: every value ties at -inf, so the ids are 0, 1, 2 and the row is bad."""
    vals, ids, bad = topk.topk(torch.full((2, 6), -INF), 3)
    assert bad.tolist() == [1, 1]
    assert ids.tolist() == [[0, 1, 2]] * 2
    assert vals.tolist() == [[-INF] * 3] * 2
