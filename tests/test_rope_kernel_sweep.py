"""``kernels.rope.attention_prologue`` (under the interpreter) against the prologue written anew
as float64 loops (``_rms_loop``, ``_rotate_loop``: x / sqrt(mean(x²) + eps) · w, then
[x1, x2] → x · cos + [-x2, x1] · sin): the returned queries normed by the q weight and eps, the
keys by the k weight and eps, rotated keys and the values as they came written at each row's
own positions and nowhere else; projections that are views of one fused projection, cos / sin
broadcast over the requests, no query head (the draft's context write), no rows; and each
refusal (shapes, dtypes, a cache whose rows are not contiguous) an ``InvalidInputError``."""

from __future__ import annotations

import pytest
import torch

from dflash2rt.errors import InvalidInputError
from dflash2rt.plugin_kit import interpreting

from test_fused_reference_ops import _rms_loop, _rotate_loop

pytest.importorskip("triton", reason="triton is not installed (pip install 'dflash2rt[triton]')")
if not interpreting():
    pytest.skip("TRITON_INTERPRET is off in this process (a GPU is present, see conftest.py)",
                allow_module_level=True)
from dflash2rt.kernels import rope  # noqa: E402
from dflash2rt.kernels.launch import recording  # noqa: E402

R, T, NH, NKV, HD, MAX_LEN = 2, 3, 4, 2, 12, 9     # hd 12: a 16-lane tile with 4 dead lanes
POS = [[7, 0, 3], [2, 8, 5]]                        # permuted, a different set per row
SENTINEL = -5.0


def _inputs(dtype=torch.float32, seed=0):
    """q, k, v as views of one fused projection [R, T, (NH + 2 NKV) HD], rows of different
    scales; cos / sin [R, T, HD]; weights away from 1."""
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(R, T, (NH + 2 * NKV) * HD, generator=g, dtype=torch.float64)
    qkv *= torch.tensor([3.0, 0.2]).view(-1, 1, 1)
    qkv = qkv.to(dtype)
    q, k, v = qkv.split([NH * HD, NKV * HD, NKV * HD], -1)
    q, k, v = q.unflatten(-1, (NH, HD)), k.unflatten(-1, (NKV, HD)), v.unflatten(-1, (NKV, HD))
    cos = torch.randn(R, T, HD, generator=g, dtype=torch.float64).to(dtype)
    sin = torch.randn(R, T, HD, generator=g, dtype=torch.float64).to(dtype)
    qw = (0.5 + torch.rand(HD, generator=g, dtype=torch.float64)).to(dtype)
    kw = (2.0 + torch.rand(HD, generator=g, dtype=torch.float64)).to(dtype)
    return q, k, v, qw, kw, cos, sin


def _caches(dtype=torch.float32, n_kv=NKV):
    return (torch.full((R, MAX_LEN, n_kv, HD), SENTINEL, dtype=dtype),
            torch.full((R, MAX_LEN, n_kv, HD), SENTINEL, dtype=dtype))


def _prepared(x, norm, cos, sin, r, t, h):
    vec = x[r, t, h].double().tolist()
    if norm is not None:
        vec = _rms_loop(vec, norm[0].double().tolist(), norm[1])
    return _rotate_loop(vec, cos[r, t].double().tolist(), sin[r, t].double().tolist())


def _want(q, k, v, q_norm, k_norm, cos, sin, pos, n_kv=NKV):
    want_q = torch.tensor([[[_prepared(q, q_norm, cos, sin, r, t, h) for h in range(q.shape[2])]
                            for t in range(T)] for r in range(R)], dtype=torch.float64)
    want_k = torch.full((R, MAX_LEN, n_kv, HD), SENTINEL, dtype=torch.float64)
    want_v = want_k.clone()
    for r in range(R):
        for t in range(T):
            p = pos[r][t]
            want_k[r, p] = torch.tensor([_prepared(k, k_norm, cos, sin, r, t, h)
                                         for h in range(n_kv)], dtype=torch.float64)
            want_v[r, p] = v[r, t].double()
    return want_q.view(R, T, q.shape[2], HD), want_k, want_v


