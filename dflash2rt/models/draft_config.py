"""DraftConfig: a draft's config.json, validated, unknown keys refused, in any published layout.

Layouts read (docs/models.md, "Draft formats"):

- ``dflash2``: ``DFlash2DraftModel``, a Qwen3 config plus ``dflash_config``;
- ``dflash`` (v1): ``DFlashDraftModel``; ``block_size`` inside ``dflash_config`` or, in the older
  drafts (Qwen3 / Llama b16), at the top level;
- ``speculators``: vLLM's speculators format (``speculators_model_type`` ``dflash`` or
  ``dflash2``): the draft's layers in a nested ``transformer_layer_config``, flat DFlash keys,
  ``speculators_config`` (proposal methods, verifier), ``aux_hidden_state_layer_ids`` counted
  as hidden-state indices (index 0 is the embedding output, so tap ``i`` of the native formats is
  ``i + 1`` there: speculators' DFlash converter writes ``target_layer_ids + 1`` and vLLM's
  ``update_dflash`` reads ``aux - 1``), the draft's own LM head, and for a reduced draft
  vocabulary ``d2t`` / ``t2d`` (``target_id = draft_id + d2t[draft_id]``, t2d a bool mask over
  the target's ids).

Attention per draft layer: a ``sliding_attention`` layer sees the last ``sliding_window`` keys
(when ``use_sliding_window``, as transformers resolves Qwen3 configs); a layer is causal within
the block when ``is_causal`` says so, or, without ``is_causal``, when it is a sliding layer (the
z-lab reference's rule); a speculators draft's sliding layers are causal unless
``sliding_window_non_causal``; full-attention layers are non-causal.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from dflash2rt.errors import CheckpointError, DraftMismatchError
from dflash2rt.models.config import _GENERATION_DEFAULTS, _METADATA, TargetConfig

ARCH_V2, ARCH_V1 = "DFlash2DraftModel", "DFlashDraftModel"
# dflash_config keys: (required for v2, required for v1); the rest have defaults.
_DFLASH_KEYS = {
    "block_size": (True, True), "mask_token_id": (True, True), "target_layer_ids": (True, True),
    "conv_kernel_size": (True, False), "conv_group_size": (True, False),
    "selector_rank": (True, False), "selector_top_k": (True, False),
    "output_multiplier": (False, False), "final_logit_softcapping": (False, False),
    "input_embedding_scale": (False, False),
}
# The z-lab reference reads output_multiplier / final_logit_softcapping for v1 drafts too.
_V2_ONLY = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
# Top-level keys the draft adds to a Qwen3 config, and the sliding-window keys it handles itself.
_DRAFT_TOP = ("dflash_config", "num_target_layers", "is_causal", "block_size")
_SLIDING = ("use_sliding_window", "sliding_window", "max_window_layers", "layer_types")


@dataclass(frozen=True)
class DraftConfig:
    """Architecture (a Qwen3 decoder stack without embedding / LM head) plus ``dflash_config``."""

    arch: TargetConfig
    variant: str                      # "dflash2" or "dflash1"
    block_size: int
    mask_token_id: int
    target_layer_ids: tuple[int, ...]
    num_target_layers: int | None
    sliding_windows: tuple[int | None, ...]   # per draft layer, None = full attention
    conv_kernel_size: int = 0
    conv_group_size: int = 0
    selector_rank: int = 0
    selector_top_k: int = 1
    output_multiplier: float = 1.0
    final_logit_softcapping: float | None = None
    input_embedding_scale: float = 1.0
    causal_layers: tuple[bool, ...] = ()     # per draft layer; () = none causal
    source_format: str = ""                  # "dflash2", "dflash" or "speculators" (the layout read)
    draft_vocab_size: int = 0                # 0: the target's whole vocabulary
    own_head: bool = False                   # lm_head.weight [draft vocab, H] in the checkpoint
    own_embedding: bool = False              # embed_tokens.weight [V, H] in the checkpoint

    @property
    def format(self) -> str:
        return self.source_format or ("dflash2" if self.variant == "dflash2" else "dflash")

    @property
    def reduced_vocab(self) -> bool:
        """The draft proposes over a subset of the target's ids (d2t / t2d)."""
        return 0 < self.draft_vocab_size < self.arch.vocab_size

    @property
    def head_rows(self) -> int:
        """Rows of the draft's LM head: its own vocabulary."""
        return self.draft_vocab_size or self.arch.vocab_size

    def causal(self, layer: int) -> bool:
        return bool(self.causal_layers) and self.causal_layers[layer]

    def with_tensors(self, names) -> "DraftConfig":
        """The config of a checkpoint holding tensors ``names``: a speculators draft's
        ``embed_tokens`` / ``lm_head`` are used when it ships them (vLLM does the same)."""
        if self.source_format != "speculators":
            return self
        names = set(names)
        return replace(self, own_embedding="embed_tokens.weight" in names,
                       own_head=self.reduced_vocab or "lm_head.weight" in names)

    @property
    def gamma(self) -> int:
        return self.block_size - 1

    @property
    def conv_groups(self) -> int:
        return self.arch.hidden_size // self.conv_group_size

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "DraftConfig":
        if not isinstance(d, dict):
            raise CheckpointError(f"draft config must be a JSON object, got {type(d).__name__}")
        if "speculators_model_type" in d or "speculators_config" in d:
            return _from_speculators(d)
        archs = d.get("architectures") or [ARCH_V2]
        if archs[0] not in (ARCH_V2, ARCH_V1):
            raise CheckpointError(f"draft architectures {archs} is not {ARCH_V2} or {ARCH_V1}")
        variant = "dflash2" if archs[0] == ARCH_V2 else "dflash1"
        dc = d.get("dflash_config")
        if not isinstance(dc, dict):
            raise CheckpointError("draft config.json lacks the 'dflash_config' object")
        dc = dict(dc)
        if "block_size" not in dc and "block_size" in d:
            dc["block_size"] = d["block_size"]
        for key in dc:
            if key not in _DFLASH_KEYS:
                raise CheckpointError(f"unknown dflash_config key {key!r} (known: "
                                      f"{', '.join(sorted(_DFLASH_KEYS))})")
            if variant == "dflash1" and key in _V2_ONLY:
                raise CheckpointError(f"dflash_config.{key} belongs to DFlash2, but the "
                                      f"architecture is {ARCH_V1}")
        need = 0 if variant == "dflash2" else 1
        for key, req in _DFLASH_KEYS.items():
            if req[need] and key not in dc:
                raise CheckpointError(f"dflash_config lacks required key {key!r}")
        arch_dict = {k: v for k, v in d.items() if k not in _DRAFT_TOP and k not in _SLIDING}
        arch_dict.setdefault("model_type", "qwen3")
        arch_dict["architectures"] = ["Qwen3ForCausalLM"]
        arch = TargetConfig.from_dict(arch_dict)
        cfg = cls(
            arch=arch, variant=variant, block_size=_int(dc, "block_size"),
            mask_token_id=_int(dc, "mask_token_id"),
            target_layer_ids=tuple(_int({"id": i}, "id") for i in dc["target_layer_ids"]),
            num_target_layers=d.get("num_target_layers"),
            sliding_windows=_windows(d, arch.num_hidden_layers),
            causal_layers=_causal(d, arch.num_hidden_layers),
            source_format="dflash2" if variant == "dflash2" else "dflash",
            conv_kernel_size=int(dc.get("conv_kernel_size", 0)),
            conv_group_size=int(dc.get("conv_group_size", 0)),
            selector_rank=int(dc.get("selector_rank", 0)),
            selector_top_k=int(dc.get("selector_top_k", 1)),
            output_multiplier=float(dc.get("output_multiplier", 1.0)),
            final_logit_softcapping=dc.get("final_logit_softcapping"),
            input_embedding_scale=float(dc.get("input_embedding_scale", 1.0)),
        )
        cfg.validate()
        return cfg

    def validate(self) -> None:
        if self.block_size < 2:
            raise CheckpointError(f"dflash_config.block_size={self.block_size} must be >= 2")
        if not self.target_layer_ids:
            raise CheckpointError("dflash_config.target_layer_ids is empty")
        if self.draft_vocab_size and not 1 <= self.draft_vocab_size <= self.arch.vocab_size:
            raise CheckpointError(f"draft_vocab_size={self.draft_vocab_size} must be in [1, "
                                  f"vocab_size={self.arch.vocab_size}]")
        if self.reduced_vocab and self.variant == "dflash2":
            raise CheckpointError(
                f"a DFlash2 draft with a reduced vocabulary ({self.draft_vocab_size} of "
                f"{self.arch.vocab_size} ids): its candidate selector's codebooks are indexed by "
                "the target's ids, and neither speculators nor vLLM define a reduced DFlash2 "
                "draft; use the full vocabulary")
        if self.variant == "dflash2":
            for key in ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k"):
                if getattr(self, key) < 1:
                    raise CheckpointError(f"dflash_config.{key} must be >= 1")
            if self.arch.hidden_size % self.conv_group_size:
                raise CheckpointError(f"conv_group_size={self.conv_group_size} does not divide "
                                      f"hidden_size={self.arch.hidden_size}")
        cap = self.final_logit_softcapping
        if cap is not None and not cap > 0:
            raise CheckpointError(f"final_logit_softcapping must be > 0 or null, got {cap}")
        if not self.output_multiplier > 0:
            raise CheckpointError(f"output_multiplier must be > 0, got {self.output_multiplier} "
                                  "(a non-positive multiplier would reverse the draft's ranking)")

    def check_target(self, target: TargetConfig) -> None:
        """Raise DraftMismatchError if this draft cannot run on ``target``, naming the mismatch
        and what would fix it (``dflash2rt inspect`` reports every check)."""
        a = self.arch
        other = "use a draft made for this target"
        if a.hidden_size != target.hidden_size:
            raise DraftMismatchError(
                f"draft hidden_size={a.hidden_size} does not match the target's hidden_size="
                f"{target.hidden_size}: the draft was trained on another model's hidden states; "
                f"{other}")
        if a.vocab_size != target.vocab_size:
            mapped = (f" (its d2t/t2d map a {self.draft_vocab_size}-id draft vocabulary into "
                      f"{a.vocab_size} ids)") if self.reduced_vocab else \
                ", and a DFlash draft has no d2t/t2d mapping between vocabularies"
            raise DraftMismatchError(
                f"draft vocab_size={a.vocab_size} does not match the target's vocab_size="
                f"{target.vocab_size}{mapped}: it reads the target's embedding and LM head; "
                f"{other} (with vocab_size={target.vocab_size} and the target's tokenizer)")
        bad = [i for i in self.target_layer_ids if not 0 <= i < target.num_hidden_layers]
        if bad:
            raise DraftMismatchError(
                f"dflash_config.target_layer_ids {bad} are outside the target's "
                f"{target.num_hidden_layers} layers: the draft taps a deeper model; {other}")
        if self.num_target_layers not in (None, target.num_hidden_layers):
            raise DraftMismatchError(
                f"draft was trained for num_target_layers={self.num_target_layers}, the target "
                f"has {target.num_hidden_layers}; {other}")
        if not 0 <= self.mask_token_id < target.vocab_size:
            raise DraftMismatchError(
                f"mask_token_id={self.mask_token_id} is outside the vocabulary (target "
                f"vocab_size={target.vocab_size}); {other}, or set dflash_config.mask_token_id "
                "to the id it was trained with")


