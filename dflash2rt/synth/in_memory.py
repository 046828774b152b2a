"""A synthetic pair built in memory: the configs, tensor names and shapes ``dflash2rt synth``
writes (the published DFlash2 draft layout), filled with seeded weights drawn directly on the
device in the run's dtype, with no checkpoint written or read. What a measurement of step
costs at a real shape needs: building an 8B pair this way takes seconds on an accelerator,
where writing and reading 16 GB of safetensors would take minutes.

The draws are ``write.tensor_for``'s (ones for norms, N(0, 0.02²) otherwise, seeded per tensor
name; the draft with ``seed + 1``), made by the device's own generator: deterministic for a
seed on a device type; on the CPU in float32 they are the values
``synthesize(..., dtype=torch.float32)`` writes. No tokenizer (the cost model draws random token
ids)."""

from __future__ import annotations

import math
from typing import Any

import torch

from ..models.config import TargetConfig
from ..models.draft import DraftModel
from ..models.draft_config import DraftConfig
from ..models.draft_loader import expected_tensors as draft_tensors
from ..models.hf_loader import check_weights_fit, target_tensors
from ..models.pair import ModelPair
from ..models.target import TargetModel
from .shapes import draft_config, get_shape
from .write import tensor_for


def build_pair(name: str, device: torch.device | str, dtype: torch.dtype, seed: int = 0,
               layers: int | None = None, draft_layers: int | None = None
               ) -> tuple[ModelPair, dict[str, Any]]:
    """The target of shape ``name`` (``layers``: fewer target layers, as ``synth --layers``)
    and its DFlash2 draft (``draft_layers``), on ``device`` in ``dtype``, after checking that
    their weights fit there (``ResourceError`` before anything is allocated) → (the pair,
    {"target_config": the target's config.json dict, and a summary of what was built})."""
    device = torch.device(device)
    shape = get_shape(name, layers)
    tcfg_dict = shape.target
    tcfg = TargetConfig.from_dict(tcfg_dict)
    dcfg = DraftConfig.from_dict(draft_config(shape, draft_layers))
    dcfg.check_target(tcfg)
    tshapes = target_tensors(tcfg, dcfg.target_layer_ids)
    dshapes = draft_tensors(dcfg)
    check_weights_fit({**{f"target.{n}": s for n, s in tshapes.items()},
                       **{f"draft.{n}": s for n, s in dshapes.items()}}, dtype, device,
                      f"the in-memory {name} pair")
    with torch.device("meta"):                      # no memory until the weights are assigned
        target = TargetModel(tcfg, dcfg.target_layer_ids)
        draft = DraftModel(dcfg)
    state = {n: tensor_for(n, s, seed, dtype, device) for n, s in tshapes.items()}
    if tcfg.tie_word_embeddings:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]      # shared, not copied
    _assign(target, state, device)
    if tcfg.tie_word_embeddings:
        target.tie_weights()
    _assign(draft, {n: tensor_for(n, s, seed + 1, dtype, device) for n, s in dshapes.items()},
            device)
    pair = ModelPair(target, draft, None, f"{name} (in memory, seed {seed})")
    return pair, {"target_config": tcfg_dict, "shape": name, "seed": seed,
                  "target_layers": tcfg.num_hidden_layers,
                  "draft_layers": dcfg.arch.num_hidden_layers,
                  "target_params": sum(math.prod(s) for s in tshapes.values()),
                  "draft_params": sum(math.prod(s) for s in dshapes.values())}


def _assign(model: torch.nn.Module, state: dict[str, torch.Tensor], device: torch.device
            ) -> None:
    """Give a meta-built model ``state``'s tensors (not copied); its buffers (the rope
    frequencies, built on the CPU) move to ``device``; grads off, eval mode."""
    model.load_state_dict(state, strict=True, assign=True)
    model.to(device)
    model.requires_grad_(False)
    model.eval()
