"""TargetConfig: the validated architecture of a Hugging Face Qwen3 or Llama decoder checkpoint."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dflash2rt.errors import CheckpointError
from dflash2rt.models.draft_fields import layer_windows
from dflash2rt.models.rope import RopeConfig, rope_from_hf

# More layers than any checkpoint has: a config beyond it is refused before per-layer lists
# (windows, weight names) are made for it.
MAX_LAYERS = 1 << 16
_REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
# Keys whose values dflash2rt reads (for every supported model type).
_USED = frozenset(
    {
        "model_type", *_REQUIRED, "num_key_value_heads", "head_dim", "hidden_act", "rms_norm_eps",
        "rope_theta", "rope_scaling", "rope_parameters", "partial_rotary_factor",
        "original_max_position_embeddings", "max_position_embeddings", "tie_word_embeddings",
        "attention_bias", "mlp_bias", "bos_token_id", "eos_token_id", "pad_token_id",
    }
)
_USED_QWEN3 = frozenset({"use_sliding_window", "sliding_window", "max_window_layers", "layer_types"})
# Keys that do not change inference numerics. pretraining_tp only splits matmuls in old transformers.
_METADATA = frozenset(
    {
        "architectures", "torch_dtype", "dtype", "transformers_version", "initializer_range", "use_cache",
        "attention_dropout", "pretraining_tp", "_name_or_path", "name_or_path", "return_dict",
        "output_hidden_states", "output_attentions", "torchscript", "use_bfloat16", "chunk_size_feed_forward",
        "is_encoder_decoder", "is_decoder", "add_cross_attention", "tie_encoder_decoder", "pruned_heads",
        "cross_attention_hidden_size", "id2label", "label2id", "num_labels", "problem_type", "finetuning_task",
        "task_specific_params", "tokenizer_class", "prefix", "sep_token_id", "decoder_start_token_id",
        "tf_legacy_loss", "auto_map", "_attn_implementation", "_attn_implementation_autoset",
    }
)
# Generation defaults some old config.json files carry; dflash2rt takes sampling parameters explicitly.
_GENERATION_DEFAULTS = frozenset(
    {
        "max_length", "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups",
        "diversity_penalty", "temperature", "top_k", "top_p", "typical_p", "repetition_penalty",
        "length_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "bad_words_ids",
        "num_return_sequences", "output_scores", "return_dict_in_generate", "forced_bos_token_id",
        "forced_eos_token_id", "remove_invalid_values", "exponential_decay_length_penalty",
        "suppress_tokens", "begin_suppress_tokens",
    }
)
# transformers' per-model defaults for keys a config.json may omit.
_DEFAULTS: dict[str, dict[str, Any]] = {
    "qwen3": {"head_dim": 128, "num_key_value_heads": 32, "max_position_embeddings": 32768,
              "bos_token_id": None, "eos_token_id": None},
    "llama": {"head_dim": None, "num_key_value_heads": None, "max_position_embeddings": 2048,
              "bos_token_id": 1, "eos_token_id": 2},
}
_ARCHITECTURES = {"qwen3": "Qwen3ForCausalLM", "llama": "LlamaForCausalLM"}


@dataclass(frozen=True)
class TargetConfig:
    """Architecture of a Qwen3/Llama decoder; build it with `TargetConfig.from_dict(config_json)`."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope: RopeConfig = field(default_factory=RopeConfig)
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    pad_token_id: int | None = None

    def __post_init__(self) -> None:
        if self.model_type not in _ARCHITECTURES:
            raise CheckpointError(f"model_type {self.model_type!r} is not supported (supported: qwen3, llama)")
        for name in (*_REQUIRED, "num_key_value_heads", "head_dim", "max_position_embeddings"):
            _positive_int(name, getattr(self, name))
        outside = [t for t in self.eos_token_ids if not 0 <= t < self.vocab_size]
        if outside:
            raise CheckpointError(f"eos_token_id {outside} outside the vocabulary "
                                  f"[0, {self.vocab_size}): such a token can never be generated")
        if self.num_attention_heads % self.num_key_value_heads:
            raise CheckpointError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        if self.head_dim % 2:
            raise CheckpointError(f"head_dim={self.head_dim} must be even for rotary embeddings")
        if not self.rms_norm_eps > 0:
            raise CheckpointError(f"rms_norm_eps must be > 0, got {self.rms_norm_eps!r}")
        if self.model_type == "qwen3" and self.mlp_bias:
            raise CheckpointError("mlp_bias=true is not a Qwen3 option")

    @property
    def qk_norm(self) -> bool:
        """Qwen3 RMS-normalises q and k per head before rope; Llama does not."""
        return self.model_type == "qwen3"

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TargetConfig:
        """Validate a HF config.json dict; unknown or unsupported keys raise CheckpointError naming the key."""
        if not isinstance(d, dict):
            raise CheckpointError(f"config must be a JSON object, got {type(d).__name__}")
        model_type = d.get("model_type")
        if not isinstance(model_type, str) or model_type not in _DEFAULTS:
            raise CheckpointError(f"model_type {model_type!r} is not supported (supported: qwen3, llama)")
        _check_keys(d, model_type)
        for key in _REQUIRED:
            if d.get(key) is None:
                raise CheckpointError(f"config.json lacks required key {key!r}")
        if d.get("hidden_act", "silu") not in ("silu", "swish"):   # swish is silu's other name
            raise CheckpointError(
                f"hidden_act={d['hidden_act']!r} is not supported (only 'silu' / 'swish')")
        if d.get("quantization_config") is not None:
            raise CheckpointError("quantization_config: quantized checkpoints are not supported")
        for key in _REQUIRED:
            _positive_int(key, d[key])
        if d["num_hidden_layers"] > MAX_LAYERS:      # before anything is made per layer
            raise CheckpointError(f"config num_hidden_layers={d['num_hidden_layers']} is more "
                                  f"than dflash2rt loads (at most {MAX_LAYERS:,})")
        for key in ("tie_word_embeddings", "attention_bias", "mlp_bias"):
            if not isinstance(d.get(key, False), bool):
                raise CheckpointError(f"config {key} must be true or false, got {d[key]!r}")
        eps = d.get("rms_norm_eps", 1e-6)
        if isinstance(eps, bool) or not isinstance(eps, (int, float)):
            raise CheckpointError(f"rms_norm_eps must be a number > 0, got {eps!r}")
        defaults = _DEFAULTS[model_type]
        heads = d["num_attention_heads"]
        head_dim = _get(d, "head_dim", defaults) or d["hidden_size"] // heads
        max_pos = _get(d, "max_position_embeddings", defaults)
        if model_type == "qwen3":
            _check_qwen3_attention(d)
        return cls(
            model_type=model_type,
            vocab_size=d["vocab_size"],
            hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"],
            num_hidden_layers=d["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=_get(d, "num_key_value_heads", defaults) or heads,
            head_dim=head_dim,
            rms_norm_eps=float(eps),
            rope=rope_from_hf(d, max_pos),
            max_position_embeddings=max_pos,
            tie_word_embeddings=d.get("tie_word_embeddings", False),
            attention_bias=d.get("attention_bias", False),
            mlp_bias=d.get("mlp_bias", False),
            bos_token_id=_get(d, "bos_token_id", defaults),
            eos_token_ids=_id_tuple(_get(d, "eos_token_id", defaults)),
            pad_token_id=d.get("pad_token_id"),
        )

    def to_dict(self) -> dict[str, Any]:
        """A config.json dict that transformers (4.x and 5.x) and `from_dict` both read back to this config."""
        eos: Any = list(self.eos_token_ids) if len(self.eos_token_ids) != 1 else self.eos_token_ids[0]
        out: dict[str, Any] = {
            "architectures": [_ARCHITECTURES[self.model_type]],
            "model_type": self.model_type,
            **{k: getattr(self, k) for k in (*_REQUIRED, "num_key_value_heads", "head_dim")},
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope.theta,
            "rope_scaling": self.rope.to_hf_dict(),
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": self.attention_bias,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": eos if self.eos_token_ids else None,
            "pad_token_id": self.pad_token_id,
        }
        if self.model_type == "llama":
            out["mlp_bias"] = self.mlp_bias
        else:
            out["use_sliding_window"] = False
        return out


def _positive_int(name: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise CheckpointError(f"config {name} must be a positive integer, got {value!r}")


def _get(d: dict[str, Any], key: str, defaults: dict[str, Any]) -> Any:
    return d[key] if key in d else defaults[key]


def _id_tuple(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    values = value if isinstance(value, (list, tuple)) else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise CheckpointError(f"eos_token_id must be an int or a list of ints, got {value!r}")
    return tuple(values)


def _check_keys(d: dict[str, Any], model_type: str) -> None:
    known = _USED | _METADATA | _GENERATION_DEFAULTS | {"quantization_config"}
    if model_type == "qwen3":
        known = known | _USED_QWEN3
    for key in d:
        if key not in known:
            raise CheckpointError(
                f"config.json key {key!r} is not understood by dflash2rt's {model_type} model: it is neither "
                "a supported architecture option nor known metadata; remove it if it does not change the model"
            )


def _check_qwen3_attention(d: dict[str, Any]) -> None:
    """Sliding-window layers are not supported: raise unless every layer is full attention, as
    transformers' Qwen3Config resolves the sliding-window keys (``draft_fields.layer_windows``)."""
    windows = layer_windows(d, d["num_hidden_layers"])
    sliding = [i for i, w in enumerate(windows) if w is not None]
    if sliding:
        raise CheckpointError(
            f"sliding-window attention is not supported (use_sliding_window="
            f"{d.get('use_sliding_window')}, sliding_window={d.get('sliding_window', 4096)}, layers "
            f"{sliding} slide); only full attention is"
        )
