"""DraftConfig: a DFlash2 (or DFlash v1) draft's config.json, validated, unknown keys refused."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dflash2rt.errors import CheckpointError, DraftMismatchError
from dflash2rt.models.config import TargetConfig

ARCH_V2, ARCH_V1 = "DFlash2DraftModel", "DFlashDraftModel"
# dflash_config keys: (required for v2, required for v1); the rest have defaults.
_DFLASH_KEYS = {
    "block_size": (True, True), "mask_token_id": (True, True), "target_layer_ids": (True, True),
    "conv_kernel_size": (True, False), "conv_group_size": (True, False),
    "selector_rank": (True, False), "selector_top_k": (True, False),
    "output_multiplier": (False, False), "final_logit_softcapping": (False, False),
    "input_embedding_scale": (False, False),
}
_V2_ONLY = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k",
            "output_multiplier", "final_logit_softcapping")
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
        if d.get("is_causal", False):
            raise CheckpointError("is_causal=true: DFlash drafts attend non-causally within a block")
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
            raise DraftMismatchError(
                f"draft vocab_size={a.vocab_size} does not match the target's vocab_size="
                f"{target.vocab_size}, and a DFlash draft has no d2t/t2d mapping between "
                f"vocabularies: it reads the target's embedding and LM head; {other} (with "
                f"vocab_size={target.vocab_size} and the target's tokenizer)")
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


def _windows(d: dict[str, Any], layers: int) -> tuple[int | None, ...]:
    if not d.get("use_sliding_window", False):
        return (None,) * layers
    window = int(d.get("sliding_window") or 4096)
    types = d.get("layer_types") or ["sliding_attention"] * layers
    if len(types) != layers or any(t not in ("sliding_attention", "full_attention") for t in types):
        raise CheckpointError(f"layer_types must list {layers} of sliding_attention/full_attention")
    return tuple(window if t == "sliding_attention" else None for t in types)


def draft_config_dict(cfg: DraftConfig) -> dict[str, Any]:
    """The config.json dict (published DFlash2 layout) that ``DraftConfig.from_dict`` reads back."""
    out = cfg.arch.to_dict()
    out["architectures"] = [ARCH_V2 if cfg.variant == "dflash2" else ARCH_V1]
    out["is_causal"] = False
    if cfg.num_target_layers is not None:
        out["num_target_layers"] = cfg.num_target_layers
    windows = set(cfg.sliding_windows) - {None}
    out["use_sliding_window"] = bool(windows)
    if windows:
        out["sliding_window"] = windows.pop()
        out["layer_types"] = ["full_attention" if w is None else "sliding_attention"
                              for w in cfg.sliding_windows]
    dc: dict[str, Any] = {"block_size": cfg.block_size, "mask_token_id": cfg.mask_token_id,
                          "target_layer_ids": list(cfg.target_layer_ids),
                          "input_embedding_scale": cfg.input_embedding_scale}
    if cfg.variant == "dflash2":
        dc.update(conv_kernel_size=cfg.conv_kernel_size, conv_group_size=cfg.conv_group_size,
                  selector_rank=cfg.selector_rank, selector_top_k=cfg.selector_top_k,
                  output_multiplier=cfg.output_multiplier,
                  final_logit_softcapping=cfg.final_logit_softcapping)
    out["dflash_config"] = dc
    return out
