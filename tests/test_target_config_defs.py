"""TargetConfig against its contract written out anew: each check alone beside good fields, every
domain's edges, and transformers' per-model defaults and config.json keys as hand values."""

from __future__ import annotations

import dataclasses
import math

import pytest

from dflash2rt.errors import CheckpointError
from dflash2rt.models.config import TargetConfig
from dflash2rt.models.rope import RopeConfig

from dict_edit import DROP, apply

# A small valid Qwen3 config: 4 heads over 2 KV heads of 16, 2 layers, 97 ids.
BASE = {"model_type": "qwen3", "vocab_size": 97, "hidden_size": 64, "intermediate_size": 112,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16}
FIELDS = {k: v for k, v in BASE.items()}
INTS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
        "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings")


def raw(**changes) -> dict:
    return apply(dict(BASE), changes)


def parse(**changes) -> TargetConfig:
    return TargetConfig.from_dict(raw(**changes))


def build(**changes) -> TargetConfig:
    return TargetConfig(**{**FIELDS, **changes})


# ---- the dataclass itself -------------------------------------------------------------------

def test_dataclass_defaults():
    c = build()
    assert c.rms_norm_eps == 1e-6 and type(c.rms_norm_eps) is float
    assert c.max_position_embeddings == 2048
    assert (c.tie_word_embeddings, c.attention_bias, c.mlp_bias) == (False, False, False)
    assert (c.bos_token_id, c.eos_token_ids, c.pad_token_id) == (None, (), None)
    assert c.rope == RopeConfig()


def test_frozen():
    """A config is a value (docs/design.md: frozen dataclass configs): no field can be set."""
    c = build()
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.vocab_size = 5
    assert hash(c) == hash(build()) and c.vocab_size == 97


@pytest.mark.parametrize("model_type", ["mistral", "Qwen3", "", None])
def test_model_type_supported(model_type):
    with pytest.raises(CheckpointError, match="model_type"):
        build(model_type=model_type)


@pytest.mark.parametrize("name", INTS)
@pytest.mark.parametrize("value", [0, -1, True, 1.0, 2.0, "2", None])
def test_each_integer_field_alone(name, value):
    with pytest.raises(CheckpointError, match=f"config {name} must be a positive integer"):
        build(**{name: value})


def test_integer_fields_at_one():
    """1 is the smallest value of every integer field (head_dim excepted: it must be even)."""
    c = build(vocab_size=1, hidden_size=1, intermediate_size=1, num_hidden_layers=1,
              num_attention_heads=1, num_key_value_heads=1, head_dim=2,
              max_position_embeddings=1)
    assert (c.vocab_size, c.num_attention_heads, c.max_position_embeddings) == (1, 1, 1)


@pytest.mark.parametrize("eos", [(-1,), (97,), (0, 97), (96, -1), (10**6,)])
def test_eos_outside_the_vocabulary(eos):
    with pytest.raises(CheckpointError, match="outside the vocabulary"):
        build(eos_token_ids=eos)


@pytest.mark.parametrize("eos", [(), (0,), (96,), (0, 96), (5, 5)])
def test_eos_inside_the_vocabulary(eos):
    assert build(eos_token_ids=eos).eos_token_ids == eos


@pytest.mark.parametrize("heads,kv", [(4, 3), (6, 4), (3, 2), (2, 4)])
def test_heads_not_a_multiple_of_kv_heads(heads, kv):
    with pytest.raises(CheckpointError, match="not a multiple of num_key_value_heads"):
        build(num_attention_heads=heads, num_key_value_heads=kv)


@pytest.mark.parametrize("heads,kv", [(4, 1), (4, 2), (4, 4), (6, 3), (1, 1)])
def test_heads_a_multiple_of_kv_heads(heads, kv):
    c = build(num_attention_heads=heads, num_key_value_heads=kv)
    assert (c.num_attention_heads, c.num_key_value_heads) == (heads, kv)


@pytest.mark.parametrize("head_dim", [1, 3, 15, 17])
def test_odd_head_dim(head_dim):
    with pytest.raises(CheckpointError, match="must be even"):
        build(head_dim=head_dim)


@pytest.mark.parametrize("head_dim", [2, 4, 16, 18])
def test_even_head_dim(head_dim):
    assert build(head_dim=head_dim).head_dim == head_dim


