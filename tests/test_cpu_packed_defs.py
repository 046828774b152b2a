"""The CPU pass's packed and fused linears (cpu/packed.py) against float64 products written in the
test, its documented routing (one row dense, autograd / dtype dense, each condition alone), size
floor, memory headroom and messages as hand-written strings, and ops counted per call."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dflash2rt.cpu import packed
from dflash2rt.models.layers import Attention, SwiGLU

from op_log import Ops as _Ops

pytestmark = pytest.mark.skipif(packed.unavailable() is not None,
                                reason=f"no oneDNN packing here: {packed.unavailable()}")

PACKED_OP = "mkldnn._linear_pointwise"


class _Spy:
    """Stands for ``F`` in the module: records each dense ``linear`` call's input shape."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, ...]] = []

    def linear(self, *a):
        self.seen.append(tuple(a[0].shape))
        return F.linear(*a)


def _ref(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """x · wᵀ + b in float64, from the definition (a sum over the input features)."""
    out = (x.detach().double().unsqueeze(-2) * w.detach().double()).sum(-1)
    return out if b is None else out + b.detach().double()


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.shape == want.shape
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def _msg(layers: int, mib: int, groups: int) -> str:
    return (f"linears: oneDNN packed ({layers} layers, {mib} MiB of packed weights beside the "
            f"dense ones; {groups} q/k/v and gate/up groups in one product each)")


@pytest.fixture
def small(monkeypatch):
    monkeypatch.setattr(packed, "MIN_ELEMENTS", 0)


@pytest.fixture
def spy(monkeypatch):
    s = _Spy()
    monkeypatch.setattr(packed, "F", s)
    return s


def _linear(n_in=6, n_out=5, bias=True, seed=0) -> nn.Linear:
    torch.manual_seed(seed)
    return nn.Linear(n_in, n_out, bias=bias)


# --- routing: one row dense, several packed; autograd and dtype dense, each condition alone ----

@pytest.mark.parametrize("shape, dense", [((6,), True), ((1, 6), True), ((1, 1, 1, 6), True),
                                          ((2, 6), False), ((1, 2, 6), False),
                                          ((2, 1, 6), False), ((3, 4, 6), False)])
def test_one_row_is_dense_more_rows_are_packed(small, spy, shape, dense):
    m = _linear()
    packed.pack_linears([m])
    x = torch.randn(*shape)
    with torch.inference_mode(), _Ops() as ops:
        got = m(x)
    _close(got, _ref(x, m.weight, m.bias))
    assert spy.seen == ([shape] if dense else [])
    assert ops.ops.count(PACKED_OP) == (0 if dense else 1)
    assert "mkldnn._reorder_linear_weight" not in ops.ops      # packed by the pass, not here


@pytest.mark.parametrize("case", ["dtype", "x grad", "weight grad", "plain", "no_grad"])
def test_each_dense_condition_alone(small, spy, case):
    """Dense F.linear for an input of another dtype (alone, under inference mode) and, with
    autograd on, for an input or a weight that requires grad (each alone); packed otherwise,
    autograd on included, and under no_grad whatever requires grad."""
    m = _linear(bias=False)
    packed.pack_linears([m])
    m.weight.requires_grad_(case in ("weight grad", "no_grad"))
    x = torch.randn(3, 6).requires_grad_(case in ("x grad", "no_grad"))
    if case == "dtype":
        with torch.inference_mode(), pytest.raises(RuntimeError, match="dtype"):
            m(x.double())
        assert spy.seen == [(3, 6)]
        return
    grad_mode = torch.no_grad() if case == "no_grad" else torch.enable_grad()
    with grad_mode, _Ops() as ops:
        got = m(x)
    _close(got, _ref(x, m.weight, None))
    dense = case in ("x grad", "weight grad")
    assert spy.seen == ([(3, 6)] if dense else [])
    assert ops.ops.count(PACKED_OP) == (0 if dense else 1)
    assert got.requires_grad == dense


def test_an_in_place_update_is_packed_again_once(small):
    m = _linear(bias=True)
    packed.pack_linears([m])
    x = torch.randn(4, 6)
    for scale in (1.0, -2.0, 0.5):
        with torch.no_grad():
            m.weight.mul_(scale)
        with torch.inference_mode():
            _close(m(x), _ref(x, m.weight, m.bias))
            _close(m(x), _ref(x, m.weight, m.bias))      # twice: the slot holds the new packing


# --- what is packed: the size floor, exact types, dtype, device ----------------------------------

def test_the_size_floor_is_inclusive(monkeypatch):
    monkeypatch.setattr(packed, "MIN_ELEMENTS", 30)
    at, below, above = _linear(6, 5), _linear(29, 1), _linear(31, 1)
    assert packed.pack_linears([nn.Sequential(at, below, above)]) == _msg(2, 0, 0)
    assert hasattr(at, packed.PACK_ATTR) and hasattr(above, packed.PACK_ATTR)
    assert not hasattr(below, packed.PACK_ATTR)
    assert below.forward.__func__ is nn.Linear.forward


def test_an_empty_weight_is_never_packed_even_with_no_floor(small):
    empty, one = nn.Linear(0, 4), nn.Linear(1, 1)
    assert packed.pack_linears([nn.Sequential(empty, one)]) == _msg(1, 0, 0)
    assert not hasattr(empty, packed.PACK_ATTR)
    assert packed.pack_linears([empty]) == ("linears: torch F.linear (no float32 CPU linear "
                                            "layer of 0 or more weights to pack)")


def test_only_float32_cpu_nn_linear_is_packed(small):
    class Sub(nn.Linear):
        pass

    keep = _linear()
    others = [Sub(6, 5), _linear().double(), _linear().half(), nn.Linear(6, 5, device="meta")]
    said = packed.pack_linears([nn.Sequential(keep, *others)])
    assert said == _msg(1, 0, 0) + "; 1 half-precision linears take 2-D inputs"
    assert hasattr(keep, packed.PACK_ATTR)
    assert not any(hasattr(m, packed.PACK_ATTR) for m in others)


def test_mib_counts_every_packed_layer():
    """Two 1024 x 1024 float32 layers at the default floor (exactly its size): 8 MiB."""
    mods = [nn.Linear(1024, 1024, bias=False), nn.Linear(1024, 1024, bias=False)]
    assert packed.MIN_ELEMENTS == 1024 * 1024
    assert packed.pack_linears([nn.Sequential(*mods)]) == _msg(2, 8, 0)
    assert packed.pack_linears([nn.Sequential(*mods)]) == _msg(2, 8, 0)       # again: same


# --- the memory headroom: half of the free memory, for the copies not yet made ------------------

def test_headroom_is_half_the_free_memory_at_its_edge(small, monkeypatch):
    mods = [_linear(6, 5), _linear(4, 3)]                  # (30 + 12) float32 = 168 bytes
    monkeypatch.setattr(packed, "GB", 100.0)
    monkeypatch.setattr(packed, "available_bytes", lambda device: 335)
    assert packed.pack_linears(mods) == ("linears: torch F.linear (packing them would take "
                                         "1.68 GB more; 3.35 GB are available)")
    assert not any(hasattr(m, packed.PACK_ATTR) for m in mods)
    monkeypatch.setattr(packed, "available_bytes", lambda device: 336)    # 168 == 0.5 x 336
    assert packed.pack_linears(mods) == _msg(2, 0, 0)
    monkeypatch.setattr(packed, "available_bytes", lambda device: 0)
    assert packed.pack_linears(mods) == _msg(2, 0, 0)      # nothing more to pack: 0 bytes
    more = _linear(2, 2)                                   # 16 bytes more
    monkeypatch.setattr(packed, "available_bytes", lambda device: 31)
    assert packed.pack_linears(mods + [more]) == ("linears: torch F.linear (packing them would "
                                                  "take 0.16 GB more; 0.31 GB are available)")
    monkeypatch.setattr(packed, "available_bytes", lambda device: 32)
    assert packed.pack_linears(mods + [more]) == _msg(3, 0, 0)


def test_unknown_free_memory_packs(small, monkeypatch):
    monkeypatch.setattr(packed, "available_bytes", lambda device: None)
    assert packed.pack_linears([_linear()]) == _msg(1, 0, 0)


def test_only_the_value_0_turns_packing_off(small, monkeypatch):
    for value in ("1", "", "false", "00"):
        monkeypatch.setenv(packed.ENV, value)
        assert packed.unavailable() is None, value
    monkeypatch.setenv(packed.ENV, "0")
    assert packed.unavailable() == "DFLASH2RT_CPU_PACK=0"


def test_the_half_precision_note_only_when_some_are_flattened(small):
    assert packed.pack_linears([_linear()]) == _msg(1, 0, 0)
    halves = [_linear().to(torch.bfloat16), _linear().half()]
    assert packed.pack_linears([_linear(), *halves]) == \
        _msg(1, 0, 0) + "; 2 half-precision linears take 2-D inputs"
    x = torch.randn(2, 3, 6)
    for h in halves:
        got = h(x.to(h.weight.dtype))
        torch.testing.assert_close(got.double(), _ref(x.to(h.weight.dtype), h.weight, h.bias),
                                   rtol=2e-2, atol=2e-2)


# --- fused q/k/v and gate/up: when they fuse, the product each call runs, the split ------------

def _attn(bias=False, kind=Attention, heads=4, kv=2, dim=3, hidden=10) -> Attention:
    torch.manual_seed(1)
    a = kind(hidden, heads, kv, dim, bias, None).eval()
    for p in a.parameters():
        p.requires_grad_(False)
    return a


def _mlp(bias=False, kind=SwiGLU) -> SwiGLU:
    torch.manual_seed(2)
    m = kind(10, 7, bias).eval()
    for p in m.parameters():
        p.requires_grad_(False)
    return m


def _rope(t: int):
    return torch.ones(1, t, 3), torch.zeros(1, t, 3)        # rotation by 0


def _qkv_ref(a: Attention, x: torch.Tensor) -> list[torch.Tensor]:
    outs = [_ref(x, p.weight, p.bias) for p in (a.q_proj, a.k_proj, a.v_proj)]
    heads = (a.n_heads, a.n_kv_heads, a.n_kv_heads)
    return [o.unflatten(-1, (h, a.head_dim)) for o, h in zip(outs, heads)]


def test_fused_products_split_into_each_part(small):
    a, m = _attn(), _mlp()
    assert packed.pack_linears([a, m]) == _msg(7, 0, 2)
    assert packed.pack_linears([a, m]) == _msg(7, 0, 2)     # already fused: counted again
    for p in (a.q_proj, a.k_proj, a.v_proj, m.gate_proj, m.up_proj):
        assert getattr(p, packed.PACK_ATTR) == [None, None]     # packed alone only if called so
    for rows in (1, 4):
        x = torch.randn(1, rows, 10)
        cos, sin = _rope(rows)
        with torch.inference_mode(), _Ops() as ops:
            qkv = a.project_qkv(x, cos, sin)
            gate, up = m.gate_up(x)
        for g, w in zip(qkv, _qkv_ref(a, x)):
            _close(g, w)
        _close(gate, _ref(x, m.gate_proj.weight, None))
        _close(up, _ref(x, m.up_proj.weight, None))
        assert ops.ops.count(PACKED_OP) == (0 if rows == 1 else 2)
        with torch.inference_mode():
            _close(a.k_proj(x), _ref(x, a.k_proj.weight, None))      # a part alone
            _close(m(x), _ref(F.silu(gate) * up, m.down_proj.weight, None))


@pytest.mark.parametrize("case", ["bias", "small part", "subclass"])
def test_each_fusing_condition_alone(monkeypatch, case):
    """Not fused: a part with a bias, a part below the size floor (the others above it), a
    subclass of Attention / SwiGLU; the layers are still packed one by one."""
    monkeypatch.setattr(packed, "MIN_ELEMENTS", 0)
    bias = case == "bias"
    if case == "subclass":
        a = _attn(kind=type("A", (Attention,), {}))
        m = _mlp(kind=type("M", (SwiGLU,), {}))
    else:
        a, m = _attn(bias=bias), _mlp(bias=bias)
    if case == "small part":
        monkeypatch.setattr(packed, "MIN_ELEMENTS", 12 * 10)     # q (12 x 10) packs, k / v not
    said = packed.pack_linears([a, m])
    if case == "small part":
        assert said == _msg(2, 0, 0)             # q_proj and o_proj (the MLP's are 7 x 10)
    else:
        assert said == _msg(7, 0, 0)
    assert not hasattr(a, packed.FUSE_ATTR) and not hasattr(m, packed.FUSE_ATTR)
    x = torch.randn(1, 3, 10)
    cos, sin = _rope(3)
    with torch.inference_mode():
        for g, w in zip(a.project_qkv(x, cos, sin), _qkv_ref(a, x)):
            _close(g, w)


@pytest.mark.parametrize("case", ["plain", "no_grad", "x grad", "weight grad", "replaced",
                                  "in place"])
def test_each_fallback_condition_alone(small, case):
    """One product over the stack unless autograd needs it (input or one part's weight requiring
    grad, each alone, autograd on) or a part's weight was replaced; an in-place update reaches
    the stack; under no_grad a weight requiring grad does not matter."""
    a = _attn()
    packed.pack_linears([a])
    x = torch.randn(1, 4, 10)
    cos, sin = _rope(4)
    if case in ("weight grad", "no_grad"):
        a.v_proj.weight.requires_grad_(True)
    if case in ("x grad", "no_grad"):
        x.requires_grad_(True)
    if case == "replaced":
        a.k_proj.weight = nn.Parameter(torch.randn(6, 10), requires_grad=False)
    if case == "in place":
        with torch.no_grad():
            a.q_proj.weight.mul_(-2.0)
    grad_mode = torch.no_grad() if case == "no_grad" else torch.enable_grad()
    with grad_mode, _Ops() as ops:
        got = a.project_qkv(x, cos, sin)
    for g, w in zip(got, _qkv_ref(a, x)):
        _close(g, w)
    fused = case in ("plain", "no_grad", "in place")
    # separate layers: each packed alone, but a part needing autograd (or all) runs F.linear
    separate = {"replaced": 3, "weight grad": 2, "x grad": 0}.get(case)
    assert ops.ops.count(PACKED_OP) == (1 if fused else separate)


def test_in_place_updates_between_one_row_and_many_row_calls(small):
    """A one-row call runs on the dense stack (which shares the parts' storage) and needs no
    new packing; the next many-row call after an update packs again, once."""
    a = _attn()
    packed.pack_linears([a])
    one, many = torch.randn(1, 1, 10), torch.randn(1, 4, 10)
    for scale, proj in ((-2.0, "q_proj"), (0.5, "v_proj"), (3.0, "k_proj")):
        with torch.no_grad():
            getattr(a, proj).weight.mul_(scale)
        with torch.inference_mode():
            for x in (one, many, many):
                for g, w in zip(a.project_qkv(x, *_rope(x.shape[1])), _qkv_ref(a, x)):
                    _close(g, w)
