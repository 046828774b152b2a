"""The CPU pass's fused projections (cpu/packed.py ``_fuse``): an attention layer's q/k/v and an
MLP's gate/up run as one product over their stacked weight, whose views the layers' weights
become. Checked: the outputs match the separate layers', the weights are views (no copy kept),
state_dict is unchanged, an in-place update reaches the fused product, and autograd, a
replaced weight or another dtype fall back to the separate layers."""

from __future__ import annotations

import pytest
import torch

from dflash2rt.cpu import packed
from dflash2rt.models.layers import Attention, SwiGLU

pytestmark = pytest.mark.skipif(packed.unavailable() is not None,
                                reason=f"no oneDNN packing here: {packed.unavailable()}")


def _modules():
    torch.manual_seed(0)
    attn = Attention(1024, 8, 8, 128, False, 1e-6).eval()     # q, k, v 1024x1024
    mlp = SwiGLU(1024, 1024).eval()
    for m in (attn, mlp):
        for p in m.parameters():
            p.requires_grad_(False)
    return attn, mlp


def _rope(t: int):
    return torch.ones(1, t, 128), torch.zeros(1, t, 128)     # cos 1, sin 0: rotation by 0


@pytest.mark.parametrize("rows", [1, 5])
def test_fused_outputs_match_the_separate_layers(rows):
    attn, mlp = _modules()
    x = torch.randn(1, rows, 1024)
    cos, sin = _rope(rows)
    want_qkv, want_mlp = attn.project_qkv(x, cos, sin), mlp(x)
    state = {k: v.clone() for k, v in {**attn.state_dict(), **mlp.state_dict()}.items()}
    msg = packed.pack_linears([attn, mlp])
    assert "2 q/k/v and gate/up groups" in msg, msg
    stacked = getattr(attn, packed.FUSE_ATTR)[0]
    for p in (attn.q_proj, attn.k_proj, attn.v_proj):          # views of one storage
        assert p.weight.untyped_storage().data_ptr() == stacked.untyped_storage().data_ptr()
    after = {**attn.state_dict(), **mlp.state_dict()}
    assert after.keys() == state.keys() and all(torch.equal(after[k], state[k]) for k in state)
    with torch.inference_mode():
        got_qkv, got_mlp = attn.project_qkv(x, cos, sin), mlp(x)
    for g, w in zip(got_qkv, want_qkv):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_mlp, want_mlp, rtol=1e-5, atol=1e-5)


def test_in_place_update_replaced_weight_and_autograd():
    attn, mlp = _modules()
    packed.pack_linears([attn, mlp])
    x = torch.randn(1, 3, 1024)
    cos, sin = _rope(3)
    with torch.no_grad():
        attn.k_proj.weight.mul_(2.0)                           # in place: the stack sees it
    k = attn.project_qkv(x, cos, sin)[1]
    torch.testing.assert_close(k, attn.keys_values(attn.k_proj(x), attn.v_proj(x), cos, sin)[0],
                               rtol=1e-5, atol=1e-5)
    attn.v_proj.weight = torch.nn.Parameter(torch.zeros(1024, 1024), requires_grad=False)
    assert attn.project_qkv(x, cos, sin)[2].abs().max() == 0   # replaced: separate layers
    mlp.up_proj.weight.requires_grad_(True)
    y = mlp(x.requires_grad_(True))
    y.sum().backward()                                         # autograd: separate layers
    assert mlp.up_proj.weight.grad is not None and mlp.up_proj.weight.grad.abs().sum() > 0