@pytest.mark.parametrize("eps", [0.0, -0.0, -1e-6, math.nan, -math.inf])
def test_rms_norm_eps_not_positive(eps):
    with pytest.raises(CheckpointError, match="rms_norm_eps must be > 0"):
        build(rms_norm_eps=eps)


@pytest.mark.parametrize("eps", [5e-324, 1e-6, 1.0, math.inf])
def test_rms_norm_eps_positive(eps):
    assert build(rms_norm_eps=eps).rms_norm_eps == eps


def test_mlp_bias_is_a_llama_option_only():
    with pytest.raises(CheckpointError, match="mlp_bias=true is not a Qwen3 option"):
        build(mlp_bias=True)
    assert build(model_type="llama", mlp_bias=True).mlp_bias is True
    assert build(mlp_bias=False).mlp_bias is False


def test_qk_norm_is_qwen3s():
    assert build().qk_norm is True
    assert build(model_type="llama").qk_norm is False


# ---- from_dict: the config.json's keys -----------------------------------------------------

@pytest.mark.parametrize("d", [[], None, "qwen3", 3, [("model_type", "qwen3")]])
def test_not_an_object(d):
    with pytest.raises(CheckpointError, match="config must be a JSON object"):
        TargetConfig.from_dict(d)


@pytest.mark.parametrize("model_type", [DROP, None, "mistral", "QWEN3", "qwen2"])
def test_unsupported_model_type(model_type):
    with pytest.raises(CheckpointError, match="is not supported"):
        parse(model_type=model_type)


@pytest.mark.parametrize("model_type", ["qwen3", "llama"])
@pytest.mark.parametrize("key", ["sliding", "num_experts", "rope_theta_", "hidden_activation"])
def test_an_unknown_key_alone(model_type, key):
    with pytest.raises(CheckpointError, match=f"key '{key}' is not understood"):
        parse(model_type=model_type, **{key: 1})


QWEN3_ONLY = {"use_sliding_window": False, "sliding_window": 8, "max_window_layers": 2,
              "layer_types": ["full_attention", "full_attention"]}


@pytest.mark.parametrize("key", sorted(QWEN3_ONLY))
def test_sliding_keys_are_qwen3s(key):
    parse(**{key: QWEN3_ONLY[key]})
    with pytest.raises(CheckpointError,
                       match=f"key '{key}' is not understood by dflash2rt's llama"):
        parse(model_type="llama", **{key: QWEN3_ONLY[key]})


# Keys a config.json may carry, written out from transformers' PretrainedConfig and generation
# defaults: each alone is accepted by both model types.
ACCEPTED = {"architectures": ["X"], "torch_dtype": "bfloat16", "dtype": "float16",
            "transformers_version": "4.51.0", "initializer_range": 0.02, "use_cache": True,
            "attention_dropout": 0.0, "pretraining_tp": 1, "_name_or_path": "x",
            "auto_map": {}, "_attn_implementation": None, "id2label": {}, "tokenizer_class": None,
            "max_length": 20, "do_sample": False, "temperature": 1.0, "top_k": 50, "top_p": 1.0,
            "repetition_penalty": 1.0, "num_beams": 1, "suppress_tokens": None,
            "quantization_config": None, "pad_token_id": 3, "bos_token_id": 1,
            "eos_token_id": 2, "hidden_act": "silu", "rms_norm_eps": 1e-5, "rope_theta": 1e6,
            "rope_scaling": None, "tie_word_embeddings": True, "attention_bias": True,
            "max_position_embeddings": 64}


@pytest.mark.parametrize("model_type", ["qwen3", "llama"])
@pytest.mark.parametrize("key", sorted(ACCEPTED))
def test_an_accepted_key_alone(model_type, key):
    c = parse(model_type=model_type, **{key: ACCEPTED[key]})
    assert c.model_type == model_type


REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
            "num_attention_heads")


@pytest.mark.parametrize("key", REQUIRED)
@pytest.mark.parametrize("how", [DROP, None])
def test_a_required_key_missing_alone(key, how):
    with pytest.raises(CheckpointError, match=f"lacks required key '{key}'"):
        parse(**{key: how})


