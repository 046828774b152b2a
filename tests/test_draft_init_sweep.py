"""The recipe's draft config and initialisation (``dflash2rt.train.draft_init``) against their
definitions: the default ``DraftShape`` over the bundled target gives exactly the bundled draft's
config.json (which the recipe trained with it), and ``init_draft`` gives every tensor the value
written out anew, name by name: ones for the norms, the identity kernel (first tap 1, the rest
0), zeros for the kernel projections and the successor codebook, and seeded normal draws in
sorted name order scaled by ``selector_std`` (the selector), ``std / sqrt(2 L)`` (o_proj and
down_proj) or ``std`` (every other weight)."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

from dflash2rt.bundled import bundled_path
from dflash2rt.models.config import TargetConfig
from dflash2rt.models.draft import DraftModel
from dflash2rt.models.draft_config import DraftConfig
from dflash2rt.train.draft_init import DraftShape, draft_config, init_draft

from tiny_models import target_dict

BUNDLED = "stdlib-code"
SHAPE = DraftShape(layers=3, intermediate=40, block_size=4, target_layer_ids=(0, 2),
                   conv_kernel_size=3, conv_group_size=8, selector_rank=4, selector_top_k=4,
                   output_multiplier=0.5, final_logit_softcapping=12.0)


def _bundled(part: str) -> dict:
    return json.loads((bundled_path(BUNDLED) / part / "config.json").read_text(encoding="utf-8"))


def test_default_shape_over_the_bundled_target_is_the_bundled_draft():
    target = TargetConfig.from_dict(_bundled("target"))
    shipped = _bundled("draft")
    got = draft_config(target, DraftShape(), shipped["dflash_config"]["mask_token_id"])
    assert got == DraftConfig.from_dict(shipped)
    assert got.causal_layers == (False,) and got.num_target_layers == 8


def test_draft_config_takes_every_field_of_the_shape():
    target = TargetConfig.from_dict(target_dict(layers=3))
    cfg = draft_config(target, SHAPE, 60)
    assert (cfg.variant, cfg.block_size, cfg.mask_token_id, cfg.target_layer_ids) == (
        "dflash2", 4, 60, (0, 2))
    assert (cfg.conv_kernel_size, cfg.conv_group_size, cfg.selector_rank, cfg.selector_top_k,
            cfg.output_multiplier, cfg.final_logit_softcapping) == (3, 8, 4, 4, 0.5, 12.0)
    assert (cfg.arch.num_hidden_layers, cfg.arch.intermediate_size, cfg.num_target_layers) == (
        3, 40, 3)
    assert (cfg.arch.hidden_size, cfg.arch.vocab_size, cfg.arch.num_attention_heads,
            cfg.arch.num_key_value_heads, cfg.arch.head_dim) == (32, 61, 4, 2, 8)
    assert cfg.causal_layers == (False, False, False)        # bidirectional within a block


def test_shape_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        DraftShape().layers = 2


def _expected(draft: DraftModel, seed: int, std: float, selector_std: float) -> dict:
    """Each tensor's initial value by its rule; the draws from one generator in sorted order."""
    gen = torch.Generator().manual_seed(seed)
    layers = len(draft.layers)
    out = {}
    for name, p in sorted(draft.named_parameters()):
        parts = name.split(".")
        if parts[-1] == "weight" and parts[-2].endswith("norm"):
            out[name] = torch.ones(p.shape, dtype=torch.float64)
        elif parts[-1] == "base_kernel":
            k = torch.zeros(p.shape, dtype=torch.float64)
            k[:, 0, :] = 1.0
            out[name] = k
        elif parts[-2] == "kernel_projection" or parts[-1] == "successor_codebook":
            out[name] = torch.zeros(p.shape, dtype=torch.float64)
        else:
            draw = torch.randn(p.shape, generator=gen).double()
            if parts[0] == "candidate_selector":
                scale = selector_std
            elif parts[-2] in ("o_proj", "down_proj"):
                scale = std / math.sqrt(2.0 * layers)
            else:
                scale = std
            out[name] = draw * scale
    return out


@pytest.mark.parametrize("kwargs, std, selector_std", [
    ({}, 0.02, 0.02),                                        # the defaults
    ({"std": 0.5, "selector_std": 0.125}, 0.5, 0.125),
])
def test_init_draft_sets_every_tensor_by_its_rule(kwargs, std, selector_std):
    draft = DraftModel(draft_config(TargetConfig.from_dict(target_dict(layers=3)), SHAPE, 60))
    with torch.no_grad():
        for p in draft.parameters():
            p.fill_(7.0)                                     # nothing left from construction
    init_draft(draft, torch.Generator().manual_seed(11), **kwargs)
    want = _expected(draft, 11, std, selector_std)
    got = dict(draft.named_parameters())
    assert got.keys() == want.keys()
    for kind in ("o_proj", "down_proj", "q_proj", "predecessor_codebook", "base_kernel"):
        assert any(kind in n for n in want)                  # every rule has tensors to check
    for name, w in want.items():
        torch.testing.assert_close(got[name].detach().double(), w, rtol=1e-6, atol=0,
                                   msg=lambda m, name=name: f"{name}: {m}")
