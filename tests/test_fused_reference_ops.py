"""The models' fusable ops in ``ops.fused`` (the references every backend's kernels follow)
against float64 loops over their definitions.

``rms_norm``: x / sqrt(mean(x²) + eps), cast back to a half type before the weight (Hugging
Face's order: two roundings for half types, not one), in every pair of dtypes; rows of different
scales, a row of zeros and an eps that dominates a row, so a sign or order slip shows.
``attention_prologue``: the returned tensor is the queries (normed by their own weight, rotated),
the keys normed by theirs and rotated, the values as they came, each written at its own row's
permuted positions and nowhere else."""

from __future__ import annotations

import math

import pytest
import torch

from dflash2rt.ops import fused

F16, BF16, F32, F64 = torch.float16, torch.bfloat16, torch.float32, torch.float64
HALF = (F16, BF16)


def _inputs(dtype: torch.dtype) -> torch.Tensor:
    """[4, 2, 24]: rows of scale 3, 0.5 and 0.03 (eps dominates it) and a row of zeros."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(4, 2, 24, generator=g, dtype=F64)
    x *= torch.tensor([3.0, 0.5, 0.03, 0.0], dtype=F64).view(-1, 1, 1)
    return x.to(dtype)


def _weight(dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(6)
    return (0.5 + 1.5 * torch.rand(24, generator=g, dtype=F64)).to(dtype)


def _normalized(x: torch.Tensor, eps: float) -> list[list[list[float]]]:
    """x / sqrt(mean(x²) + eps) over the last axis, in float64 loops."""
    out = []
    for row in x.double().tolist():
        out.append([])
        for vec in row:
            scale = 1.0 / math.sqrt(sum(v * v for v in vec) / len(vec) + eps)
            out[-1].append([v * scale for v in vec])
    return out


@pytest.mark.parametrize("xd, wd", [(F16, F16), (BF16, BF16), (F32, F32), (F64, F64),
                                    (F32, BF16), (F32, F16), (BF16, F32), (F16, F32)])
@pytest.mark.parametrize("eps", [1e-6, 0.25])
def test_rms_norm_follows_its_definition_in_every_dtype_pair(xd, wd, eps):
    x, w = _inputs(xd), _weight(wd)
    got = fused.rms_norm(x, w, eps)
    want_dtype = torch.promote_types(xd, wd)
    assert got.dtype == want_dtype and got.shape == x.shape
    v = torch.tensor(_normalized(x, eps), dtype=F64)
    if xd in HALF:
        # cast back to x's half type, then times the weight: the float64 product of two values
        # of at most 24 bits is exact, so the result is that product rounded once
        h = v.to(xd)
        want = (w.double() * h.double()).to(want_dtype)
        # the op computes v in float32 before the cast: leave out values so near a rounding
        # boundary of the half type that float32's error could cross it
        near = (v * (1 + 2.0 ** -18)).to(xd) != (v * (1 - 2.0 ** -18)).to(xd)
        assert near.float().mean() < 0.05
        assert torch.equal(got[~near], want[~near]), "cast to the half type, then the weight"
    else:
        want = w.double() * v
        tol = 1e-12 if want_dtype == F64 else 2e-6
        torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol)
    assert torch.equal(got[3], torch.zeros_like(got[3])), "a row of zeros stays zero"


def test_the_half_type_order_differs_from_one_rounding():
    """The inputs above tell the two orders apart: the weight applied before the cast (one
    rounding) gives other values, so the test above would catch that order."""
    x, w, eps = _inputs(F16), _weight(F16), 1e-6
    v = torch.tensor(_normalized(x, eps), dtype=F64)
    two = (w.double() * v.to(F16).double()).to(F16)
    one = (w.double() * v).to(F16)
    assert not torch.equal(one, two)


def _rms_loop(vec: list[float], weight: list[float], eps: float) -> list[float]:
    scale = 1.0 / math.sqrt(sum(v * v for v in vec) / len(vec) + eps)
    return [v * scale * w for v, w in zip(vec, weight)]


def _rotate_loop(vec: list[float], cos: list[float], sin: list[float]) -> list[float]:
    """[x1, x2] → x * cos + [-x2, x1] * sin."""
    half = len(vec) // 2
    turned = [-vec[i + half] if i < half else vec[i - half] for i in range(len(vec))]
    return [v * c + t * s for v, c, t, s in zip(vec, cos, turned, sin)]


R, T, NH, NKV, HD, MAX_LEN = 2, 3, 4, 2, 6, 7
POS = [[4, 0, 2], [1, 6, 3]]          # permuted, a different set per row
SENTINEL = -7.0


@pytest.mark.parametrize("q_normed, k_normed", [(True, True), (True, False), (False, True),
                                                (False, False)])
def test_attention_prologue_returns_queries_and_writes_keys_and_values_at_each_row_s_positions(
        q_normed, k_normed):
    g = torch.Generator().manual_seed(7)
    q = torch.randn(R, T, NH, HD, generator=g, dtype=F64)
    k = torch.randn(R, T, NKV, HD, generator=g, dtype=F64) * 2
    v = torch.randn(R, T, NKV, HD, generator=g, dtype=F64) + 3
    cos = torch.randn(R, T, HD, generator=g, dtype=F64)
    sin = torch.randn(R, T, HD, generator=g, dtype=F64)
    qw, kw = 0.5 + torch.rand(HD, generator=g, dtype=F64), 2 + torch.rand(HD, generator=g,
                                                                           dtype=F64)
    q_norm, k_norm = (qw, 1e-5) if q_normed else None, (kw, 0.5) if k_normed else None
    cache_k = torch.full((R, MAX_LEN, NKV, HD), SENTINEL, dtype=F64)
    cache_v = torch.full((R, MAX_LEN, NKV, HD), SENTINEL, dtype=F64)
    got = fused.attention_prologue(q, k, v, q_norm, k_norm, cos, sin, cache_k, cache_v,
                                   torch.tensor(POS))

    def prepared(x, norm, r, t, h):
        vec = x[r, t, h].tolist()
        if norm is not None:
            vec = _rms_loop(vec, norm[0].tolist(), norm[1])
        return _rotate_loop(vec, cos[r, t].tolist(), sin[r, t].tolist())

    want_q = torch.tensor([[[prepared(q, q_norm, r, t, h) for h in range(NH)]
                            for t in range(T)] for r in range(R)], dtype=F64)
    assert got.shape == (R, T, NH, HD)
    torch.testing.assert_close(got, want_q, rtol=1e-12, atol=1e-12)
    want_k = torch.full_like(cache_k, SENTINEL)
    want_v = torch.full_like(cache_v, SENTINEL)
    for r in range(R):
        for t in range(T):
            p = POS[r][t]
            want_k[r, p] = torch.tensor([prepared(k, k_norm, r, t, h) for h in range(NKV)],
                                         dtype=F64)
            want_v[r, p] = v[r, t]
    torch.testing.assert_close(cache_k, want_k, rtol=1e-12, atol=1e-12)
    assert torch.equal(cache_v, want_v)


def test_current_is_the_reference_outside_using_and_the_implementation_inside():
    class Impl:
        pass

    impl = Impl()
    assert fused.current() is fused.REFERENCE
    with fused.using(impl):
        assert fused.current() is impl
        with fused.using(None):
            assert fused.current() is fused.REFERENCE
        assert fused.current() is impl
    assert fused.current() is fused.REFERENCE
    with pytest.raises(RuntimeError):
        with fused.using(impl):
            raise RuntimeError("a failing body")
    assert fused.current() is fused.REFERENCE, "the implementation is reset after an error"