@pytest.mark.parametrize("q_normed, k_normed", [(True, True), (False, True), (True, False),
                                                (False, False)])
def test_float32_follows_the_float64_loops(q_normed, k_normed):
    q, k, v, qw, kw, cos, sin = _inputs()
    assert not q.is_contiguous()                      # a view of the fused projection
    q_norm = (qw, 1e-5) if q_normed else None
    k_norm = (kw, 0.5) if k_normed else None          # another eps: one for each
    ck, cv = _caches()
    got = rope.attention_prologue(q, k, v, q_norm, k_norm, cos, sin, ck, cv, torch.tensor(POS))
    want_q, want_k, want_v = _want(q, k, v, q_norm, k_norm, cos, sin, POS)
    assert got.dtype == torch.float32 and got.shape == (R, T, NH, HD)
    torch.testing.assert_close(got.double(), want_q, rtol=2e-6, atol=2e-6)
    torch.testing.assert_close(ck.double(), want_k, rtol=2e-6, atol=2e-6)
    assert torch.equal(cv.double(), want_v)


def _half(v: float) -> float:
    """v rounded once to float16."""
    return torch.tensor(v, dtype=torch.float64).half().item()


def _half_prepared(x, norm, cos, sin, r, t, h):
    """The float16 order in float64 loops: the normed row rounded to float16, times the weight
    rounded once; x · cos and [-x2, x1] · sin each rounded once, their sum rounded once. Also
    whether a normed value lies so near a float16 rounding boundary that float32's error could
    cross it."""
    vec, near = x[r, t, h].double().tolist(), False
    if norm is not None:
        w, eps = norm[0].double().tolist(), norm[1]
        scale = 1.0 / (sum(v * v for v in vec) / len(vec) + eps) ** 0.5
        near = any(_half(v * scale * (1 + 2.0 ** -18)) != _half(v * scale * (1 - 2.0 ** -18))
                   for v in vec)
        vec = [_half(wi * _half(v * scale)) for v, wi in zip(vec, w)]
    half = len(vec) // 2
    turned = [-vec[i + half] if i < half else vec[i - half] for i in range(len(vec))]
    c, s = cos[r, t].double().tolist(), sin[r, t].double().tolist()
    return [_half(_half(v * ci) + _half(u * si)) for v, ci, u, si in zip(vec, c, turned, s)], near


@pytest.mark.parametrize("normed", [True, False])
def test_float16_rounds_where_the_half_order_rounds(normed):
    q, k, v, qw, kw, cos, sin = _inputs(torch.float16, seed=1)
    q_norm, k_norm = ((qw, 1e-6), (kw, 0.25)) if normed else (None, None)
    ck, cv = _caches(torch.float16)
    got = rope.attention_prologue(q, k, v, q_norm, k_norm, cos, sin, ck, cv, torch.tensor(POS))
    assert got.dtype == torch.float16
    rows = [(got[r, t, h], _half_prepared(q, q_norm, cos, sin, r, t, h))
            for r in range(R) for t in range(T) for h in range(NH)]
    rows += [(ck[r, POS[r][t], h], _half_prepared(k, k_norm, cos, sin, r, t, h))
             for r in range(R) for t in range(T) for h in range(NKV)]
    clean = [(g, want) for g, (want, near) in rows if not near]
    assert len(clean) >= len(rows) // 3
    for g, want in clean:
        assert g.double().tolist() == want
    assert torch.equal(cv[torch.arange(R).view(-1, 1), torch.tensor(POS)], v)


def test_cos_and_sin_broadcast_over_the_requests():
    """cos / sin [T, HD] expanded to [R, T, HD] (stride 0 over R) are read in place."""
    q, k, v, qw, kw, cos, sin = _inputs(seed=2)
    cos, sin = cos[0].expand(R, T, HD), sin[0].expand(R, T, HD)
    ck, cv = _caches()
    got = rope.attention_prologue(q, k, v, (qw, 1e-6), None, cos, sin, ck, cv, torch.tensor(POS))
    want_q, want_k, _ = _want(q, k, v, (qw, 1e-6), None, cos, sin, POS)
    torch.testing.assert_close(got.double(), want_q, rtol=2e-6, atol=2e-6)
    torch.testing.assert_close(ck.double(), want_k, rtol=2e-6, atol=2e-6)


