"""RMSNorm, SwiGLU and GQA attention layers against float64 loops over their definitions."""

from __future__ import annotations

import math

import pytest
import torch

from dflash2rt.models.layers import Attention, RMSNorm, SwiGLU
from dflash2rt.ops import fused

R, T, P, HID, NH, NKV, HD = 2, 3, 2, 8, 4, 2, 4


def _lin(layer, x):
    """y_j = sum_i W[j, i] x_i (+ b_j), x a list."""
    w = layer.weight.tolist()
    b = layer.bias.tolist() if layer.bias is not None else [0.0] * len(w)
    return [sum(wj[i] * x[i] for i in range(len(x))) + b[j] for j, wj in enumerate(w)]


def _rms(x, w, eps):
    s = math.sqrt(sum(v * v for v in x) / len(x) + eps)
    return [v / s * wi for v, wi in zip(x, w)]


def _rot(x, cos, sin):
    h = len(x) // 2
    rh = [-x[i + h] for i in range(h)] + [x[i] for i in range(h)]
    return [x[i] * cos[i] + rh[i] * sin[i] for i in range(len(x))]


def _heads(flat, n):
    return [flat[i * HD:(i + 1) * HD] for i in range(n)]


def _randomize(mod, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in mod.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * 0.5 + 0.2)
    return mod


def _attn(bias, norm_eps, seed=0):
    return _randomize(Attention(HID, NH, NKV, HD, bias, norm_eps).double(), seed)


def _inputs(seed=5, t=T):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(R, t, HID, generator=g, dtype=torch.float64)
    ang = torch.randn(R, t, HD, generator=g, dtype=torch.float64)
    return x, ang.cos() * 1.1, ang.sin() * 0.9          # not a unit rotation: each term shows


def _project(a: Attention, x, cos, sin):
    """Per (r, t): rotated q heads [NH][HD], rotated k heads and v heads [NKV][HD]."""
    q, k, v = {}, {}, {}
    for r in range(x.shape[0]):
        for t in range(x.shape[1]):
            xs, c, s = x[r, t].tolist(), cos[r, t].tolist(), sin[r, t].tolist()
            qs, ks = _heads(_lin(a.q_proj, xs), NH), _heads(_lin(a.k_proj, xs), NKV)
            if a.q_norm is not None:
                qs = [_rms(h, a.q_norm.weight.tolist(), a.q_norm.eps) for h in qs]
                ks = [_rms(h, a.k_norm.weight.tolist(), a.k_norm.eps) for h in ks]
            q[r, t] = [_rot(h, c, s) for h in qs]
            k[r, t] = [_rot(h, c, s) for h in ks]
            v[r, t] = _heads(_lin(a.v_proj, xs), NKV)
    return q, k, v


def _write_rows(want_k, want_v, k, v, pos) -> None:
    """The expected caches: row r's token t's key and value written at slot pos[r, t]."""
    for r in range(R):
        for t in range(T):
            want_k[r, int(pos[r, t])] = torch.tensor(k[r, t], dtype=torch.float64)
            want_v[r, int(pos[r, t])] = torch.tensor(v[r, t], dtype=torch.float64)


def _softmax_mix(qh, keys, vals, scale):
    """softmax(q · k * scale) weighted sum of vals over the given keys."""
    sc = [scale * sum(a * b for a, b in zip(qh, kh)) for kh in keys]
    m = max(sc)
    e = [math.exp(x - m) for x in sc]
    return [sum(e[i] * vals[i][d] for i in range(len(e))) / sum(e) for d in range(HD)]


def _close(got, want, tol=1e-10):
    assert got.shape == torch.Size([len(want)]) or got.numel() == len(want)
    for g, w in zip(got.reshape(-1).tolist(), want):
        assert abs(g - w) <= tol * (1 + abs(w)), (got, want)


