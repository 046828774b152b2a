"""The top-k kernel (interpreter) against ``topk_lowest_index`` and ``bad_rows``, bit for bit."""

from __future__ import annotations

import pytest
import torch

from dflash2rt.errors import InvalidInputError
from dflash2rt.ops.sampling import bad_rows
from dflash2rt.ops.selector import topk_lowest_index
from dflash2rt.plugin_kit import interpreting

pytest.importorskip("triton", reason="triton is not installed (pip install 'dflash2rt[triton]')")
if not interpreting():
    pytest.skip("TRITON_INTERPRET is off in this process (a GPU is present, see conftest.py): the "
                "kernel runs on the device there, through the conformance suite's select cases",
                allow_module_level=True)
from dflash2rt.kernels import topk  # noqa: E402
from dflash2rt.kernels.launch import recording  # noqa: E402

SPECIAL = torch.tensor([float("-inf"), -2.0, -1.0, -0.0, 0.0, 1.0, 2.0, 1e-45, -1e-45])


def _same(x: torch.Tensor, k: int) -> None:
    """The kernel's (values, ids, bad) are the reference's: ids and value bits on every good
    row, the flags on every row, ids in range on bad rows."""
    vals, ids, bad = topk.topk(x, k)
    want_v, want_i = topk_lowest_index(x, k)
    good = ~bad_rows(x)
    assert torch.equal(bad.bool(), ~good)
    assert torch.equal(ids[good], want_i[good]), (x, ids, want_i)
    assert torch.equal(vals[good].view(torch.int32), want_v[good].float().view(torch.int32))
    assert vals.dtype == torch.float32 and ids.dtype == torch.int64
    assert bool(((ids >= 0) & (ids < x.shape[-1])).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("lead, v, k", [((3,), 37, 5), ((2, 9), 2048, 16), ((5,), 70, 70),
                                        ((4,), 33, 1), ((), 9, 3)])
def test_topk_kernel_equals_the_reference(dtype, lead, v, k):
    """Ties everywhere (small integers), ±0 side by side, -inf entries and an all -inf row but
    one zero, then NaN and +inf rows (flagged), in every dtype."""
    g = torch.Generator().manual_seed(v * k)
    x = torch.randint(-3, 3, (*lead, v), generator=g).float().to(dtype)
    _same(x, k)
    x = torch.randn(*lead, v, generator=g).to(dtype)
    flat = x.view(-1, v)
    flat[0, :4] = torch.tensor([-0.0, 0.0, float("-inf"), -0.0])
    if flat.shape[0] > 1:
        flat[1] = float("-inf")
        flat[1, v // 2] = 0.0
    _same(x, k)
    flat[-1, v - 1] = float("nan")
    flat[0, 1] = float("inf")
    _same(x, k)


def test_topk_kernel_on_drawn_special_values():
    """Rows drawn from ±0, ±inf, subnormals, NaN and ties, 200 of them, k from 1 to V."""
    g = torch.Generator().manual_seed(7)
    pool = torch.cat([SPECIAL, torch.tensor([float("inf"), float("nan")])])
    for _ in range(200):
        v = int(torch.randint(1, 40, (1,), generator=g))
        k = int(torch.randint(1, v + 1, (1,), generator=g))
        pick = torch.randint(0, len(SPECIAL) + 2 * int(torch.rand(1, generator=g) < 0.2),
                             (3, v), generator=g)
        _same(pool[pick], k)


def test_topk_kernel_past_its_vocabulary_tile_and_row_block(monkeypatch):
    """70 values in chunks of 16 (five, the last partial) and five rows in programs of two (the
    last partial): the largest values and the ties that decide sit in later chunks."""
    monkeypatch.setattr(topk, "TOPK_TILE", 16)
    monkeypatch.setattr(topk, "INTERPRET_ROWS", 2)
    g = torch.Generator().manual_seed(3)
    x = torch.randint(-4, 2, (5, 70), generator=g).float()
    x[:, 66] = 9.0                                   # the top in the last chunk
    x[:, [5, 40, 69]] = 3.0                          # ties across chunks: 5, 40, 69 in order
    with recording() as rec:
        _same(x, 12)
    (launch,) = rec.by_key.values()
    assert launch.constexprs()["BLOCK_V"] == 16 and launch.constexprs()["BLOCK_N"] == 2
    vals, ids, _ = topk.topk(x, 4)
    assert ids[:, :4].tolist() == [[66, 5, 40, 69]] * 5


def test_topk_kernel_refuses_what_it_cannot_rank():
    with pytest.raises(InvalidInputError, match="topk kernel"):
        topk.topk(torch.zeros(2, 8, dtype=torch.float64), 2)
    with pytest.raises(InvalidInputError, match="1 <= k <= V"):
        topk.topk(torch.zeros(2, 8), 9)
