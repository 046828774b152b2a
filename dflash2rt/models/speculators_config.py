"""Reading a draft config in vLLM's speculators format (``speculators_model_type`` ``dflash`` or
``dflash2``): the draft's layers in a nested ``transformer_layer_config``, flat DFlash keys,
``speculators_config`` (proposal methods, verifier), ``aux_hidden_state_layer_ids`` counted as
hidden-state indices (index 0 is the embedding output, so tap ``i`` of the native formats is
``i + 1`` there: speculators' DFlash converter writes ``target_layer_ids + 1`` and vLLM's
``update_dflash`` reads ``aux - 1``), the draft's own LM head, and for a reduced draft vocabulary
``d2t`` / ``t2d`` (``target_id = draft_id + d2t[draft_id]``, t2d a bool mask over the target's
ids). ``speculators_fields`` gives the ``DraftConfig`` fields; ``DraftConfig.from_dict`` builds
and validates it.
"""

from __future__ import annotations

from typing import Any

from dflash2rt.errors import CheckpointError
from dflash2rt.models.config import _GENERATION_DEFAULTS, _METADATA, TargetConfig
from dflash2rt.models.draft_fields import (ARCH_V1, ARCH_V2, SLIDING_KEYS, float_or, int_field,
                                           int_or, layer_types, layer_windows)

SPECULATORS_TYPES = {"dflash": ARCH_V1, "dflash2": ARCH_V2}
_SPEC_USED = frozenset({
    "speculators_model_type", "speculators_config", "speculators_version", "architectures",
    "transformer_layer_config", "draft_vocab_size", "block_size", "target_hidden_size",
    "aux_hidden_state_layer_ids", "mask_token_id", "sliding_window_non_causal", "projector_type",
    "shift_label", "sample_from_anchor", "conv_kernel_size", "conv_group_size", "selector_rank",
    "selector_top_k", "input_embedding_scale", "output_multiplier", "final_logit_softcapping",
    "num_target_layers", "bos_token_id", "eos_token_id", "pad_token_id", "tie_word_embeddings",
})
# Training-only hyper-parameters speculators writes into the config (no effect on inference with
# projector_type "dflash"), besides the PretrainedConfig fields config.py lists as metadata.
_SPEC_TRAINING = frozenset({
    "pure_draft_prefix_len", "emb_dim", "gru_hidden_dim", "lambda_base_start",
    "lambda_base_decay_ratio", "auf", "loss_config", "selector_loss_alpha",
    "position_weighting", "loss_decay_gamma",
})


def speculators_fields(d: dict[str, Any]) -> dict[str, Any]:
    """The ``DraftConfig`` fields of speculators config ``d`` (not yet validated)."""
    kind = _check_kind_and_keys(d)
    tl = d.get("transformer_layer_config")
    if not isinstance(tl, dict):
        raise CheckpointError("speculators config lacks the 'transformer_layer_config' object")
    aux = _aux_layers(d)
    block = _block_size(d)
    arch = _decoder(d, tl)
    layers = arch.num_hidden_layers
    types = layer_types(tl, layers)
    non_causal = d.get("sliding_window_non_causal", kind == "dflash2")
    dvocab = d.get("draft_vocab_size") or arch.vocab_size
    given = {k: v for k, v in d.items() if v is not None}    # speculators writes null defaults
    return dict(
        arch=arch, variant="dflash2" if kind == "dflash2" else "dflash1",
        block_size=int_field({"block_size": block}, "block_size", ""),
        mask_token_id=int_field(d, "mask_token_id", ""),
        target_layer_ids=tuple(a - 1 for a in aux),
        num_target_layers=d.get("num_target_layers"),
        sliding_windows=layer_windows(tl, layers),
        causal_layers=tuple(t == "sliding_attention" and not non_causal for t in types),
        conv_kernel_size=int_or(given, "conv_kernel_size", 0, ""),
        conv_group_size=int_or(given, "conv_group_size", 0, ""),
        selector_rank=int_or(given, "selector_rank", 0, ""),
        selector_top_k=int_or(given, "selector_top_k", 1, ""),
        output_multiplier=float_or(given, "output_multiplier", 1.0, ""),
        final_logit_softcapping=float_or(given, "final_logit_softcapping", None, ""),
        input_embedding_scale=float_or(given, "input_embedding_scale", 1.0, ""),
        source_format="speculators",
        draft_vocab_size=int_field({"draft_vocab_size": dvocab}, "draft_vocab_size", ""),
        own_head=True,
    )