@pytest.mark.parametrize("act", [DROP, "silu", "swish"])
def test_silu_activation(act):
    assert parse(hidden_act=act).hidden_size == 64


@pytest.mark.parametrize("act", ["gelu", "SiLU", "relu", None, ""])
def test_other_activations(act):
    with pytest.raises(CheckpointError, match="hidden_act"):
        parse(hidden_act=act)


@pytest.mark.parametrize("q", [{}, {"quant_method": "gptq"}, "awq", 0, False])
def test_quantization_config(q):
    with pytest.raises(CheckpointError, match="quantization_config"):
        parse(quantization_config=q)


@pytest.mark.parametrize("model_type", ["qwen3", "llama"])
@pytest.mark.parametrize("key", ["tie_word_embeddings", "attention_bias", "mlp_bias"])
@pytest.mark.parametrize("value", [0, 1, "false", None, [True]])
def test_each_flag_a_boolean(model_type, key, value):
    with pytest.raises(CheckpointError, match=f"config {key} must be true or false"):
        parse(model_type=model_type, **{key: value})


def test_flags_as_written():
    assert parse(tie_word_embeddings=True).tie_word_embeddings is True
    assert parse(attention_bias=True).attention_bias is True
    c = parse(model_type="llama", mlp_bias=True)
    assert (c.mlp_bias, c.attention_bias, c.tie_word_embeddings) == (True, False, False)


@pytest.mark.parametrize("eps", [True, False, "1e-6", None, [1e-6]])
def test_rms_norm_eps_a_number(eps):
    with pytest.raises(CheckpointError, match="rms_norm_eps must be a number"):
        parse(rms_norm_eps=eps)


def test_rms_norm_eps_as_written():
    assert parse(rms_norm_eps=DROP).rms_norm_eps == 1e-6
    c = parse(rms_norm_eps=1)
    assert c.rms_norm_eps == 1.0 and type(c.rms_norm_eps) is float
    assert parse(rms_norm_eps=2.5e-7).rms_norm_eps == 2.5e-7


# transformers' defaults for an omitted key (Qwen3Config / LlamaConfig).
def test_qwen3_defaults():
    c = parse(head_dim=DROP, num_key_value_heads=DROP, num_attention_heads=32, hidden_size=64,
              max_position_embeddings=DROP, bos_token_id=DROP, eos_token_id=DROP)
    assert (c.head_dim, c.num_key_value_heads, c.max_position_embeddings) == (128, 32, 32768)
    assert (c.bos_token_id, c.eos_token_ids, c.pad_token_id) == (None, (), None)


def test_llama_defaults():
    c = parse(model_type="llama", head_dim=DROP, num_key_value_heads=DROP, hidden_size=66,
              max_position_embeddings=DROP, bos_token_id=DROP, eos_token_id=DROP)
    # head_dim = hidden_size // num_attention_heads = 66 // 4; KV heads = attention heads.
    assert (c.head_dim, c.num_key_value_heads, c.max_position_embeddings) == (16, 4, 2048)
    assert (c.bos_token_id, c.eos_token_ids) == (1, (2,))


@pytest.mark.parametrize("model_type", ["qwen3", "llama"])
def test_nulls_fall_back_to_the_attention_shape(model_type):
    c = parse(model_type=model_type, head_dim=None, num_key_value_heads=None, hidden_size=72)
    assert (c.head_dim, c.num_key_value_heads) == (18, 4)


