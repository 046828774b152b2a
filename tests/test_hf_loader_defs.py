"""Checkpoint loading against hand-written tensor lists, file layouts and messages."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from dflash2rt.errors import CheckpointError, InvalidInputError, ResourceError
from dflash2rt.models import hf_loader, memory
from dflash2rt.models.config import TargetConfig
from dflash2rt.models.target import TargetModel

V, H, I, NH, NKV, HD, L = 11, 8, 12, 2, 1, 4, 2


def _cfg(model_type="qwen3", **extra) -> dict:
    return {"model_type": model_type, "vocab_size": V, "hidden_size": H, "intermediate_size": I,
            "num_hidden_layers": L, "num_attention_heads": NH, "num_key_value_heads": NKV,
            "head_dim": HD, **extra}


def _hand_tensors(model_type: str, tied: bool) -> dict[str, tuple[int, ...]]:
    """What a Hugging Face Qwen3 / Llama checkpoint stores, written out name by name."""
    out = {"model.embed_tokens.weight": (V, H), "model.norm.weight": (H,)}
    for i in range(L):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = (H,)
        out[p + "post_attention_layernorm.weight"] = (H,)
        out[p + "self_attn.q_proj.weight"] = (NH * HD, H)
        out[p + "self_attn.k_proj.weight"] = (NKV * HD, H)
        out[p + "self_attn.v_proj.weight"] = (NKV * HD, H)
        out[p + "self_attn.o_proj.weight"] = (H, NH * HD)
        if model_type == "qwen3":
            out[p + "self_attn.q_norm.weight"] = (HD,)
            out[p + "self_attn.k_norm.weight"] = (HD,)
        out[p + "mlp.gate_proj.weight"] = (I, H)
        out[p + "mlp.up_proj.weight"] = (I, H)
        out[p + "mlp.down_proj.weight"] = (H, I)
    if not tied:
        out["lm_head.weight"] = (V, H)
    return out


def _model(tied=False, model_type="qwen3", seed=0) -> TargetModel:
    torch.manual_seed(seed)
    return TargetModel(TargetConfig.from_dict(_cfg(model_type, tie_word_embeddings=tied)))


def _save(path: Path, tied=False) -> TargetModel:
    model = _model(tied)
    hf_loader.save_target(model, None, path)
    return model


def _rewrite(path: Path, edit) -> None:
    state = load_file(path / "model.safetensors")
    edit(state)
    save_file(state, path / "model.safetensors")


# ---------------------------------------------------------------- the tensors a checkpoint stores

@pytest.mark.parametrize("model_type", ["qwen3", "llama"])
@pytest.mark.parametrize("tied", [False, True])
def test_target_tensors_are_the_hand_list(model_type, tied):
    cfg = TargetConfig.from_dict(_cfg(model_type, tie_word_embeddings=tied))
    assert hf_loader.target_tensors(cfg) == _hand_tensors(model_type, tied)
    model = TargetModel(cfg)
    assert hf_loader.stored_shapes(model, cfg) == _hand_tensors(model_type, tied)


@pytest.mark.parametrize("tied", [False, True])
def test_saved_file_holds_the_hand_list_and_config(tmp_path, tied):
    model = _save(tmp_path, tied)
    state = load_file(tmp_path / "model.safetensors")
    assert {n: tuple(t.shape) for n, t in state.items()} == _hand_tensors("qwen3", tied)
    for name, t in state.items():
        assert torch.equal(t, model.state_dict()[name]), name
    text = (tmp_path / "config.json").read_text(encoding="utf-8")
    assert text == json.dumps(model.cfg.to_dict(), indent=2, sort_keys=True) + "\n"
    from safetensors import safe_open
    with safe_open(str(tmp_path / "model.safetensors"), framework="pt") as f:
        assert f.metadata() == {"format": "pt"}


def test_save_writes_the_given_config_dict_as_is(tmp_path):
    model = _model()
    given = {**_cfg(), "architectures": ["Qwen3ForCausalLM"], "torch_dtype": "float32"}
    out = hf_loader.save_target(model, given, tmp_path / "a" / "b")
    assert out == tmp_path / "a" / "b"
    assert json.loads((out / "config.json").read_text()) == given
    assert hf_loader.read_config(out) == given
    with pytest.raises(InvalidInputError, match="different architecture"):
        hf_loader.save_target(model, {**_cfg(), "vocab_size": V + 1}, tmp_path / "c")
    assert not (tmp_path / "c").exists()


# ---------------------------------------------------------------- config.json

def test_read_config_each_failure(tmp_path):
    with pytest.raises(CheckpointError, match="config.json not found"):
        hf_loader.read_config(tmp_path)
    (tmp_path / "config.json").mkdir()                      # a directory is not the file
    with pytest.raises(CheckpointError, match="config.json not found"):
        hf_loader.read_config(tmp_path)
    (tmp_path / "config.json").rmdir()
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(CheckpointError, match="must hold a JSON object"):
        hf_loader.read_config(tmp_path)
    (tmp_path / "config.json").write_text("{")
    with pytest.raises(CheckpointError, match="cannot read"):
        hf_loader.read_config(tmp_path)
    (tmp_path / "config.json").write_text('{"a": 1}')
    assert hf_loader.read_config(str(tmp_path)) == {"a": 1}


# ---------------------------------------------------------------- which files hold the tensors

def _touch(path: Path, *names: str) -> None:
    for name in names:
        (path / name).write_bytes(b"")


def test_single_file_wins_over_an_index(tmp_path):
    _touch(tmp_path, "model.safetensors", "x.safetensors")
    (tmp_path / "model.safetensors.index.json").write_text('{"weight_map": {"a": "x.safetensors"}}')
    assert hf_loader.tensor_files(tmp_path) == [tmp_path / "model.safetensors"]


def test_index_shards_are_sorted_and_named_once(tmp_path):
    _touch(tmp_path, "b.safetensors", "a.safetensors", "c.safetensors")
    wm = {"t1": "c.safetensors", "t2": "a.safetensors", "t3": "c.safetensors",
          "t4": "a.safetensors"}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))
    assert hf_loader.tensor_files(tmp_path) == [tmp_path / "a.safetensors",
                                                tmp_path / "c.safetensors"]


def test_an_index_naming_a_missing_shard(tmp_path):
    _touch(tmp_path, "a.safetensors")
    (tmp_path / "z.safetensors").mkdir()                    # a directory is no shard
    wm = {"t1": "a.safetensors", "t2": "z.safetensors"}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))
    with pytest.raises(CheckpointError, match=r"names shard z\.safetensors, which does not exist"):
        hf_loader.tensor_files(tmp_path)


@pytest.mark.parametrize("text", [
    "{", '{"metadata": {}}', "[1]", '"weight_map"', '{"weight_map": ["a.safetensors"]}',
    '{"weight_map": "a.safetensors"}', '{"weight_map": {"t": 5}}', '{"weight_map": {"t": ["a"]}}',
    '{"weight_map": {"t": null}}', '{"weight_map": null}',
])
def test_an_unreadable_index_is_a_checkpoint_error(tmp_path, text):
    _touch(tmp_path, "a.safetensors")
    (tmp_path / "model.safetensors.index.json").write_text(text)
    with pytest.raises(CheckpointError, match="model.safetensors.index.json"):
        hf_loader.tensor_files(tmp_path)


@pytest.mark.parametrize("names, hint", [
    ((), ""),
    (("notes.txt",), ""),
    (("x.safetensors",), " (found ['x.safetensors'] but no model.safetensors.index.json)"),
    (("b.safetensors", "a.safetensors", "pytorch_model.bin"),
     " (found ['a.safetensors', 'b.safetensors'] but no model.safetensors.index.json)"),
    (("pytorch_model.bin",), " (pickle checkpoints such as *.bin / *.pt are never loaded; "
                             "convert them to safetensors)"),
    (("model.pt",), " (pickle checkpoints such as *.bin / *.pt are never loaded; "
                    "convert them to safetensors)"),
])
def test_no_safetensors_message_and_its_hint(tmp_path, names, hint):
    _touch(tmp_path, *names)
    want = (f"{tmp_path}: no safetensors files: expected model.safetensors or "
            f"model.safetensors.index.json{hint}")
    with pytest.raises(CheckpointError) as info:
        hf_loader.tensor_files(tmp_path)
    assert str(info.value) == want


# ---------------------------------------------------------------- headers

def test_scan_reads_names_shapes_dtypes_and_files(tmp_path):
    save_file({"a": torch.zeros(2, 3), "b": torch.zeros(5, dtype=torch.bfloat16)},
              tmp_path / "x.safetensors")
    save_file({"c": torch.zeros((), dtype=torch.float16), "d": torch.zeros(1, 0, 4,
                                                                            dtype=torch.int64)},
              tmp_path / "y.safetensors")
    files = [tmp_path / "x.safetensors", tmp_path / "y.safetensors"]
    assert hf_loader.scan_tensors(files) == {
        "a": (files[0], (2, 3), "F32"), "b": (files[0], (5,), "BF16"),
        "c": (files[1], (), "F16"), "d": (files[1], (1, 0, 4), "I64")}
    assert hf_loader.scan_tensors([]) == {}


def test_scan_refuses_a_tensor_in_two_files(tmp_path):
    save_file({"a": torch.zeros(2), "b": torch.zeros(1)}, tmp_path / "x.safetensors")
    save_file({"c": torch.zeros(2), "b": torch.zeros(1)}, tmp_path / "y.safetensors")
    with pytest.raises(CheckpointError) as info:
        hf_loader.scan_tensors([tmp_path / "x.safetensors", tmp_path / "y.safetensors"])
    assert str(info.value) == "tensor b appears in both x.safetensors and y.safetensors"


@pytest.mark.parametrize("data", [b"", b"\x08\x00\x00\x00\x00\x00\x00\x00{}", b"garbage!" * 4])
def test_scan_names_a_corrupt_file(tmp_path, data):
    (tmp_path / "x.safetensors").write_bytes(data)
    with pytest.raises(CheckpointError, match=r"cannot read .*x\.safetensors"):
        hf_loader.scan_tensors([tmp_path / "x.safetensors"])


# ---------------------------------------------------------------- each name check alone

def _found(shapes: dict[str, tuple[int, ...]], dtype="F32", file="m.safetensors") -> dict:
    return {n: (Path("/ck") / file, s, dtype) for n, s in shapes.items()}


@pytest.mark.parametrize("tied", [False, True])
def test_names_a_good_checkpoint_passes(tied):
    cfg = TargetConfig.from_dict(_cfg(tie_word_embeddings=tied))
    hand = _hand_tensors("qwen3", tied)
    hf_loader.check_tensor_names(hand, _found(hand), cfg)
    for dt in ("F64", "F32", "F16", "BF16"):
        hf_loader.check_tensor_names(hand, _found(hand, dt), cfg)


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("dtype", ["I64", "I32", "I8", "U8", "BOOL", "F8_E4M3", "F8_E5M2", "f32"])
def test_names_a_non_float_tensor_alone(dtype, tied):
    cfg = TargetConfig.from_dict(_cfg(tie_word_embeddings=tied))
    hand = _hand_tensors("qwen3", tied)
    found = _found(hand)
    name = "model.layers.1.mlp.up_proj.weight"
    found[name] = (found[name][0], found[name][1], dtype)
    with pytest.raises(CheckpointError) as info:
        hf_loader.check_tensor_names(hand, found, cfg)
    assert str(info.value) == (f"tensor {name} has dtype {dtype}; only float checkpoints are "
                               "supported")


@pytest.mark.parametrize("tied", [False, True])
def test_names_a_wrong_shape_alone(tied):
    cfg = TargetConfig.from_dict(_cfg(tie_word_embeddings=tied))
    hand = _hand_tensors("qwen3", tied)
    for name, shape in hand.items():
        bad = shape[:-1] + (shape[-1] + 1,)
        found = _found({**hand, name: bad})
        with pytest.raises(CheckpointError) as info:
            hf_loader.check_tensor_names(hand, found, cfg)
        assert str(info.value) == (f"tensor {name} has shape {list(bad)}, expected "
                                   f"{list(shape)}")


def test_names_a_missing_tensor_alone():
    cfg = TargetConfig.from_dict(_cfg())
    hand = _hand_tensors("qwen3", False)
    for name in hand:
        found = _found({n: s for n, s in hand.items() if n != name})
        with pytest.raises(CheckpointError) as info:
            hf_loader.check_tensor_names(hand, found, cfg)
        assert str(info.value) == (f"missing tensor {name} (a qwen3 checkpoint must contain "
                                   "it)")


@pytest.mark.parametrize("tied", [False, True])
def test_names_an_unexpected_tensor_alone(tied):
    cfg = TargetConfig.from_dict(_cfg("llama", tie_word_embeddings=tied))
    hand = _hand_tensors("llama", tied)
    name = "model.layers.0.self_attn.q_norm.weight"          # Qwen3's, not Llama's
    found = _found({**hand, name: (HD,)}, file="s2.safetensors")
    with pytest.raises(CheckpointError) as info:
        hf_loader.check_tensor_names(hand, found, cfg)
    assert str(info.value) == (f"unexpected tensor {name} in s2.safetensors (not part of a llama "
                               "model)")


def test_names_the_first_in_sorted_order_then_missing_ones():
    cfg = TargetConfig.from_dict(_cfg())
    hand = _hand_tensors("qwen3", False)
    found = _found({n: s for n, s in hand.items() if n != "model.norm.weight"})
    found["model.layers.1.zz.weight"] = (Path("/ck/m.safetensors"), (1,), "I64")
    found["model.layers.0.aa.weight"] = (Path("/ck/m.safetensors"), (1,), "F32")
    with pytest.raises(CheckpointError, match=r"unexpected tensor model\.layers\.0\.aa\.weight"):
        hf_loader.check_tensor_names(hand, found, cfg)
    del found["model.layers.0.aa.weight"], found["model.layers.1.zz.weight"]
    with pytest.raises(CheckpointError, match=r"^missing tensor model\.norm\.weight"):
        hf_loader.check_tensor_names(hand, found, cfg)


def test_ignored_suffix_and_tied_head_are_skipped_only_there():
    tied = TargetConfig.from_dict(_cfg(tie_word_embeddings=True))
    untied = TargetConfig.from_dict(_cfg())
    extra = {"model.layers.0.self_attn.rotary_emb.inv_freq": (HD // 2,)}
    hand_t = _hand_tensors("qwen3", True)
    hf_loader.check_tensor_names(hand_t, _found({**hand_t, **extra}), tied)
    found = _found({**hand_t, **extra})
    found["model.layers.0.self_attn.rotary_emb.inv_freq"] = (Path("/ck/m"), (3,), "I64")
    found["lm_head.weight"] = (Path("/ck/m"), (V + 1, H), "I64")   # checked after loading
    hf_loader.check_tensor_names(hand_t, found, tied)
    hand_u = _hand_tensors("qwen3", False)
    bad = _found({**hand_u, "lm_head.weight": (V + 1, H)})
    with pytest.raises(CheckpointError, match=r"tensor lm_head\.weight has shape"):
        hf_loader.check_tensor_names(hand_u, bad, untied)
    near = _found({**hand_u, "model.rotary_emb.inv_freq_": (1,)})    # not the suffix
    with pytest.raises(CheckpointError, match="unexpected tensor model.rotary_emb.inv_freq_"):
        hf_loader.check_tensor_names(hand_u, near, untied)


# ---------------------------------------------------------------- the memory check

@pytest.fixture
def free_bytes(monkeypatch):
    box = {"free": None}
    monkeypatch.setattr(memory, "available_bytes", lambda device: box["free"])
    monkeypatch.setattr(memory, "NOTES", {})
    return box


SHAPES = {"a": (10**9, 3), "b": (250_000_000, 2), "c": (5 * 10**8,)}     # 4.00e9 parameters


@pytest.mark.parametrize("dtype, size, name", [(torch.float32, 4, "float32"),
                                                (torch.float64, 8, "float64")])
def test_weights_fit_wide_dtypes_suggest_bfloat16(free_bytes, dtype, size, name):
    need = 4 * 10**9 * size
    free_bytes["free"] = need
    hf_loader.check_weights_fit(SHAPES, dtype, "cpu", "the target at /x")       # exactly fits
    free_bytes["free"] = need - 1
    with pytest.raises(ResourceError) as info:
        hf_loader.check_weights_fit(SHAPES, dtype, "cpu", "the target at /x")
    assert str(info.value) == (
        f"the target at /x (4.00B parameters in {name}) needs {need / 1e9:.2f} GB but only "
        f"{(need - 1) / 1e9:.2f} GB are available on cpu; lower the dtype (in bfloat16 they "
        "need 8.00 GB) or use a device with more memory")


@pytest.mark.parametrize("dtype, name", [(torch.bfloat16, "bfloat16"),
                                         (torch.float16, "float16")])
def test_weights_fit_16_bit_only_more_memory(free_bytes, dtype, name):
    free_bytes["free"] = 8 * 10**9
    hf_loader.check_weights_fit(SHAPES, dtype, "cpu", "w")
    free_bytes["free"] = 7 * 10**9
    with pytest.raises(ResourceError) as info:
        hf_loader.check_weights_fit(SHAPES, dtype, "cpu", "w")
    assert str(info.value) == (f"w (4.00B parameters in {name}) needs 8.00 GB but only 7.00 GB "
                               "are available on cpu; use a device with more memory")


def test_weights_fit_counts_every_element(free_bytes):
    shapes = {"a": (3, 5), "b": (7,), "c": (), "d": (2, 0, 9)}     # 15 + 7 + 1 + 0 elements
    free_bytes["free"] = 23 * 4
    hf_loader.check_weights_fit(shapes, torch.float32, "cpu", "w")
    free_bytes["free"] = 23 * 4 - 1
    with pytest.raises(ResourceError):
        hf_loader.check_weights_fit(shapes, torch.float32, "cpu", "w")
    free_bytes["free"] = None                                         # not checked
    hf_loader.check_weights_fit(SHAPES, torch.float64, "cpu", "w")


def test_load_checks_memory_before_reading_a_tensor(tmp_path, free_bytes, monkeypatch):
    _save(tmp_path)
    n = sum(_prod(s) for s in _hand_tensors("qwen3", False).values())
    free_bytes["free"] = n * 8 - 1
    with pytest.raises(ResourceError, match=rf"the target at {tmp_path} \("):
        hf_loader.load_target(tmp_path, dtype=torch.float64)
    free_bytes["free"] = n * 8
    hf_loader.load_target(tmp_path, dtype=torch.float64)


def _prod(shape):
    out = 1
    for d in shape:
        out *= d
    return out


# ---------------------------------------------------------------- whole loads

def test_load_untied_keeps_a_separate_head(tmp_path):
    model = _save(tmp_path)
    loaded, cfg = hf_loader.load_target(tmp_path, dtype=torch.float64)
    assert cfg == model.cfg and loaded.source_dir == str(tmp_path)
    assert not loaded.training
    assert loaded.lm_head.weight is not loaded.model.embed_tokens.weight
    params = dict(loaded.named_parameters())
    assert params and not any(p.requires_grad for p in params.values())
    for name, t in loaded.state_dict().items():
        if name in _hand_tensors("qwen3", False):
            assert t.dtype == torch.float64
            assert torch.equal(t, model.state_dict()[name].double()), name


def test_load_tied_with_a_stored_equal_head(tmp_path):
    model = _save(tmp_path, tied=True)
    emb = model.model.embed_tokens.weight.detach().clone()
    _rewrite(tmp_path, lambda s: s.update({"lm_head.weight": emb.clone()}))
    loaded, _ = hf_loader.load_target(tmp_path)
    assert loaded.lm_head.weight is loaded.model.embed_tokens.weight
    assert torch.equal(loaded.lm_head.weight, emb)


def test_load_tied_head_one_element_off(tmp_path):
    model = _save(tmp_path, tied=True)
    head = model.model.embed_tokens.weight.detach().clone()
    head[V - 1, H - 1] += 1.0
    _rewrite(tmp_path, lambda s: s.update({"lm_head.weight": head}))
    with pytest.raises(CheckpointError, match="lm_head.weight differs"):
        hf_loader.load_target(tmp_path)


def test_load_skips_an_ignored_tensor_and_reads_half_types(tmp_path):
    model = _save(tmp_path)

    def edit(s):
        s["model.layers.1.self_attn.rotary_emb.inv_freq"] = torch.ones(HD // 2)
        s["model.norm.weight"] = s["model.norm.weight"].to(torch.bfloat16)
    _rewrite(tmp_path, edit)
    loaded, _ = hf_loader.load_target(tmp_path)
    want = model.model.norm.weight.detach().to(torch.bfloat16).float()
    assert torch.equal(loaded.model.norm.weight, want)
    assert loaded.model.norm.weight.dtype == torch.float32


def test_load_refuses_an_integer_tensor(tmp_path):
    _save(tmp_path)
    _rewrite(tmp_path, lambda s: s.update({"model.norm.weight": torch.ones(H, dtype=torch.int64)}))
    with pytest.raises(CheckpointError, match=r"model\.norm\.weight has dtype I64"):
        hf_loader.load_target(tmp_path)


def test_load_tied_sharded_reads_the_head_from_its_own_shard(tmp_path):
    model = _save(tmp_path, tied=True)
    state = load_file(tmp_path / "model.safetensors")
    (tmp_path / "model.safetensors").unlink()
    save_file({"lm_head.weight": state["model.embed_tokens.weight"].clone()},
              tmp_path / "head.safetensors")
    save_file(state, tmp_path / "rest.safetensors")
    wm = {n: "rest.safetensors" for n in state} | {"lm_head.weight": "head.safetensors"}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))
    loaded, _ = hf_loader.load_target(tmp_path)
    assert torch.equal(loaded.lm_head.weight, model.model.embed_tokens.weight)
    bad = state["model.embed_tokens.weight"].clone()
    bad[0, 0] -= 1.0
    save_file({"lm_head.weight": bad}, tmp_path / "head.safetensors")
    with pytest.raises(CheckpointError, match="lm_head.weight differs"):
        hf_loader.load_target(tmp_path)