def _int(d: dict[str, Any], key: str) -> int:
    v = d[key]
    if not isinstance(v, int) or isinstance(v, bool):
        raise CheckpointError(f"dflash_config.{key} must be an integer, got {v!r}")
    return v


def _layer_types(d: dict[str, Any], layers: int) -> list[str]:
    """``layer_types`` as written, else as transformers' Qwen3Config derives it (sliding from
    ``max_window_layers`` on when ``use_sliding_window``)."""
    types = d.get("layer_types")
    if types is None:
        start = d.get("max_window_layers", 28)
        slide = bool(d.get("use_sliding_window", False))
        types = ["sliding_attention" if slide and i >= start else "full_attention"
                 for i in range(layers)]
    if not isinstance(types, list) or len(types) != layers or any(
            t not in ("sliding_attention", "full_attention") for t in types):
        raise CheckpointError(f"layer_types must list {layers} of sliding_attention/full_attention")
    return types


def _windows(d: dict[str, Any], layers: int) -> tuple[int | None, ...]:
    types = _layer_types(d, layers)
    if not d.get("use_sliding_window", False):
        return (None,) * layers
    window = d.get("sliding_window") or 4096
    if not isinstance(window, int) or isinstance(window, bool) or window < 1:
        raise CheckpointError(f"sliding_window must be a positive integer, got {window!r}")
    return tuple(window if t == "sliding_attention" else None for t in types)


