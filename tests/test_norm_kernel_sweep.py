"""``kernels.norm.rms_norm`` (under the interpreter) against RMSNorm written anew as float64 loops
(``_normalized``: x / sqrt(mean(x²) + eps), then the weight; half types cast to x's dtype before
the weight, whose float64 product rounds once): rows of scale 3, 0.5 and 0.03 (where an eps of
0.25 dominates) and a row of zeros, a row one tile wide, a row over several tiles with a
partial last one, a transposed x, a single row, no rows, no channels; and each refusal (weight
shape, float64, mixed dtypes) an ``InvalidInputError``."""

from __future__ import annotations

import pytest
import torch

from dflash2rt.errors import InvalidInputError
from dflash2rt.plugin_kit import interpreting

from test_fused_reference_ops import _inputs, _normalized, _weight

pytest.importorskip("triton", reason="triton is not installed (pip install 'dflash2rt[triton]')")
if not interpreting():
    pytest.skip("TRITON_INTERPRET is off in this process (a GPU is present, see conftest.py)",
                allow_module_level=True)
from dflash2rt.kernels import norm  # noqa: E402
from test_kernel_tiles import _args as launch_args  # noqa: E402


def _want(x, w, eps):
    rows = _normalized(x.reshape(1, -1, x.shape[-1]), eps)
    return w.double() * torch.tensor(rows, dtype=torch.float64).view(x.shape)


@pytest.mark.parametrize("eps", [1e-6, 0.25])
def test_float32_rows_follow_the_float64_loops(eps):
    x, w = _inputs(torch.float32), _weight(torch.float32)        # [4, 2, 24]
    got = norm.rms_norm(x, w, eps)
    assert got.dtype == torch.float32 and got.shape == x.shape
    torch.testing.assert_close(got.double(), _want(x, w, eps), rtol=2e-6, atol=2e-6)
    assert torch.equal(got[3], torch.zeros(2, 24))


@pytest.mark.parametrize("eps", [1e-6, 0.25])
def test_float16_casts_before_the_weight_and_rounds_once(eps):
    x, w = _inputs(torch.float16), _weight(torch.float16)
    got = norm.rms_norm(x, w, eps)
    assert got.dtype == torch.float16
    v = torch.tensor(_normalized(x, eps), dtype=torch.float64)
    want = (w.double() * v.to(torch.float16).double()).to(torch.float16)
    near = (v * (1 + 2.0 ** -18)).to(torch.float16) != (v * (1 - 2.0 ** -18)).to(torch.float16)
    assert near.float().mean() < 0.05
    assert torch.equal(got[~near], want[~near])


@pytest.mark.parametrize("h", [16, 40, 48])
def test_rows_over_several_channel_tiles(monkeypatch, h):
    """Tiles of 16 channels: one whole tile, three with a partial last, three whole."""
    monkeypatch.setattr(norm, "NORM_TILE", 16)
    g = torch.Generator().manual_seed(h)
    x = torch.randn(3, h, generator=g) * torch.tensor([[2.0], [0.1], [5.0]])
    w = 0.5 + torch.rand(h, generator=g)
    got = norm.rms_norm(x, w, 1e-3)
    torch.testing.assert_close(got.double(), _want(x, w, 1e-3), rtol=2e-6, atol=2e-6)


def test_a_row_wider_than_the_default_tile_loops_over_tiles_of_1024():
    from dflash2rt.kernels.launch import recording

    g = torch.Generator().manual_seed(4)
    x, w = torch.randn(2, 1030, generator=g), torch.rand(1030, generator=g) + 0.5
    with recording() as rec:
        got = norm.rms_norm(x, w, 1e-6)
    assert [launch_args(r)["BLOCK_H"] for r in rec.by_key.values()] == [1024]
    torch.testing.assert_close(got.double(), _want(x, w, 1e-6), rtol=2e-6, atol=2e-6)


def test_a_transposed_x_and_a_single_row():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(20, 5, generator=g).t()                       # [5, 20], not contiguous
    w = torch.rand(20, generator=g) + 0.5
    torch.testing.assert_close(norm.rms_norm(x, w, 1e-6).double(), _want(x, w, 1e-6),
                               rtol=2e-6, atol=2e-6)
    torch.testing.assert_close(norm.rms_norm(x[1], w, 1e-6).double(), _want(x[1], w, 1e-6),
                               rtol=2e-6, atol=2e-6)


def test_no_rows_and_no_channels_give_empty_outputs_and_launch_nothing():
    from dflash2rt.kernels.launch import recording

    with recording() as rec:
        assert norm.rms_norm(torch.zeros(0, 8), torch.ones(8), 1e-6).shape == (0, 8)
        assert norm.rms_norm(torch.zeros(3, 0), torch.ones(0), 1e-6).shape == (3, 0)
    assert rec.count == 0


@pytest.mark.parametrize("h, tile", [(24, 1024), (40, 16)])
def test_nothing_is_written_past_the_output(monkeypatch, h, tile):
    """The output allocated with a tail of sentinels behind it (the interpreter does not
    check bounds): the last row's partial tile leaves the tail alone."""
    monkeypatch.setattr(norm, "NORM_TILE", tile)
    real, tails = torch.empty_like, []

    def with_tail(x, **kw):
        buf = torch.full((x.numel() + 64,), -123.0, dtype=x.dtype)
        tails.append(buf[x.numel():])
        return buf[:x.numel()].view(x.shape)

    g = torch.Generator().manual_seed(h)
    x, w = torch.randn(3, h, generator=g), torch.rand(h, generator=g) + 0.5
    with monkeypatch.context() as m:
        m.setattr(torch, "empty_like", with_tail)
        got = norm.rms_norm(x, w, 1e-6)
    assert real is torch.empty_like and len(tails) == 1
    assert (tails[0] == -123.0).all()
    torch.testing.assert_close(got.double(), _want(x, w, 1e-6), rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("x, w", [
    (torch.zeros(2, 8), torch.zeros(7)),
    (torch.zeros(2, 8), torch.zeros(1, 8)),
    (torch.zeros(2, 8, dtype=torch.float64), torch.zeros(8, dtype=torch.float64)),
    (torch.zeros(2, 8, dtype=torch.float16), torch.zeros(8)),
    (torch.zeros(2, 8, dtype=torch.int32), torch.zeros(8, dtype=torch.int32)),
], ids=["short weight", "2-d weight", "float64", "mixed", "int32"])
def test_each_bad_argument_is_refused(x, w):
    with pytest.raises(InvalidInputError, match="rms_norm kernel: x"):
        norm.rms_norm(x, w, 1e-6)
