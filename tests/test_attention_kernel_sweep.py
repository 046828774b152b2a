"""``kernels.attention`` (under the interpreter) against attention written anew as float64 loops
over plain Python floats: row (r, j), query head h reads KV head h // G over the keys
lo <= p < min(hi, L), softmax(scale · q·k) · v; a row whose range is empty gets zeros; keys at
or past L in the cache buffer are never read (NaN there changes nothing). The argument check
refuses each incompatible shape, an lo / hi not [R, T], mixed or float64 dtypes and a head dim
past 256 with ``InvalidInputError`` (no launch), and accepts head dim 256."""

from __future__ import annotations

import math

import pytest
import torch

from dflash2rt.errors import InvalidInputError
from dflash2rt.plugin_kit import interpreting

pytest.importorskip("triton", reason="triton is not installed (pip install 'dflash2rt[triton]')")
if not interpreting():
    pytest.skip("TRITON_INTERPRET is off in this process (a GPU is present, see conftest.py)",
                allow_module_level=True)
from dflash2rt.kernels import attention  # noqa: E402
from dflash2rt.kernels.tuning import Tuning  # noqa: E402

from test_kernel_tiles import _args as launch_args  # noqa: E402

SMALL = Tuning(attn_block_m=16, attn_block_n=16)


def ref_attention(q, k, v, lo, hi, scale):
    """float64 loops: [R, T, nh, hd] nested lists."""
    q, k, v = (x.double().tolist() for x in (q, k, v))
    n_keys, group = len(k[0]), len(q[0][0]) // len(k[0][0])
    out = []
    for r, rows in enumerate(q):
        out.append([])
        for j, heads in enumerate(rows):
            keys = range(int(lo[r, j]), min(int(hi[r, j]), n_keys))
            out[r].append([])
            for h, qh in enumerate(heads):
                kvh = h // group
                if not keys:
                    out[r][j].append([0.0] * len(qh))
                    continue
                s = [scale * math.fsum(a * b for a, b in zip(qh, k[r][p][kvh])) for p in keys]
                top = max(s)
                w = [math.exp(x - top) for x in s]
                total = math.fsum(w)
                out[r][j].append([math.fsum(wi * v[r][p][kvh][d] for wi, p in zip(w, keys))
                                  / total for d in range(len(qh))])
    return torch.tensor(out, dtype=torch.float64)