def _layout(x, how):
    """x [R, T, n] with the same values in another memory layout."""
    if how == "transposed":                                   # strides (T·n, 1, T)
        return x.transpose(1, 2).contiguous().transpose(1, 2)
    return torch.stack([x, torch.full_like(x, 1e4)], -1)[..., 0]   # every other element


@pytest.mark.parametrize("cos_how, sin_how", [(None, "transposed"), ("transposed", "transposed"),
                                              ("every other", "every other")])
def test_cos_and_sin_of_other_strides_are_read_right(cos_how, sin_how):
    q, k, v, qw, kw, cos, sin = _inputs(seed=3)
    cos = cos if cos_how is None else _layout(cos, cos_how)
    sin = _layout(sin, sin_how)
    assert sin.stride(-1) != 1
    ck, cv = _caches()
    with recording() as rec:
        got = rope.attention_prologue(q, k, v, None, (kw, 1e-6), cos, sin, ck, cv,
                                      torch.tensor(POS))
    assert [x.kwargs["enable_fp_fusion"] for x in rec.by_key.values()] == [False]   # no FMA
    want_q, want_k, _ = _want(q, k, v, None, (kw, 1e-6), cos, sin, POS)
    torch.testing.assert_close(got.double(), want_q, rtol=2e-6, atol=2e-6)
    torch.testing.assert_close(ck.double(), want_k, rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("layout", ["padded heads", "transposed heads", "overlapping"])
def test_projections_of_other_strides_are_read_as_their_values(layout):
    """Heads 2 · HD apart (a slice of wider rows), channels NH apart (heads transposed), or
    channels 2 apart in heads HD apart (an overlapping view)."""
    q, k, v, qw, kw, cos, sin = _inputs(seed=5)
    if layout == "padded heads":
        q, k = (torch.cat([x, torch.full_like(x, 1e4)], -1)[..., :HD] for x in (q, k))
        assert q.stride(3) == 1 and q.stride(2) == 2 * HD
    elif layout == "transposed heads":
        q, k = (x.transpose(2, 3).contiguous().transpose(2, 3) for x in (q, k))
        assert q.stride(3) != 1
    else:
        q, k = (torch.randn(R * T * (x.shape[2] + 1) * HD, generator=torch.Generator()
                            .manual_seed(x.shape[2])).as_strided(
                                x.shape, ((T * x.shape[2] + 1) * HD, x.shape[2] * HD, HD, 2))
                for x in (q, k))
        assert q.stride(2) == HD and q.stride(3) == 2
    ck, cv = _caches()
    got = rope.attention_prologue(q, k, v, (qw, 1e-6), (kw, 1e-6), cos, sin, ck, cv,
                                  torch.tensor(POS))
    want_q, want_k, want_v = _want(q, k, v, (qw, 1e-6), (kw, 1e-6), cos, sin, POS)
    torch.testing.assert_close(got.double(), want_q, rtol=2e-6, atol=2e-6)
    torch.testing.assert_close(ck.double(), want_k, rtol=2e-6, atol=2e-6)
    assert torch.equal(cv.double(), want_v)


def test_no_query_head_writes_the_keys_and_values_only():
    """The draft's context write: q [R, T, 0, HD]; one KV head."""
    q, k, v, qw, kw, cos, sin = _inputs(seed=4)
    k, v = k[:, :, 1:], v[:, :, :1]
    ck, cv = _caches(n_kv=1)
    got = rope.attention_prologue(k[:, :, :0], k, v, None, (kw, 0.25), cos, sin, ck, cv,
                                  torch.tensor(POS))
    assert got.shape == (R, T, 0, HD)
    _, want_k, want_v = _want(k[:, :, :0], k, v, None, (kw, 0.25), cos, sin, POS, n_kv=1)
    torch.testing.assert_close(ck.double(), want_k, rtol=2e-6, atol=2e-6)
    assert torch.equal(cv.double(), want_v)


def test_no_rows_launch_and_write_nothing():
    q, k, v, qw, kw, cos, sin = _inputs()
    ck, cv = _caches()
    with recording() as rec:
        got = rope.attention_prologue(q[:, :0], k[:, :0], v[:, :0], None, None, cos[:, :0],
                                      sin[:, :0], ck, cv, torch.zeros(R, 0, dtype=torch.long))
    assert got.shape == (R, 0, NH, HD) and rec.count == 0
    assert (ck == SENTINEL).all() and (cv == SENTINEL).all()


def test_a_single_row_is_computed():
    """R = T = 1, one query head, one KV head."""
    q, k, v, qw, kw, cos, sin = _inputs(seed=6)
    q, k, v, cos, sin = q[:1, :1, :1], k[:1, :1, :1], v[:1, :1, :1], cos[:1, :1], sin[:1, :1]
    ck, cv = (torch.full((1, 4, 1, HD), SENTINEL) for _ in range(2))
    got = rope.attention_prologue(q, k, v, (qw, 1e-6), None, cos, sin, ck, cv,
                                  torch.tensor([[2]]))
    want = _prepared(q, (qw, 1e-6), cos, sin, 0, 0, 0)
    torch.testing.assert_close(got.double().flatten(), torch.tensor(want, dtype=torch.float64),
                               rtol=2e-6, atol=2e-6)
    torch.testing.assert_close(ck[0, 2, 0].double(),
                               torch.tensor(_prepared(k, None, cos, sin, 0, 0, 0),
                                            dtype=torch.float64), rtol=2e-6, atol=2e-6)
    assert torch.equal(cv[0, 2, 0], v[0, 0, 0]) and (ck[0, :2] == SENTINEL).all()


def _args():
    q, k, v, qw, kw, cos, sin = _inputs()
    return [q, k, v, (qw, 1e-6), (kw, 1e-6), cos, sin, *_caches(), torch.tensor(POS)]


def _with(i, fn):
    a = _args()
    a[i] = fn(a[i])
    return a


BAD_SHAPES = {
    "k heads": lambda: _with(1, lambda x: x[:, :, :1]),
    "k rows": lambda: _with(1, lambda x: x[:, :2]),
    "v shape": lambda: _with(2, lambda x: x[:, :, :1]),
    "cos shape": lambda: _with(5, lambda x: x[:, :2]),
    "sin shape": lambda: _with(6, lambda x: x[:1]),
    "pos shape": lambda: _with(9, lambda x: x[:, :2]),
    "odd head dim": lambda: [x[..., :HD - 1] if torch.is_tensor(x) and x.is_floating_point()
                             else None if isinstance(x, tuple) else x for x in _args()],
    "cache requests": lambda: _with(7, lambda x: x[:1]),
    "cache heads": lambda: _with(7, lambda x: x[:, :, :1]),
    "cache v": lambda: _with(8, lambda x: x[:, :4]),
}


@pytest.mark.parametrize("name", BAD_SHAPES)
def test_each_incompatible_shape_is_refused(name):
    a = BAD_SHAPES[name]()
    with pytest.raises(InvalidInputError, match="attention prologue kernel: q"):
        rope.attention_prologue(*a)


@pytest.mark.parametrize("i", [0, 1, 2, 3, 4, 5, 6, 7, 8])
def test_a_tensor_of_another_dtype_is_refused(i):
    a = _args()
    if i in (3, 4):
        a[i] = (a[i][0].half(), a[i][1])
    else:
        a[i] = a[i].half()
    if i == 0:                                        # every tensor float64: not a kernel dtype
        a = [x.double() if torch.is_tensor(x) and x.is_floating_point() else
             (x[0].double(), x[1]) if isinstance(x, tuple) else x for x in a]
    with pytest.raises(InvalidInputError, match="every tensor of one of"):
        rope.attention_prologue(*a)


@pytest.mark.parametrize("i", [7, 8])
def test_a_cache_whose_rows_are_not_contiguous_is_refused(i):
    a = _args()
    a[i] = torch.full((R, MAX_LEN, HD, NKV), SENTINEL).transpose(2, 3)
    with pytest.raises(InvalidInputError, match="cache rows must be contiguous"):
        rope.attention_prologue(*a)