def _check_kind_and_keys(d: dict[str, Any]) -> str:
    """The draft's kind (``dflash`` or ``dflash2``), after refusing other algorithms, unknown
    keys, and training layouts that inference does not implement."""
    kind = d.get("speculators_model_type")
    if not isinstance(kind, str) or kind not in SPECULATORS_TYPES:
        raise CheckpointError(
            f"speculators_model_type {kind!r}: dflash2rt runs the speculators DFlash drafts "
            f"({', '.join(SPECULATORS_TYPES)}), not other algorithms (EAGLE-3, MTP, ...)")
    for key in d:
        if key not in _SPEC_USED | _SPEC_TRAINING | _METADATA | _GENERATION_DEFAULTS:
            raise CheckpointError(f"speculators config key {key!r} is not understood by "
                                  "dflash2rt; remove it if it does not change the model")
    if d.get("projector_type", "dflash") != "dflash":
        raise CheckpointError(f"projector_type={d['projector_type']!r}: only the plain DFlash "
                              "projector runs (Domino's correction head is not implemented)")
    for key in ("shift_label", "sample_from_anchor"):
        if d.get(key):
            raise CheckpointError(f"{key}=true: the draft was trained for another block layout "
                                  "(the anchor slot predicting the first draft token)")
    return kind


def _aux_layers(d: dict[str, Any]) -> list[int]:
    """``aux_hidden_state_layer_ids``: hidden-state indices, each a target layer id + 1."""
    aux = d.get("aux_hidden_state_layer_ids")
    if not isinstance(aux, list) or not aux:
        raise CheckpointError("speculators config lacks aux_hidden_state_layer_ids")
    aux = [int_field({"aux_hidden_state_layer_ids": a}, "aux_hidden_state_layer_ids", "")
           for a in aux]
    if min(aux) < 1:
        raise CheckpointError(
            f"aux_hidden_state_layer_ids {aux}: id 0 is the embedding output, which a DFlash "
            "draft does not tap (speculators ids are target layer ids + 1)")
    return aux


def _block_size(d: dict[str, Any]) -> Any:
    """``block_size``, else the first proposal method's ``speculative_tokens`` + 1 (checked as an
    integer by the caller); a config with neither, or without ``mask_token_id``, is refused."""
    block = d.get("block_size")
    if block is None:
        methods = (d.get("speculators_config") or {}).get("proposal_methods") or []
        steps = [m.get("speculative_tokens") for m in methods if isinstance(m, dict)]
        block = steps[0] + 1 if steps and isinstance(steps[0], int) else None
    if block is None or d.get("mask_token_id") is None:
        raise CheckpointError("speculators config lacks block_size (or a proposal method's "
                              "speculative_tokens) or mask_token_id")
    return block


def _decoder(d: dict[str, Any], tl: dict[str, Any]) -> TargetConfig:
    """The Qwen3 decoder config of the draft's layers (``transformer_layer_config``)."""
    arch_dict = {k: v for k, v in tl.items() if k not in SLIDING_KEYS and k != "is_causal"}
    arch_dict["model_type"] = "qwen3"              # the DFlash decoder layers are Qwen3's
    arch_dict["architectures"] = ["Qwen3ForCausalLM"]
    arch = TargetConfig.from_dict(arch_dict)
    th = d.get("target_hidden_size")
    if th not in (None, arch.hidden_size):
        raise CheckpointError(f"target_hidden_size={th} differs from the draft's hidden_size="
                              f"{arch.hidden_size}: not supported")
    return arch