def _case(seed, r, t, n_kv, group, hd, n_keys, spare=6, dtype=torch.float32):
    """q and k, v = cache[:, :L] of a cache with ``spare`` rows past L filled with NaN."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(r, t, n_kv * group, hd, generator=g).to(dtype)
    cache = torch.randn(2, r, n_keys + spare, n_kv, hd, generator=g).to(dtype)
    cache[:, :, n_keys:] = float("nan")                  # never read
    return q, cache[0, :, :n_keys], cache[1, :, :n_keys]


def test_rows_match_the_float64_loops_with_ragged_and_clamped_ranges():
    """Ranges starting past the first key tile, ending at L, past L (clamped to L) and
    ragged across the rows of one tile; 3 rows × 4 heads = 12 rows of a 16-row tile."""
    q, k, v = _case(1, 2, 3, 2, 4, 20, 37)
    lo = torch.tensor([[0, 17, 33], [5, 0, 36]])
    hi = torch.tensor([[37, 30, 40], [6, 90, 37]])
    got = attention.attention(q, k, v, lo, hi, 0.3, SMALL)
    assert got.dtype == torch.float32 and got.shape == q.shape
    torch.testing.assert_close(got.double(), ref_attention(q, k, v, lo, hi, 0.3),
                               rtol=2e-6, atol=2e-6)


def test_default_tiles_read_only_up_to_l():
    q, k, v = _case(2, 1, 2, 1, 2, 16, 70, spare=64)
    lo = torch.tensor([[0, 3]])
    hi = torch.tensor([[70, 200]])
    got = attention.attention(q, k, v, lo, hi, 0.25)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.double(), ref_attention(q, k, v, lo, hi, 0.25),
                               rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("lo_hi", [(4, 4), (9, 2), (0, 0)])
def test_an_empty_range_gives_zeros_and_leaves_the_other_rows_alone(lo_hi):
    q, k, v = _case(3, 1, 2, 1, 2, 16, 12)
    lo = torch.tensor([[lo_hi[0], 1]])
    hi = torch.tensor([[lo_hi[1], 12]])
    got = attention.attention(q, k, v, lo, hi, 0.5, SMALL)
    assert torch.equal(got[0, 0], torch.zeros(2, 16))
    torch.testing.assert_close(got.double(), ref_attention(q, k, v, lo, hi, 0.5),
                               rtol=2e-6, atol=2e-6)


def test_one_key_returns_its_value_and_scale_sets_the_weights():
    """One visible key: its value exactly whatever the score; two keys with scores 0 and
    s · scale: weights 1 : e^(s · scale)."""
    k = torch.zeros(1, 2, 1, 16)
    v = torch.zeros(1, 2, 1, 16)
    k[0, 1, 0, 0] = 2.0                                   # key 1 scores 2 · q0
    v[0, 0, 0, 0], v[0, 1, 0, 0] = 1.0, 3.0
    q = torch.zeros(1, 2, 1, 16)
    q[..., 0] = 1.0
    got = attention.attention(q, k, v, torch.tensor([[1, 0]]), torch.tensor([[2, 2]]), 0.5)
    assert torch.equal(got[0, 0, 0], v[0, 1, 0])
    e = math.exp(2.0 * 0.5)
    assert got[0, 1, 0, 0].item() == pytest.approx((1.0 + 3.0 * e) / (1.0 + e), rel=1e-6)
    assert torch.equal(got[0, 1, 0, 1:], torch.zeros(15))


def test_a_single_element_output_is_computed():
    """q [1, 1, 1, 1] (head dim 1) over two keys."""
    q = torch.tensor([2.0]).view(1, 1, 1, 1)
    k = torch.tensor([0.0, 1.0]).view(1, 2, 1, 1)
    v = torch.tensor([5.0, -1.0]).view(1, 2, 1, 1)
    got = attention.attention(q, k, v, torch.tensor([[0]]), torch.tensor([[2]]), 1.0)
    e = math.exp(2.0)
    assert got.item() == pytest.approx((5.0 - e) / (1.0 + e), rel=1e-6)


def test_no_query_row_gives_an_empty_output():
    q, k, v = _case(6, 2, 0, 1, 2, 16, 5)
    got = attention.attention(q, k, v, torch.zeros(2, 0, dtype=torch.long),
                              torch.zeros(2, 0, dtype=torch.long), 1.0)
    assert got.shape == (2, 0, 2, 16)


def test_head_dim_256_runs_integer_tiles_capped_at_32():
    """At head dim 256 the tuned tiles (64) are capped to 32 rows (of 17 × 4) and 32 keys."""
    from dflash2rt.kernels.launch import recording

    q, k, v = _case(5, 1, 17, 1, 4, 256, 40)
    lo, hi = torch.arange(17).view(1, -1), torch.arange(28, 45).view(1, -1)
    with recording() as rec:
        got = attention.attention(q, k, v, lo, hi, 256 ** -0.5)
    tiles = [(launch_args(x)["BLOCK_M"], launch_args(x)["BLOCK_N"]) for x in rec.by_key.values()]
    assert tiles == [(32, 32)] and all(type(b) is int for b in tiles[0])
    torch.testing.assert_close(got.double(), ref_attention(q, k, v, lo, hi, 256 ** -0.5),
                               rtol=2e-6, atol=2e-6)


def test_one_row_tile_holds_every_query_row_of_a_group_up_to_the_tuned_tile():
    """5 positions × 4 heads = 20 rows: one tile of 32 (the next power of two), not 16."""
    from dflash2rt.kernels.launch import recording

    q, k, v = _case(7, 1, 5, 1, 4, 16, 9)
    lo, hi = torch.zeros(1, 5, dtype=torch.long), torch.arange(5, 10).view(1, -1)
    with recording() as rec:
        got = attention.attention(q, k, v, lo, hi, 0.25)
    tiles = [(launch_args(x)["BLOCK_M"], launch_args(x)["BLOCK_N"]) for x in rec.by_key.values()]
    assert tiles == [(32, 64)]
    torch.testing.assert_close(got.double(), ref_attention(q, k, v, lo, hi, 0.25),
                               rtol=2e-6, atol=2e-6)


def test_float16_runs_and_keeps_its_dtype():
    """(bfloat16 is the GPU lanes': the interpreter's bfloat16 ``tl.dot`` is wrong.)"""
    q, k, v = _case(4, 1, 2, 2, 2, 16, 9, dtype=torch.float16)
    lo, hi = torch.zeros(1, 2, dtype=torch.long), torch.tensor([[8, 20]])
    got = attention.attention(q, k, v, lo, hi, 0.25, SMALL)
    assert got.dtype == torch.float16
    torch.testing.assert_close(got.double(), ref_attention(q, k, v, lo, hi, 0.25),
                               rtol=5e-3, atol=5e-3)


def _args(r=2, t=3, nh=4, hd=8, n_keys=5, n_kv=2, dtype=torch.float32):
    return (torch.zeros(r, t, nh, hd, dtype=dtype), torch.zeros(r, n_keys, n_kv, hd, dtype=dtype),
            torch.zeros(r, n_keys, n_kv, hd, dtype=dtype), torch.zeros(r, t, dtype=torch.long),
            torch.ones(r, t, dtype=torch.long))


def test_the_check_accepts_head_dim_256_and_returns_the_sizes():
    assert attention.check_attention_args(*_args(hd=256)) == (2, 3, 4, 256, 5, 2)
    assert attention.check_attention_args(*_args(nh=6, n_kv=3, n_keys=1)) == (2, 3, 6, 8, 1, 3)


def _replace(args, i, x):
    return tuple(x if n == i else a for n, a in enumerate(args))


BAD_SHAPES = {
    "q 3-d": lambda a: _replace(a, 0, a[0][..., 0]),
    "k 3-d": lambda a: _replace(_replace(a, 1, a[1][..., 0]), 2, a[2][..., 0]),
    "v shape": lambda a: _replace(a, 2, a[2][:, :4]),
    "requests": lambda a: _replace(_replace(a, 1, a[1][:1]), 2, a[2][:1]),
    "head dim": lambda a: _replace(_replace(a, 1, a[1][..., :4]), 2, a[2][..., :4]),
    "no kv head": lambda a: _replace(_replace(a, 1, a[1][:, :, :0]), 2, a[2][:, :, :0]),
    "nh % n_kv": lambda a: _replace(a, 0, a[0][:, :, :3]),
}


@pytest.mark.parametrize("name", BAD_SHAPES)
def test_the_check_refuses_each_incompatible_shape(name):
    with pytest.raises(InvalidInputError, match="attention: incompatible q"):
        attention.check_attention_args(*BAD_SHAPES[name](_args()))


@pytest.mark.parametrize("which", [3, 4])
def test_the_check_refuses_lo_or_hi_not_r_by_t(which):
    a = _args()
    with pytest.raises(InvalidInputError, match=r"must be \[R, T\] = \(2, 3\)"):
        attention.check_attention_args(*_replace(a, which, a[which][:, :2]))


@pytest.mark.parametrize("which, dtype", [(0, torch.float64), (1, torch.float16),
                                          (2, torch.bfloat16)])
def test_the_check_refuses_float64_and_mixed_dtypes(which, dtype):
    a = _args(dtype=torch.float64) if which == 0 else _args()
    with pytest.raises(InvalidInputError, match="must share one of"):
        attention.check_attention_args(*_replace(a, which, a[which].to(dtype)))


def test_head_dim_past_256_is_refused_before_a_launch():
    with pytest.raises(InvalidInputError, match="head dim 257 > 256"):
        attention.attention(*_args(hd=257), 1.0)