@pytest.mark.parametrize("model_type", ["qwen3", "llama"])
def test_values_as_written(model_type):
    c = parse(model_type=model_type, vocab_size=11, hidden_size=40, intermediate_size=7,
              num_hidden_layers=3, num_attention_heads=6, num_key_value_heads=3, head_dim=10,
              max_position_embeddings=77, bos_token_id=4, eos_token_id=[9, 10], pad_token_id=5,
              rope_theta=500.0)
    assert (c.vocab_size, c.hidden_size, c.intermediate_size, c.num_hidden_layers) == (11, 40, 7, 3)
    assert (c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (6, 3, 10)
    assert (c.max_position_embeddings, c.bos_token_id, c.eos_token_ids) == (77, 4, (9, 10))
    assert c.pad_token_id == 5 and c.rope.theta == 500.0


@pytest.mark.parametrize("eos,ids", [(None, ()), ([], ()), (0, (0,)), (96, (96,)), ([3], (3,)),
                                     ([1, 2, 1], (1, 2, 1)), ((4, 5), (4, 5))])
def test_eos_forms(eos, ids):
    assert parse(eos_token_id=eos).eos_token_ids == ids


@pytest.mark.parametrize("eos", [True, "2", 2.0, [1, True], [1, "2"], [None], {"a": 1}])
def test_eos_not_ints(eos):
    with pytest.raises(CheckpointError, match="eos_token_id must be an int or a list of ints"):
        parse(eos_token_id=eos)


@pytest.mark.parametrize("eos", [97, -1, [0, 97]])
def test_eos_read_outside_the_vocabulary(eos):
    with pytest.raises(CheckpointError, match="outside the vocabulary"):
        parse(eos_token_id=eos)


# ---- Qwen3 sliding-window layers (transformers' Qwen3Config resolution) -----------------------

@pytest.mark.parametrize("keys,slide", [
    ({"use_sliding_window": True, "sliding_window": 16, "max_window_layers": 0}, [0, 1]),
    ({"use_sliding_window": True, "sliding_window": 16, "max_window_layers": 1}, [1]),
    ({"use_sliding_window": True, "max_window_layers": 1}, [1]),
    ({"use_sliding_window": True, "sliding_window": 8,
      "layer_types": ["full_attention", "sliding_attention"]}, [1]),
    ({"use_sliding_window": True, "sliding_window": 8,
      "layer_types": ["sliding_attention", "full_attention"]}, [0]),
])
def test_sliding_layers_refused(keys, slide):
    with pytest.raises(CheckpointError, match=r"sliding-window attention is not supported") as e:
        parse(**keys)
    assert f"layers {slide} slide" in str(e.value)
    assert f"sliding_window={keys.get('sliding_window', 4096)}," in str(e.value)


@pytest.mark.parametrize("keys", [
    {"use_sliding_window": True, "sliding_window": 16, "max_window_layers": 2},
    {"use_sliding_window": True, "sliding_window": None, "max_window_layers": 0},
    {"use_sliding_window": False, "sliding_window": 16, "max_window_layers": 0},
    {"use_sliding_window": True, "sliding_window": 8,
     "layer_types": ["full_attention", "full_attention"]},
    {"use_sliding_window": False, "sliding_window": 8,
     "layer_types": ["sliding_attention", "sliding_attention"]},
    {"use_sliding_window": True, "sliding_window": 16},     # max_window_layers 28 > 2 layers
])
def test_full_attention_accepted(keys):
    assert parse(**keys).num_hidden_layers == 2


# ---- to_dict: what it writes, by hand --------------------------------------------------------

def test_to_dict_qwen3():
    c = parse(eos_token_id=[7, 8], bos_token_id=6, pad_token_id=1, rms_norm_eps=1e-5)
    want = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 97,
            "hidden_size": 64, "intermediate_size": 112, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
            "hidden_act": "silu", "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
            "rope_scaling": c.rope.to_hf_dict(), "max_position_embeddings": 32768,
            "tie_word_embeddings": False, "attention_bias": False, "bos_token_id": 6,
            "eos_token_id": [7, 8], "pad_token_id": 1, "use_sliding_window": False}
    assert c.to_dict() == want
    assert TargetConfig.from_dict(c.to_dict()) == c


def test_to_dict_llama():
    c = parse(model_type="llama", mlp_bias=True, tie_word_embeddings=True)
    d = c.to_dict()
    assert d["architectures"] == ["LlamaForCausalLM"] and d["mlp_bias"] is True
    assert "use_sliding_window" not in d
    assert (d["bos_token_id"], d["eos_token_id"], d["tie_word_embeddings"]) == (1, 2, True)
    assert TargetConfig.from_dict(d) == c


@pytest.mark.parametrize("ids,written", [((), None), ((0,), 0), ((5,), 5), ((0, 5), [0, 5]),
                                         ((1, 2, 3), [1, 2, 3])])
def test_to_dict_eos(ids, written):
    c = build(eos_token_ids=ids)
    assert c.to_dict()["eos_token_id"] == written
    assert TargetConfig.from_dict(c.to_dict()).eos_token_ids == ids
