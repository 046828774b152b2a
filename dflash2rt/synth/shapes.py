"""Published model shapes: each target's config.json as its publisher ships it, and the DFlash2
draft sized for it in the published draft format (``published-draft-config.json``, the config of
a published DFlash2 draft: block 16, top-K 16, rank 256, sliding-window draft layers).

Token ids follow the real vocabularies: Qwen3 has 151,643 regular tokens, then its specials from
151,643 (``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``, ...) in a vocabulary padded to
151,936; Llama 3.1 has 128,000 regular tokens and 256 specials; the published draft's target
202,048 ids with specials from 200,000.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import InvalidInputError

PUBLISHED_DRAFT = json.loads((Path(__file__).with_name("published-draft-config.json"))
                             .read_text(encoding="utf-8"))

_QWEN3 = {
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "initializer_range": 0.02, "max_position_embeddings": 40960, "model_type": "qwen3",
    "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000,
    "sliding_window": None, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
    "use_cache": True, "use_sliding_window": False, "vocab_size": 151936,
}


def _qwen3(hidden: int, intermediate: int, layers: int, heads: int, tied: bool) -> dict[str, Any]:
    return {**_QWEN3, "hidden_size": hidden, "intermediate_size": intermediate,
            "num_hidden_layers": layers, "max_window_layers": layers,
            "num_attention_heads": heads, "tie_word_embeddings": tied}


def _published_target() -> dict[str, Any]:
    """The target the published draft config implies: its hidden size, vocabulary, layer count
    (``num_target_layers``), heads, MLP width, rope and token ids."""
    d = PUBLISHED_DRAFT
    return {"architectures": ["Qwen3ForCausalLM"], "attention_bias": False,
            "attention_dropout": 0.0, "bos_token_id": d["bos_token_id"],
            "eos_token_id": d["eos_token_id"], "pad_token_id": d["pad_token_id"],
            "head_dim": d["head_dim"], "hidden_act": "silu", "hidden_size": d["hidden_size"],
            "initializer_range": 0.02, "intermediate_size": d["intermediate_size"],
            "max_position_embeddings": d["max_position_embeddings"],
            "max_window_layers": d["num_target_layers"], "model_type": "qwen3",
            "num_attention_heads": d["num_attention_heads"],
            "num_hidden_layers": d["num_target_layers"],
            "num_key_value_heads": d["num_key_value_heads"], "rms_norm_eps": d["rms_norm_eps"],
            "rope_parameters": dict(d["rope_parameters"]), "sliding_window": None,
            "tie_word_embeddings": False, "dtype": "bfloat16", "use_cache": True,
            "use_sliding_window": False, "vocab_size": d["vocab_size"]}


@dataclass(frozen=True)
class Shape:
    """A target config.json, its tokenizer's layout and the draft's mask token."""

    name: str
    target: dict[str, Any]
    regular_tokens: int            # ids [0, regular_tokens) are BPE tokens
    specials: tuple[str, ...]      # then these, in order
    mask_token_id: int             # the draft's mask (an id no text encodes to)

    @property
    def num_layers(self) -> int:
        return int(self.target["num_hidden_layers"])


_QWEN3_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>",
                   "<|object_ref_end|>", "<|box_start|>", "<|box_end|>", "<|quad_start|>",
                   "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
                   "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>",
                   "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
                   "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>",
                   "<think>", "</think>", "<|mask|>")        # 151643 .. 151669 (the draft's mask)
_LLAMA_SPECIALS = ("<|begin_of_text|>", "<|end_of_text|>") + tuple(
    f"<|reserved_special_token_{i}|>" for i in range(254))
_PUBLISHED_SPECIALS = tuple(f"<|special_{i}|>" for i in range(2048))    # 200000 .. 202047

SHAPES: dict[str, Shape] = {
    "qwen3-0.6b": Shape("qwen3-0.6b", _qwen3(1024, 3072, 28, 16, True), 151643,
                        _QWEN3_SPECIALS, 151669),
    "qwen3-4b": Shape("qwen3-4b", _qwen3(2560, 9728, 36, 32, True), 151643, _QWEN3_SPECIALS,
                      151669),
    "qwen3-8b": Shape("qwen3-8b", _qwen3(4096, 12288, 36, 32, False), 151643, _QWEN3_SPECIALS,
                      151669),
    "llama3.1-8b": Shape("llama3.1-8b", {
        "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu",
        "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
        "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama",
        "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
        "pretraining_tp": 1, "rms_norm_eps": 1e-05,
        "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "transformers_version": "4.43.0.dev0", "use_cache": True, "vocab_size": 128256},
        128000, _LLAMA_SPECIALS, 128002),
    "published-draft": Shape("published-draft", _published_target(), 200000,
                             _PUBLISHED_SPECIALS,
                             PUBLISHED_DRAFT["dflash_config"]["mask_token_id"]),
}

# Toy sizes in the same layouts (config keys, token-id layout, tied or not, rope), for tests and
# CI: a 64-wide Qwen3 with Qwen3's specials after 1,000 regular ids (padded to 1,088 as Qwen3
# pads its vocabulary), and a 64-wide Llama 3.1 with its 256 specials after 1,000 regular ids.
TOY_SHAPES: dict[str, Shape] = {
    "toy-qwen3": Shape("toy-qwen3", {
        **_qwen3(64, 128, 4, 4, True), "head_dim": 16, "num_key_value_heads": 2,
        "bos_token_id": 1000, "eos_token_id": 1002, "vocab_size": 1088,
        "max_position_embeddings": 4096}, 1000, _QWEN3_SPECIALS, 1026),
    "toy-llama3": Shape("toy-llama3", {
        **SHAPES["llama3.1-8b"].target, "hidden_size": 64, "intermediate_size": 128,
        "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 4,
        "bos_token_id": 1000, "eos_token_id": 1001, "vocab_size": 1256,
        "max_position_embeddings": 4096}, 1000, _LLAMA_SPECIALS, 1002),
}


def get_shape(name: str, layers: int | None = None) -> Shape:
    """A named shape; ``layers``: the same layout with fewer target layers (tests, CI)."""
    known = {**SHAPES, **TOY_SHAPES}
    if name not in known:
        raise InvalidInputError(f"unknown shape {name!r}; choose one of {', '.join(known)}")
    shape = known[name]
    if layers is None:
        return shape
    if not 1 <= layers <= shape.num_layers:
        raise InvalidInputError(f"layers must be in [1, {shape.num_layers}] for {name}, got {layers}")
    target = {**copy.deepcopy(shape.target), "num_hidden_layers": layers}
    if "max_window_layers" in target:
        target["max_window_layers"] = layers
    return Shape(shape.name, target, shape.regular_tokens, shape.specials, shape.mask_token_id)


def tap_layers(num_layers: int, taps: int = 5) -> list[int]:
    """The published drafts' taps: ``taps`` layers evenly spaced from 1 to L - 3 (52 layers:
    1, 13, 25, 37, 49; 36 layers: 1, 9, 17, 25, 33); fewer when the target is shallow."""
    last = max(num_layers - 3, 1)
    ids = sorted({min(1 + round(i * (last - 1) / (taps - 1)), num_layers - 1) for i in range(taps)})
    return ids if num_layers > 1 else [0]


def draft_config(shape: Shape, draft_layers: int | None = None) -> dict[str, Any]:
    """The published draft config.json re-sized for ``shape``'s target (same dflash_config
    hyper-parameters, sliding-window layers, token ids of the target's vocabulary)."""
    t, d = shape.target, copy.deepcopy(PUBLISHED_DRAFT)
    if draft_layers is not None and (not isinstance(draft_layers, int)
                                     or isinstance(draft_layers, bool) or draft_layers < 1):
        raise InvalidInputError(f"draft_layers must be an integer >= 1 (or None for the "
                                f"published {d['num_hidden_layers']}), got {draft_layers!r}")
    n = d["num_hidden_layers"] if draft_layers is None else draft_layers
    dc = d["dflash_config"]
    dc.update(mask_token_id=shape.mask_token_id, target_layer_ids=tap_layers(t["num_hidden_layers"]))
    rope = t.get("rope_parameters") or {"rope_theta": t["rope_theta"], "rope_type": "default",
                                        **(t.get("rope_scaling") or {})}
    d.update(bos_token_id=t["bos_token_id"], eos_token_id=t["eos_token_id"],
             pad_token_id=t.get("pad_token_id", t["eos_token_id"]),
             head_dim=t.get("head_dim", t["hidden_size"] // t["num_attention_heads"]),
             hidden_size=t["hidden_size"], intermediate_size=t["intermediate_size"],
             max_position_embeddings=t["max_position_embeddings"], num_hidden_layers=n,
             max_window_layers=n, layer_types=["sliding_attention"] * n,
             num_attention_heads=t["num_attention_heads"],
             num_key_value_heads=t["num_key_value_heads"], num_target_layers=t["num_hidden_layers"],
             rms_norm_eps=t["rms_norm_eps"], rope_parameters=rope, vocab_size=t["vocab_size"])
    return d


DRAFT_FORMATS = ("dflash2", "dflash", "speculators")
# Layouts per format (the first is the default), each as a published checkpoint has it:
LAYOUTS = {
    # the published DFlash2 draft; its codebooks stored as ``.weight`` (nn.Embedding saves);
    # draft layers mixing sliding and full attention (no is_causal: sliding layers causal)
    "dflash2": ("published", "codebook-weight", "mixed-attention"),
    # older Qwen3 / Llama b16 drafts: block_size at the top level; Qwen3.5+: in dflash_config
    "dflash": ("block-at-top", "nested"),
    # speculators' DFlash (v1) and DFlash2
    "speculators": ("dflash", "dflash2"),
}


def check_layout(draft_format: str, layout: str | None, draft_vocab: int | None) -> str:
    """The layout to write (``layout`` or the format's default); InvalidInputError otherwise."""
    if draft_format not in LAYOUTS:
        raise InvalidInputError(f"unknown draft format {draft_format!r}; choose one of "
                                f"{', '.join(DRAFT_FORMATS)}")
    layout = layout or LAYOUTS[draft_format][0]
    if layout not in LAYOUTS[draft_format]:
        raise InvalidInputError(f"layout {layout!r} is not one of {draft_format}'s: "
                                f"{', '.join(LAYOUTS[draft_format])}")
    if draft_vocab is not None and (draft_format, layout) != ("speculators", "dflash"):
        raise InvalidInputError("a reduced draft vocabulary (--draft-vocab) exists in the "
                                "speculators format's DFlash drafts only")
    return layout


def v1_config(shape: Shape, draft_layers: int | None = None, block_at_top: bool = True
              ) -> dict[str, Any]:
    """A DFlash v1 draft for ``shape`` as z-lab publishes them (Qwen3-8B-DFlash-b16): full
    attention layers, ``dflash_config`` with the mask and taps, block 16."""
    d = draft_config(shape, draft_layers)
    n = d["num_hidden_layers"]
    dc = d["dflash_config"]
    d["dflash_config"] = {"mask_token_id": dc["mask_token_id"],
                          "target_layer_ids": dc["target_layer_ids"]}
    if block_at_top:
        d["block_size"] = dc["block_size"]
    else:
        d["dflash_config"]["block_size"] = dc["block_size"]
    d.pop("is_causal")
    d.update(architectures=["DFlashDraftModel"], auto_map={"AutoModel": "dflash.DFlashDraftModel"},
             layer_types=["full_attention"] * n, use_sliding_window=False, sliding_window=None)
    return d


def mixed_attention(d: dict[str, Any]) -> dict[str, Any]:
    """The same draft with alternating sliding / full attention layers (the last one full) and
    no ``is_causal`` (the z-lab rule: the sliding layers are causal within the block)."""
    n = d["num_hidden_layers"]
    d = copy.deepcopy(d)
    d.pop("is_causal", None)
    d["layer_types"] = ["sliding_attention" if (n - 1 - i) % 2 else "full_attention"
                        for i in range(n)]
    return d