def _causal(d: dict[str, Any], layers: int) -> tuple[bool, ...]:
    """The z-lab reference: ``is_causal`` for every layer when given, else causal exactly on the
    sliding-attention layers."""
    if d.get("is_causal") is not None:
        return (bool(d["is_causal"]),) * layers
    return tuple(t == "sliding_attention" for t in _layer_types(d, layers))


# --- the speculators format (vLLM's speculators library) ----------------------------------------

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


def _from_speculators(d: dict[str, Any]) -> DraftConfig:
    kind = d.get("speculators_model_type")
    if kind not in SPECULATORS_TYPES:
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
    tl = d.get("transformer_layer_config")
    if not isinstance(tl, dict):
        raise CheckpointError("speculators config lacks the 'transformer_layer_config' object")
    aux = d.get("aux_hidden_state_layer_ids")
    if not isinstance(aux, list) or not aux:
        raise CheckpointError("speculators config lacks aux_hidden_state_layer_ids")
    aux = [_int({"aux_hidden_state_layer_ids": a}, "aux_hidden_state_layer_ids") for a in aux]
    if min(aux) < 1:
        raise CheckpointError(
            f"aux_hidden_state_layer_ids {aux}: id 0 is the embedding output, which a DFlash "
            "draft does not tap (speculators ids are target layer ids + 1)")
    block = d.get("block_size")
    if block is None:
        methods = (d.get("speculators_config") or {}).get("proposal_methods") or []
        steps = [m.get("speculative_tokens") for m in methods if isinstance(m, dict)]
        block = steps[0] + 1 if steps and isinstance(steps[0], int) else None
    if block is None or d.get("mask_token_id") is None:
        raise CheckpointError("speculators config lacks block_size (or a proposal method's "
                              "speculative_tokens) or mask_token_id")
    arch_dict = {k: v for k, v in tl.items() if k not in _SLIDING and k != "is_causal"}
    arch_dict["model_type"] = "qwen3"              # the DFlash decoder layers are Qwen3's
    arch_dict["architectures"] = ["Qwen3ForCausalLM"]
    arch = TargetConfig.from_dict(arch_dict)
    th = d.get("target_hidden_size")
    if th not in (None, arch.hidden_size):
        raise CheckpointError(f"target_hidden_size={th} differs from the draft's hidden_size="
                              f"{arch.hidden_size}: not supported")
    layers = arch.num_hidden_layers
    types = _layer_types(tl, layers)
    non_causal = d.get("sliding_window_non_causal", kind == "dflash2")
    variant = "dflash2" if kind == "dflash2" else "dflash1"
    dvocab = d.get("draft_vocab_size") or arch.vocab_size
    cfg = DraftConfig(
        arch=arch, variant=variant, block_size=_int({"block_size": block}, "block_size"),
        mask_token_id=_int(d, "mask_token_id"),
        target_layer_ids=tuple(a - 1 for a in aux),
        num_target_layers=d.get("num_target_layers"),
        sliding_windows=_windows(tl, layers),
        causal_layers=tuple(t == "sliding_attention" and not non_causal for t in types),
        conv_kernel_size=int(d.get("conv_kernel_size", 0) or 0),
        conv_group_size=int(d.get("conv_group_size", 0) or 0),
        selector_rank=int(d.get("selector_rank", 0) or 0),
        selector_top_k=int(d.get("selector_top_k", 1) or 1),
        output_multiplier=float(d.get("output_multiplier") or 1.0),
        final_logit_softcapping=d.get("final_logit_softcapping"),
        input_embedding_scale=float(d.get("input_embedding_scale") or 1.0),
        source_format="speculators",
        draft_vocab_size=_int({"draft_vocab_size": dvocab}, "draft_vocab_size"),
        own_head=True,
    )
    cfg.validate()
    return cfg


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
                   selector_rank=cfg.selector_rank, selector_top_k=cfg.selector_top_k,
                   input_embedding_scale=cfg.input_embedding_scale,
                   output_multiplier=cfg.output_multiplier,
                   final_logit_softcapping=cfg.final_logit_softcapping)
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
