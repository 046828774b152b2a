"""The CPU pass's packed linears (cpu/packed.py) where a sweep found classes the other tests let
through: a fused q/k/v or gate/up stack is packed again only on the first many-row call after an
in-place update of a part (never on a one-row call, whatever its leading shape, and never twice
for one update), counted as ops per call; and a half-precision linear with no input features
takes inputs of any rank, as the plain layer does (its output is the bias)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dflash2rt.cpu import packed
from dflash2rt.models.layers import SwiGLU

from op_log import Ops as _Ops

PACKED_OP = "mkldnn._linear_pointwise"
REORDER_OP = "mkldnn._reorder_linear_weight"

needs_onednn = pytest.mark.skipif(packed.unavailable() is not None,
                                  reason=f"no oneDNN packing here: {packed.unavailable()}")


def _ref(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x · wᵀ in float64 by loops over the output and input features (no bias)."""
    xd, wd = x.detach().double(), w.detach().double()
    out = torch.zeros(*x.shape[:-1], w.shape[0], dtype=torch.float64)
    for o in range(w.shape[0]):
        for i in range(w.shape[1]):
            out[..., o] += xd[..., i] * wd[o, i]
    return out


def _mlp() -> SwiGLU:
    torch.manual_seed(3)
    m = SwiGLU(6, 5, False).eval()
    for p in m.parameters():
        p.requires_grad_(False)
    return m


def _gate_up(m: SwiGLU, x: torch.Tensor) -> tuple[int, int]:
    """One fused gate/up call checked against the float64 products → (reorders, packed ops)."""
    with torch.inference_mode(), _Ops() as ops:
        gate, up = m.gate_up(x)
    for got, w in ((gate, m.gate_proj.weight), (up, m.up_proj.weight)):
        want = _ref(x, w)
        assert got.shape == want.shape
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    return ops.ops.count(REORDER_OP), ops.ops.count(PACKED_OP)


@needs_onednn
def test_the_stack_is_packed_again_once_per_update_and_only_for_many_rows(monkeypatch):
    monkeypatch.setattr(packed, "MIN_ELEMENTS", 0)
    m = _mlp()
    assert packed.pack_linears([m]) == (
        "linears: oneDNN packed (3 layers, 0 MiB of packed weights beside the dense ones; "
        "1 q/k/v and gate/up groups in one product each)")
    torch.manual_seed(4)
    many = [torch.randn(3, 6), torch.randn(1, 4, 6), torch.randn(2, 1, 6)]
    one = [torch.randn(6), torch.randn(1, 6), torch.randn(1, 1, 6), torch.randn(1, 1, 1, 6)]
    for x in many:                                  # packed by the pass: no reorder on a call
        assert _gate_up(m, x) == (0, 1)
    for proj, scale in (("gate_proj", -2.0), ("up_proj", 0.5)):
        with torch.no_grad():
            getattr(m, proj).weight.mul_(scale)     # in place: same storage, new version
        for x in one:                               # one row: the dense stack, nothing packed
            assert _gate_up(m, x) == (0, 0), (proj, tuple(x.shape))
        assert _gate_up(m, many[0]) == (1, 1)       # the first many-row call packs again
        for x in many:
            assert _gate_up(m, x) == (0, 1)         # and the next ones use that packing


@pytest.mark.filterwarnings("ignore:Initializing zero-element tensors")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(0,), (3, 0), (2, 3, 0), (2, 1, 3, 0), (0, 3, 0)])
def test_a_half_linear_with_no_input_features_takes_any_rank(dtype, shape):
    torch.manual_seed(5)
    layer = nn.Linear(0, 4).to(dtype)
    with torch.no_grad():
        layer.bias.copy_(torch.tensor([1.0, -2.0, 0.5, 3.0]))
    assert packed.flatten_half_linears([layer]) == 1
    got = layer(torch.zeros(shape, dtype=dtype))
    want = torch.tensor([1.0, -2.0, 0.5, 3.0], dtype=dtype).expand(*shape[:-1], 4)
    assert got.dtype == dtype and got.shape == want.shape
    assert torch.equal(got, want)
