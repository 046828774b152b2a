"""The CPU model pass gives half-precision linears 2-D inputs (cpu/packed.py
``flatten_half_linears``): torch's CPU matmul serves a strided 3-D bf16 / fp16 input by
expanding the weight over the batch and copying it (a batched product) on every call."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dflash2rt import get_backend
from dflash2rt.cpu import packed
from dflash2rt.engine.engine import Engine
from dflash2rt.engine.request import Request, SamplingParams

from op_log import Ops as _Ops
from tiny_models import tiny_pair


def _strided_inputs(dtype, features):
    base = torch.randn(3, 8, features, generator=torch.Generator().manual_seed(1)).to(dtype)
    return {"block rows": base[:1, 1:], "last rows": base[:, -1:], "every row": base,
            "2-D": base[0], "4-D": base.view(3, 2, 4, features)[:, :, 1:]}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_linears_take_2d_inputs_and_give_the_same_values(dtype):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(40, 96), nn.Linear(96, 40, bias=False)).to(dtype)
    other = nn.Linear(40, 8).to(torch.float32)
    assert packed.flatten_half_linears([model, other]) == 2
    assert packed.flatten_half_linears([model]) == 2            # idempotent
    assert not hasattr(other, packed.FLAT_ATTR)
    for layer in model:
        n_in, n_out = layer.weight.shape[1], layer.weight.shape[0]
        for name, x in _strided_inputs(dtype, n_in).items():
            with _Ops() as seen:
                got = layer(x)
            want = F.linear(x.reshape(-1, n_in), layer.weight, layer.bias)
            assert got.shape == (*x.shape[:-1], n_out), name
            assert torch.equal(got.reshape(-1, n_out), want), name
            assert "aten.bmm" not in seen.ops, (name, seen.ops)


def test_a_bfloat16_run_reports_its_flattened_linears():
    """The CPU backend's model pass flattens a bf16 pair's linears and says so in the stats;
    greedy spec == target-only on that pair."""
    pair = tiny_pair("dflash2", block=4, dtype=torch.bfloat16)
    reqs = [Request((5, 3, 9, 2), SamplingParams(max_new_tokens=6))]
    with Engine(pair, get_backend("cpu")) as eng:
        spec, stats = eng.generate(reqs, block_size=4)
        plain, _ = eng.generate(reqs, spec=False)
    assert "half-precision linears take 2-D inputs" in stats.model_pass
    assert spec[0].token_ids == plain[0].token_ids
