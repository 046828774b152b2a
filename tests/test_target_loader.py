"""Target config validation, checkpoint loading/saving and their error messages (no transformers needed)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from dflash2rt.errors import CheckpointError, InvalidInputError
from dflash2rt.models.config import TargetConfig
from dflash2rt.models.hf_loader import load_target, load_tokenizer, save_target
from dflash2rt.models.target import TargetModel

BASE = dict(vocab_size=97, hidden_size=64, intermediate_size=112, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16)
ROPES = [None, {"rope_type": "linear", "factor": 2.0},
         {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 16},
         {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256, "beta_fast": 16}]


def _cfg(model_type="qwen3", **extra) -> dict:
    return {"model_type": model_type, **BASE, **extra}


@pytest.fixture
def ckpt(tmp_path):
    torch.manual_seed(0)
    model = TargetModel(TargetConfig.from_dict(_cfg()))
    save_target(model, None, tmp_path)
    return model, tmp_path


def _rewrite(path, edit):
    state = load_file(path / "model.safetensors")
    edit(state)
    save_file(state, path / "model.safetensors")


@pytest.mark.parametrize("model_type", ["qwen3", "llama"])
@pytest.mark.parametrize("rope", ROPES, ids=["default", "linear", "llama3", "yarn"])
def test_config_round_trip(model_type, rope):
    cfg = TargetConfig.from_dict(_cfg(model_type, rope_scaling=rope))
    assert TargetConfig.from_dict(cfg.to_dict()) == cfg
    v5 = _cfg(model_type, rope_parameters={**(rope or {"rope_type": "default"}), "rope_theta": 10000.0})
    assert TargetConfig.from_dict(v5) == cfg


@pytest.mark.parametrize("edit, needle", [
    ({"foo_bar": 1}, "'foo_bar'"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 0}, "sliding-window"),
    ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "'dynamic' is not supported"),
    ({"rope_scaling": {"rope_type": "longrope", "factor": 2.0}}, "'longrope' is not supported"),
    ({"rope_parameters": {"rope_type": "linear", "factor": 2.0, "mrope_section": [1]}},
     "rope_parameters.mrope_section"),
    ({"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
    ({"quantization_config": {"bits": 4}}, "quantization_config"),
    ({"num_key_value_heads": 3}, "num_key_value_heads"),
    ({"model_type": "mistral"}, "'mistral'"),
    ({"hidden_size": None}, "'hidden_size'"),
])
def test_config_errors_name_the_key(edit, needle):
    with pytest.raises(CheckpointError, match=needle.replace("[", r"\[")):
        TargetConfig.from_dict({**_cfg(), **edit})


def test_config_accepts_metadata_and_full_attention_qwen3():
    cfg = TargetConfig.from_dict(_cfg(architectures=["Qwen3ForCausalLM"], torch_dtype="bfloat16",
                                      transformers_version="4.51.0", use_sliding_window=True, sliding_window=8,
                                      max_window_layers=28, eos_token_id=[5, 6]))
    assert cfg.eos_token_ids == (5, 6) and cfg.qk_norm


def test_save_load_round_trip_in_each_dtype(ckpt):
    model, path = ckpt
    for dtype in (torch.float64, torch.bfloat16):
        loaded, cfg = load_target(path, dtype=dtype, tap_layer_ids=(1,))
        assert cfg == model.cfg and loaded.tap_layer_ids == (1,)
        for name, t in model.state_dict().items():
            assert loaded.state_dict()[name].dtype == dtype
            assert torch.equal(loaded.state_dict()[name], t.to(dtype)), name
        assert torch.equal(loaded.rope_inv_freq, model.rope_inv_freq)  # never rounded to the model dtype


def test_tied_and_sharded_checkpoints(tmp_path):
    model = TargetModel(TargetConfig.from_dict(_cfg("llama", tie_word_embeddings=True)))
    save_target(model, None, tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    assert "lm_head.weight" not in state
    (tmp_path / "model.safetensors").unlink()
    names = sorted(state)
    shards = {"a.safetensors": names[: len(names) // 2], "b.safetensors": names[len(names) // 2:]}
    for file, keys in shards.items():
        save_file({k: state[k] for k in keys}, tmp_path / file)
    index = {"weight_map": {k: f for f, keys in shards.items() for k in keys}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    loaded, _ = load_target(tmp_path)
    assert loaded.lm_head.weight is loaded.model.embed_tokens.weight
    assert torch.equal(loaded.model.embed_tokens.weight, model.model.embed_tokens.weight)
    (tmp_path / "b.safetensors").unlink()
    with pytest.raises(CheckpointError, match="b.safetensors"):
        load_target(tmp_path)


def test_missing_tensor(ckpt):
    _, path = ckpt
    _rewrite(path, lambda s: s.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(CheckpointError, match=r"missing tensor model\.layers\.1\.mlp\.up_proj\.weight"):
        load_target(path)


def test_unexpected_tensor(ckpt):
    _, path = ckpt
    _rewrite(path, lambda s: s.update({"model.layers.0.extra.weight": torch.zeros(3)}))
    with pytest.raises(CheckpointError, match=r"unexpected tensor model\.layers\.0\.extra\.weight"):
        load_target(path)


def test_wrong_shape_says_expected_and_got(ckpt):
    _, path = ckpt
    _rewrite(path, lambda s: s.update({"model.layers.0.self_attn.q_norm.weight": torch.ones(15)}))
    with pytest.raises(CheckpointError, match=r"q_norm\.weight has shape \[15\], expected \[16\]"):
        load_target(path)


def test_tied_head_that_differs_is_rejected(tmp_path):
    model = TargetModel(TargetConfig.from_dict(_cfg(tie_word_embeddings=True)))
    save_target(model, None, tmp_path)
    _rewrite(tmp_path, lambda s: s.update({"lm_head.weight": torch.zeros(97, 64)}))
    with pytest.raises(CheckpointError, match="lm_head.weight differs"):
        load_target(tmp_path)


def test_missing_files(ckpt):
    _, path = ckpt
    (path / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="no safetensors files"):
        load_target(path)
    (path / "config.json").unlink()
    with pytest.raises(CheckpointError, match="config.json not found"):
        load_target(path)


def test_unknown_config_key_on_load(ckpt):
    _, path = ckpt
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**cfg, "logit_softcap": 30.0}))
    with pytest.raises(CheckpointError, match="'logit_softcap'"):
        load_target(path)


def test_save_rejects_a_config_of_another_model(ckpt, tmp_path):
    model, _ = ckpt
    with pytest.raises(InvalidInputError, match="different architecture"):
        save_target(model, _cfg(num_hidden_layers=3), tmp_path / "x")


def test_tokenizer(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {"[UNK]": 0, "hello": 1, "world": 2, "</s>": 3}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(CheckpointError, match="tokenizer.json"):
        load_tokenizer(tmp_path / "nowhere")
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 3}))
    assert load_tokenizer(tmp_path).eos_token_ids == (3,)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [3, 2]}))
    wrapped = load_tokenizer(tmp_path)
    assert wrapped.eos_token_ids == (3, 2)
    assert wrapped.encode("hello world") == [1, 2]
    assert wrapped.decode([1, 2]) == "hello world"
