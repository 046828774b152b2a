"""DraftConfig: a draft's config.json, validated, unknown keys refused, in any published layout.

Layouts read (docs/models.md, "Draft formats"): ``dflash2`` (``DFlash2DraftModel``, a Qwen3
config plus ``dflash_config``) and ``dflash`` (v1, ``DFlashDraftModel``; ``block_size`` inside
``dflash_config`` or, in the older drafts (Qwen3 / Llama b16), at the top level), read here;
``speculators`` (vLLM's speculators format), read by ``speculators_config.py``. Attention per
draft layer and the other shared fields: ``draft_fields.py``; the config.json dict of a
DraftConfig, in any layout: ``draft_config_write.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from dflash2rt.errors import CheckpointError, DraftMismatchError
from dflash2rt.models.config import TargetConfig
from dflash2rt.models.draft_fields import (ARCH_V1, ARCH_V2, SLIDING_KEYS, float_or, int_field,
                                           int_or, layer_causal, layer_ids, layer_windows)
from dflash2rt.models.speculators_config import speculators_fields

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
# Top-level keys the draft adds to a Qwen3 config.
_DRAFT_TOP = ("dflash_config", "num_target_layers", "is_causal", "block_size")


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
            cfg = cls(**speculators_fields(d))
            cfg.validate()
            return cfg
        archs = d.get("architectures") or [ARCH_V2]
        if not isinstance(archs, list) or archs[0] not in (ARCH_V2, ARCH_V1):
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
        arch_dict = {k: v for k, v in d.items() if k not in _DRAFT_TOP and k not in SLIDING_KEYS}
        arch_dict.setdefault("model_type", "qwen3")
        arch_dict["architectures"] = ["Qwen3ForCausalLM"]
        arch = TargetConfig.from_dict(arch_dict)
        cfg = cls(
            arch=arch, variant=variant, block_size=int_field(dc, "block_size"),
            mask_token_id=int_field(dc, "mask_token_id"),
            target_layer_ids=layer_ids(dc["target_layer_ids"]),
            num_target_layers=d.get("num_target_layers"),
            sliding_windows=layer_windows(d, arch.num_hidden_layers),
            causal_layers=layer_causal(d, arch.num_hidden_layers),
            source_format="dflash2" if variant == "dflash2" else "dflash",
            conv_kernel_size=int_or(dc, "conv_kernel_size", 0),
            conv_group_size=int_or(dc, "conv_group_size", 0),
            selector_rank=int_or(dc, "selector_rank", 0),
            selector_top_k=int_or(dc, "selector_top_k", 1),
            output_multiplier=float_or(dc, "output_multiplier", 1.0),
            final_logit_softcapping=float_or(dc, "final_logit_softcapping", None),
            input_embedding_scale=float_or(dc, "input_embedding_scale", 1.0),
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
            if self.selector_top_k > self.arch.vocab_size:
                raise CheckpointError(f"dflash_config.selector_top_k={self.selector_top_k} is "
                                      f"more candidates than the vocabulary has "
                                      f"({self.arch.vocab_size})")
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

