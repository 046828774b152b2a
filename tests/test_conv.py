"""The DFlash2 grouped dynamic depthwise convolution on flattened blocks."""

from __future__ import annotations

import pytest
import torch

from dflash2rt.errors import InvalidInputError
from dflash2rt.ops.conv import conv_finish, conv_prepare, grouped_dynamic_conv


def naive_conv(x, base, delta, block):
    n, h = x.shape
    taps, groups = base.shape[0], delta.shape[2]
    gs = h // groups
    out = torch.zeros_like(x)
    for i in range(n):
        for t in range(taps):
            if i % block < t:
                continue
            for c in range(h):
                out[i, c] += (base[t, c] + delta[i, t, c // gs]) * x[i - t, c]
    return out


@pytest.mark.parametrize("block,taps,h,groups,reqs", [(4, 2, 8, 2, 3), (5, 3, 6, 3, 2),
                                                      (1, 2, 4, 4, 3), (7, 4, 12, 1, 1)])
def test_matches_naive_definition(block, taps, h, groups, reqs):
    g = torch.Generator().manual_seed(block * 100 + taps)
    x = torch.randn(reqs * block, h, generator=g, dtype=torch.float64)
    base = torch.randn(taps, h, generator=g, dtype=torch.float64)
    delta = torch.randn(reqs * block, taps, groups, generator=g, dtype=torch.float64)
    got = grouped_dynamic_conv(x, base, delta, block)
    torch.testing.assert_close(got, naive_conv(x, base, delta, block), rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_identity_init_returns_input_exactly(dtype):
    block, taps, h, groups = 8, 3, 32, 4
    x = torch.randn(3 * block, h).to(dtype)
    base = torch.zeros(taps, h, dtype=dtype)
    base[0] = 1
    delta = torch.zeros(3 * block, taps, groups, dtype=dtype)
    assert torch.equal(conv_prepare(x, base, delta, block), x)
    a = torch.randn(3 * block, h).to(dtype)
    assert torch.equal(conv_finish(x, a, base, delta, block), x + a)


def test_rows_never_read_across_block_boundaries():
    block, taps, h, groups = 4, 4, 6, 2
    g = torch.Generator().manual_seed(0)
    base = torch.randn(taps, h, generator=g, dtype=torch.float64)
    reqs = [torch.randn(block, h, generator=g, dtype=torch.float64) for _ in range(3)]
    deltas = [torch.randn(block, taps, groups, generator=g, dtype=torch.float64) for _ in range(3)]
    batched = grouped_dynamic_conv(torch.cat(reqs), base, torch.cat(deltas), block)
    for i, (x, d) in enumerate(zip(reqs, deltas)):
        alone = grouped_dynamic_conv(x, base, d, block)
        assert torch.equal(batched[i * block:(i + 1) * block], alone)
    # Poison request 1: requests 0 and 2 must not change at all.
    poisoned = torch.cat([reqs[0], torch.full_like(reqs[1], 1e30), reqs[2]])
    again = grouped_dynamic_conv(poisoned, base, torch.cat(deltas), block)
    assert torch.equal(again[:block], batched[:block])
    assert torch.equal(again[2 * block:], batched[2 * block:])


def test_bad_shapes_raise_typed_errors():
    x = torch.zeros(8, 6)
    with pytest.raises(InvalidInputError, match="multiple of block_size"):
        grouped_dynamic_conv(x, torch.zeros(2, 6), torch.zeros(8, 2, 2), block_size=3)
    with pytest.raises(InvalidInputError, match="must divide"):
        grouped_dynamic_conv(x, torch.zeros(2, 6), torch.zeros(8, 2, 4), block_size=4)
    with pytest.raises(InvalidInputError, match="base"):
        grouped_dynamic_conv(x, torch.zeros(2, 5), torch.zeros(8, 2, 2), block_size=4)


def test_taps_reaching_past_the_block_start_read_zero():
    block, taps, h = 3, 5, 4                      # taps t = 3, 4 reach before every block
    x = torch.randn(2 * block, h, dtype=torch.float64)
    base = torch.randn(taps, h, dtype=torch.float64)
    delta = torch.randn(2 * block, taps, 2, dtype=torch.float64)
    got = grouped_dynamic_conv(x, base, delta, block)
    torch.testing.assert_close(got, naive_conv(x, base, delta, block), rtol=0, atol=1e-12)


@pytest.mark.parametrize("groups", [1, 2, 4])
def test_one_tap_scales_each_row_by_its_own_weights(groups):
    """A single tap (Tk = 1) is a valid conv: row i times base[0] + δ[i, 0] per group, no row
    reading another."""
    block, h = 4, 8
    g = torch.Generator().manual_seed(groups)
    x = torch.randn(2 * block, h, generator=g, dtype=torch.float64)
    base = torch.randn(1, h, generator=g, dtype=torch.float64)
    delta = torch.randn(2 * block, 1, groups, generator=g, dtype=torch.float64)
    got = grouped_dynamic_conv(x, base, delta, block)
    want = (base[0] + delta[:, 0].repeat_interleave(h // groups, dim=1)) * x
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    torch.testing.assert_close(got, naive_conv(x, base, delta, block), rtol=0, atol=1e-12)


@pytest.mark.parametrize("shapes,says", [
    (((8, 6), (2, 6), (8, 2)), "delta must be"),           # δ without its group axis
    (((8, 6), (2, 6), (8, 2, 2, 1)), "delta must be"),     # δ with one axis too many
    (((8, 6), (2, 6), (4, 2, 2)), "delta must be"),        # δ for other rows only
    (((8, 6), (2, 6), (8, 3, 2)), "delta must be"),        # δ for more taps than base
    (((8, 6), (2, 6), (8, 1, 2)), "delta must be"),        # ... and for fewer
    (((8, 6), (0, 6), (8, 0, 2)), "at least one tap"),     # no tap at all
    (((8, 6), (2, 6), (8, 2, 0)), "must divide"),          # no group
    (((8, 6), (2, 6, 1), (8, 2, 2)), "base"),              # base of the wrong rank
    (((8, 6), (6,), (8, 2, 2)), "base"),
    (((8, 6, 1), (2, 6), (8, 2, 2)), "input must be"),     # x of the wrong rank
    (((8, 6), (2, 6), (8, 2, 2), 0), "multiple of"),       # block 0
])
def test_each_shape_mismatch_alone_is_refused(shapes, says):
    """Every other argument consistent, one wrong: a typed error naming it."""
    x, base, delta, *block = shapes
    with pytest.raises(InvalidInputError, match=says):
        grouped_dynamic_conv(torch.zeros(x), torch.zeros(base), torch.zeros(delta),
                             block[0] if block else 4)