@pytest.mark.parametrize("eps", [1e-6, 0.5])
def test_rms_norm_module(eps):
    n = _randomize(RMSNorm(6, eps).double(), 1)
    assert n.eps == eps and n.weight.shape == (6,)
    assert torch.equal(RMSNorm(6, eps).weight, torch.ones(6))
    x = torch.randn(2, 3, 6, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    y = n(x)
    for r in range(2):
        for t in range(3):
            _close(y[r, t], _rms(x[r, t].tolist(), n.weight.tolist(), eps))


@pytest.mark.parametrize("bias", [False, True])
def test_swiglu(bias):
    m = _randomize(SwiGLU(HID, 5, bias).double(), 3)
    assert (m.gate_proj.bias is not None) == bias and (m.down_proj.bias is not None) == bias
    x = torch.randn(2, HID, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    y = m(x)
    g, u = m.gate_up(x)
    for r in range(2):
        xs = x[r].tolist()
        gate, up = _lin(m.gate_proj, xs), _lin(m.up_proj, xs)
        _close(g[r], gate)
        _close(u[r], up)
        h = [a / (1 + math.exp(-a)) * b for a, b in zip(gate, up)]
        _close(y[r], _lin(m.down_proj, h))


@pytest.mark.parametrize("bias, eps", [(False, None), (True, None), (False, 0.25), (True, 1e-6)])
def test_projections(bias, eps):
    a = _attn(bias, eps)
    assert a.scale == HD ** -0.5 and (a.n_heads, a.n_kv_heads, a.head_dim) == (NH, NKV, HD)
    assert (a.q_norm is None) == (a.k_norm is None) == (eps is None)
    if eps is not None:
        assert a.q_norm.eps == a.k_norm.eps == eps and a.k_norm.weight.shape == (HD,)
    x, cos, sin = _inputs()
    q, k, v = _project(a, x, cos, sin)
    gq = a.project_q(x, cos, sin)
    gk, gv = a.project_kv(x, cos, sin)
    tq, tk, tv = a.project_qkv(x, cos, sin)
    assert gq.shape == (R, T, NH, HD) and gk.shape == gv.shape == (R, T, NKV, HD)
    for r in range(R):
        for t in range(T):
            for h in range(NH):
                _close(gq[r, t, h], q[r, t][h])
                _close(tq[r, t, h], q[r, t][h])
            for h in range(NKV):
                for got, want in ((gk, k), (gv, v), (tk, k), (tv, v)):
                    _close(got[r, t, h], want[r, t][h])


@pytest.mark.parametrize("bias, eps", [(False, None), (True, 0.25)])
def test_forward_with_a_mask(bias, eps):
    """Row (r, t) attends the keys its mask allows over [past ; new]; query head h reads
    kv head h // (NH / NKV)."""
    a = _attn(bias, eps, seed=7)
    x, cos, sin = _inputs(6)
    g = torch.Generator().manual_seed(8)
    past_k = torch.randn(R, P, NKV, HD, generator=g, dtype=torch.float64)
    past_v = torch.randn(R, P, NKV, HD, generator=g, dtype=torch.float64)
    mask = torch.rand(R, T, P + T, generator=g) < 0.6
    mask[..., P] = True                                   # every row sees a key
    mask[1, 2] = False
    mask[1, 2, 1] = True                                  # one row sees one past key only
    out, gk, gv = a(x, cos, sin, past_k, past_v, mask)
    q, k, v = _project(a, x, cos, sin)
    assert out.shape == (R, T, HID)
    for r in range(R):
        for t in range(T):
            _close(gk[r, t].reshape(-1), sum(k[r, t], []))
            _close(gv[r, t].reshape(-1), sum(v[r, t], []))
            heads = []
            for h in range(NH):
                kvh = h // (NH // NKV)
                keys = [past_k[r, p, kvh].tolist() for p in range(P)] + \
                    [k[r, j][kvh] for j in range(T)]
                vals = [past_v[r, p, kvh].tolist() for p in range(P)] + \
                    [v[r, j][kvh] for j in range(T)]
                seen = [p for p in range(P + T) if mask[r, t, p]]
                heads += _softmax_mix(q[r, t][h], [keys[p] for p in seen],
                                      [vals[p] for p in seen], HD ** -0.5)
            _close(out[r, t], _lin(a.o_proj, heads))


class _Other:
    """Another implementation object (the reference ops, not ``fused.REFERENCE``): the model
    takes its kernel branch; counts its prologue calls."""

    rms_norm = staticmethod(fused.rms_norm)

    def __init__(self):
        self.prologues = 0

    def attention_prologue(self, *args):
        self.prologues += 1
        return fused.attention_prologue(*args)


@pytest.mark.parametrize("impl", [None, _Other])
@pytest.mark.parametrize("bias, eps", [(False, None), (True, 0.25)])
def test_forward_cached_writes_and_attends_ranges(impl, bias, eps, monkeypatch):
    impl = impl and impl()
    a = _attn(bias, eps, seed=9)
    x, cos, sin = _inputs(10)
    max_len = 8
    g = torch.Generator().manual_seed(11)
    ck = torch.randn(R, max_len, NKV, HD, generator=g, dtype=torch.float64)
    cv = torch.randn(R, max_len, NKV, HD, generator=g, dtype=torch.float64)
    old_k, old_v = ck.clone(), cv.clone()
    pos = torch.tensor([[2, 3, 4], [5, 0, 6]])
    lo = torch.tensor([[0, 1, 2], [0, 3, 5]])
    hi = torch.tensor([[3, 4, 5], [6, 6, 7]])
    n_keys = 7
    if impl is None:          # the reference path projects by itself, no prologue call
        with monkeypatch.context() as m:
            m.setattr(fused.REFERENCE, "attention_prologue", None)
            out = a.forward_cached(x, cos, sin, ck, cv, pos, lo, hi, n_keys)
    else:
        with fused.using(impl):
            out = a.forward_cached(x, cos, sin, ck, cv, pos, lo, hi, n_keys)
        assert impl.prologues == 1                        # the backend's one kernel
    q, k, v = _project(a, x, cos, sin)
    want_k, want_v = old_k.clone(), old_v.clone()
    _write_rows(want_k, want_v, k, v, pos)
    assert torch.allclose(ck, want_k, rtol=1e-12, atol=1e-12)
    assert torch.allclose(cv, want_v, rtol=1e-12, atol=1e-12)
    assert torch.equal(ck[:, 7], old_k[:, 7]) and torch.equal(ck[0, 5:], old_k[0, 5:])
    assert out.shape == (R, T, HID)
    for r in range(R):
        for t in range(T):
            heads = []
            for h in range(NH):
                kvh = h // (NH // NKV)
                seen = range(int(lo[r, t]), int(hi[r, t]))
                heads += _softmax_mix(q[r, t][h], [want_k[r, p, kvh].tolist() for p in seen],
                                      [want_v[r, p, kvh].tolist() for p in seen], HD ** -0.5)
            _close(out[r, t], _lin(a.o_proj, heads))


@pytest.mark.parametrize("impl", [None, _Other])
@pytest.mark.parametrize("eps", [None, 0.25])
def test_write_kv_writes_every_row_and_nothing_else(impl, eps):
    impl = impl and impl()
    a = _attn(True, eps, seed=12)
    x, cos, sin = _inputs(13)
    g = torch.Generator().manual_seed(14)
    ck = torch.randn(R, 6, NKV, HD, generator=g, dtype=torch.float64)
    cv = torch.randn(R, 6, NKV, HD, generator=g, dtype=torch.float64)
    want_k, want_v = ck.clone(), cv.clone()
    pos = torch.tensor([[5, 0, 2], [1, 4, 3]])
    if impl is None:
        a.write_kv(x, cos, sin, ck, cv, pos)
    else:
        with fused.using(impl):
            a.write_kv(x, cos, sin, ck, cv, pos)
    _, k, v = _project(a, x, cos, sin)
    _write_rows(want_k, want_v, k, v, pos)
    assert torch.allclose(ck, want_k, rtol=1e-12, atol=1e-12)
    assert torch.allclose(cv, want_v, rtol=1e-12, atol=1e-12)
