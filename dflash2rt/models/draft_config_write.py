"""The config.json dict of a ``DraftConfig`` in any published layout, the inverse of
``DraftConfig.from_dict``: native ``dflash2`` / ``dflash`` (v1, ``block_size`` inside
``dflash_config`` or at the top level as the older drafts have it) and vLLM's ``speculators``
format (taps written as hidden-state indices, ``target_layer_ids + 1``). A draft that a layout
cannot express (a reduced vocabulary outside speculators, causal layers other than the sliding
ones) is refused rather than written differently.
"""

from __future__ import annotations

from typing import Any

from dflash2rt.errors import CheckpointError
from dflash2rt.models.draft_config import DraftConfig
from dflash2rt.models.draft_fields import ARCH_V1, ARCH_V2


def draft_config_dict(cfg: DraftConfig, fmt: str | None = None,
                      block_at_top: bool = False) -> dict[str, Any]:
    """The config.json dict that ``DraftConfig.from_dict`` reads back, in layout ``fmt``
    (``dflash2``, ``dflash``, ``speculators``; default: the one it was read from).
    ``block_at_top``: a v1 draft's ``block_size`` at the top level (the older Qwen3 / Llama
    drafts) instead of inside ``dflash_config``."""
    fmt = fmt or cfg.format
    if fmt == "speculators":
        return _speculators_dict(cfg)
    if (fmt == "dflash2") != (cfg.variant == "dflash2"):
        raise CheckpointError(f"a {cfg.variant} draft cannot be written as {fmt}")
    if cfg.reduced_vocab:
        raise CheckpointError("a reduced draft vocabulary (d2t/t2d) exists in the speculators "
                              "format only")
    out = _arch_dict(cfg)
    out["architectures"] = [ARCH_V2 if cfg.variant == "dflash2" else ARCH_V1]
    n = cfg.arch.num_hidden_layers
    causal = tuple(cfg.causal(i) for i in range(n))
    if len(set(causal)) == 1:
        out["is_causal"] = causal[0]
    elif causal != tuple(w is not None for w in cfg.sliding_windows):
        raise CheckpointError("mixed causal layers are written as the sliding-attention layers "
                              "(no is_causal); this draft's are others")
    if cfg.num_target_layers is not None:
        out["num_target_layers"] = cfg.num_target_layers
    dc: dict[str, Any] = {"block_size": cfg.block_size, "mask_token_id": cfg.mask_token_id,
                          "target_layer_ids": list(cfg.target_layer_ids)}
    if cfg.input_embedding_scale != 1.0 or cfg.variant == "dflash2":
        dc["input_embedding_scale"] = cfg.input_embedding_scale
    if cfg.variant == "dflash2":
        dc.update(conv_kernel_size=cfg.conv_kernel_size, conv_group_size=cfg.conv_group_size,
                  selector_rank=cfg.selector_rank, selector_top_k=cfg.selector_top_k)
    if cfg.variant == "dflash2" or cfg.output_multiplier != 1.0:
        dc["output_multiplier"] = cfg.output_multiplier
    if cfg.variant == "dflash2" or cfg.final_logit_softcapping is not None:
        dc["final_logit_softcapping"] = cfg.final_logit_softcapping
    if block_at_top and cfg.variant == "dflash1":
        out["block_size"] = dc.pop("block_size")
    out["dflash_config"] = dc
    return out


def _speculators_dict(cfg: DraftConfig) -> dict[str, Any]:
    tl = _arch_dict(cfg)
    kind = "dflash2" if cfg.variant == "dflash2" else "dflash"
    sliding = [i for i, w in enumerate(cfg.sliding_windows) if w is not None]
    non_causal = not any(cfg.causal(i) for i in sliding) if sliding else kind == "dflash2"
    if any(cfg.causal(i) != (i in sliding and not non_causal)
           for i in range(cfg.arch.num_hidden_layers)):
        raise CheckpointError("the speculators format makes sliding layers all causal or all "
                              "non-causal and full layers non-causal; this draft is neither")
    out: dict[str, Any] = {
        "architectures": [ARCH_V2 if kind == "dflash2" else ARCH_V1],
        "speculators_model_type": kind, "speculators_version": "0.4.0",
        "transformer_layer_config": tl, "draft_vocab_size": cfg.head_rows,
        "block_size": cfg.block_size,
        "aux_hidden_state_layer_ids": [i + 1 for i in cfg.target_layer_ids],
        "mask_token_id": cfg.mask_token_id, "target_hidden_size": None,
        "sliding_window_non_causal": non_causal, "projector_type": "dflash",
        "speculators_config": {
            "algorithm": kind,
            "proposal_methods": [{"proposal_type": "greedy",
                                  "speculative_tokens": cfg.block_size - 1}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": None, "architectures": []}},
    }
    if kind == "dflash2":
        out.update(conv_kernel_size=cfg.conv_kernel_size, conv_group_size=cfg.conv_group_size,
                   selector_rank=cfg.selector_rank, selector_top_k=cfg.selector_top_k)
    # the flat keys the reader takes for either kind: a v1 draft's only where not the default
    for key, default in (("input_embedding_scale", 1.0), ("output_multiplier", 1.0),
                         ("final_logit_softcapping", None)):
        if kind == "dflash2" or getattr(cfg, key) != default:
            out[key] = getattr(cfg, key)
    if cfg.num_target_layers is not None:
        out["num_target_layers"] = cfg.num_target_layers
    return out


def _arch_dict(cfg: DraftConfig) -> dict[str, Any]:
    """The Qwen3 decoder config of the draft's layers, with its attention layout."""
    out = cfg.arch.to_dict()
    windows = set(cfg.sliding_windows) - {None}
    if len(windows) > 1:
        raise CheckpointError(f"one sliding_window per draft, got {sorted(windows)}")
    out["use_sliding_window"] = bool(windows)
    out["max_window_layers"] = cfg.arch.num_hidden_layers
    out["layer_types"] = ["full_attention" if w is None else "sliding_attention"
                          for w in cfg.sliding_windows]
    out["sliding_window"] = windows.pop() if windows else None
    return out
