"""How ``dflash2rt inspect`` reads a checkpoint (``dflash2rt.models.inspect_read``) against
answers written out by hand: the format each config declares, the header size at its limits,
sharded and hub checkpoints' tensors (a tensor in two shards, a missing shard, headers read
remotely), the stored dtype, a speculators config's shapes with each fallback, the parameters
of a draft that is not run, and a tokenizer.json's vocabulary and id range."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from dflash2rt.errors import CheckpointError, ModelNotFoundError
from dflash2rt.models import hub
from dflash2rt.models import inspect_read as ir
from dflash2rt.models.hub import Located
from dflash2rt.models.inspection import inspect_models
from dflash2rt.models.inspect_read import (_speculators_shapes, _stored_dtype, detect_format,
                                           draft_part, read_header, tensor_headers,
                                           tokenizer_summary, tokenizer_vocab)
from dflash2rt.synth import synthesize

from tiny_models import MASK, save_pair_dir, target_dict, tiny_pair

INDEX = "model.safetensors.index.json"


@pytest.mark.parametrize("cfg, fmt", [
    ({"speculators_model_type": "eagle3"}, "speculators"),
    ({"speculators_config": {}}, "speculators"),
    ({"speculators_config": {}, "architectures": ["DFlashDraftModel"]}, "speculators"),
    ({"architectures": ["DFlashDraftModel"]}, "dflash"),
    ({"architectures": ["DFlashDraftModel"], "dflash_config": {}}, "dflash"),
    ({"architectures": ["DFlash2DraftModel"]}, "dflash2"),
    ({"architectures": ["Qwen3ForCausalLM"], "dflash_config": {}}, "dflash2"),
    ({"architectures": [], "dflash_config": {}}, "dflash2"),
    ({"architectures": None}, "target"),
    ({"architectures": ["Qwen3ForCausalLM", "DFlashDraftModel"]}, "target"),
    ({}, "target")])
def test_detect_format(cfg, fmt):
    assert detect_format(cfg) == fmt


def _raw_file(path, header_size: int, body: bytes):
    path.write_bytes(header_size.to_bytes(8, "little") + body)
    return path


def test_the_header_size_limits(tmp_path):
    assert read_header(_raw_file(tmp_path / "a.safetensors", 2, b"{}")) == {}
    limit = 100 * 2**20                         # a size is read up to the end of a short file
    assert read_header(_raw_file(tmp_path / "b.safetensors", limit, b"{}")) == {}
    with pytest.raises(CheckpointError, match=r"not a safetensors file \(header size "
                                              f"{limit + 1}\\)"):
        read_header(_raw_file(tmp_path / "c.safetensors", limit + 1, b"{}"))
    with pytest.raises(CheckpointError, match=r"not a safetensors file \(header size 0\)"):
        read_header(_raw_file(tmp_path / "d.safetensors", 0, b""))


def _save(path, shapes: dict, dtype=torch.bfloat16):
    save_file({n: torch.zeros(s, dtype=dtype) for n, s in shapes.items()}, str(path))


def _sharded(tmp_path, weight_map: dict):
    (tmp_path / INDEX).write_text(json.dumps({"weight_map": weight_map}))
    return Located(path=tmp_path, source=str(tmp_path))


def test_shards_of_an_index(tmp_path):
    _save(tmp_path / "b.safetensors", {"x": (2, 3)})
    _save(tmp_path / "a.safetensors", {"y": (4,), "z": ()}, torch.float16)
    loc = _sharded(tmp_path, {"x": "b.safetensors", "y": "a.safetensors",
                              "z": "a.safetensors"})
    found = tensor_headers(loc)
    assert found == {"y": (ir.Path("a.safetensors"), (4,), "F16"),
                     "z": (ir.Path("a.safetensors"), (), "F16"),
                     "x": (ir.Path("b.safetensors"), (2, 3), "BF16")}
    assert list(found) == ["y", "z", "x"]                          # shards in name order


def test_a_tensor_in_two_shards_or_a_shard_missing(tmp_path):
    _save(tmp_path / "a.safetensors", {"x": (2,)})
    _save(tmp_path / "b.safetensors", {"x": (2,)})
    with pytest.raises(CheckpointError, match="^tensor x appears in both a.safetensors and "
                                              "b.safetensors$"):
        tensor_headers(_sharded(tmp_path, {"x": "a.safetensors", "w": "b.safetensors"}))
    with pytest.raises(CheckpointError, match="names shard c.safetensors, which does not exist"):
        tensor_headers(_sharded(tmp_path, {"x": "a.safetensors", "w": "c.safetensors"}))
    with pytest.raises(CheckpointError, match=f"{INDEX}: no weight_map$"):
        tensor_headers(_sharded(tmp_path, ["a.safetensors"]))


def test_a_local_directory_without_safetensors(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(CheckpointError, match="no safetensors files"):
        tensor_headers(Located(path=tmp_path, source=str(tmp_path)))


def _hub_loc(tmp_path) -> Located:
    snap = tmp_path / "snapshots" / ("c" * 40)
    snap.mkdir(parents=True)
    (snap / "config.json").write_text("{}")
    return Located(path=snap, source="org/m", repo_id="org/m", snapshot=snap)


def test_hub_headers_offline_and_online(tmp_path, monkeypatch):
    loc = _hub_loc(tmp_path)
    monkeypatch.setattr(hub, "offline", lambda: True)
    with pytest.raises(ModelNotFoundError, match="incomplete.*model.safetensors missing"):
        tensor_headers(loc)
    (loc.path / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(CheckpointError, match="pickle checkpoints"):
        tensor_headers(loc)
    asked = []
    monkeypatch.setattr(hub, "offline", lambda: False)
    monkeypatch.setattr(hub, "file_headers", lambda repo, name, commit: asked.append(
        (repo, name, commit)) or {"w": ((3, 2), "F32")})
    assert tensor_headers(loc) == {"w": (ir.Path("model.safetensors"), (3, 2), "F32")}
    assert asked == [("org/m", "model.safetensors", "c" * 40)]


def test_a_sharded_hub_checkpoint_offline_names_the_missing_shard(tmp_path, monkeypatch):
    loc = _hub_loc(tmp_path)
    (loc.path / INDEX).write_text(json.dumps({"weight_map": {"x": "s1.safetensors"}}))
    monkeypatch.setattr(hub, "offline", lambda: True)
    with pytest.raises(ModelNotFoundError, match=r"s1\.safetensors missing\), and "
                                                 "HF_HUB_OFFLINE is set"):
        tensor_headers(loc)


def test_the_stored_dtype_is_the_most_common():
    p = ir.Path("m.safetensors")
    assert _stored_dtype({}) == "none"
    assert _stored_dtype({"a": (p, (1,), "F32"), "b": (p, (1,), "BF16"),
                          "c": (p, (1,), "BF16")}) == "BF16"
    assert _stored_dtype({"a": (p, (1,), "I64")}) == "I64"


def test_speculators_shapes_as_declared():
    raw = {"speculators_model_type": "eagle3", "target_hidden_size": 64,
           "draft_vocab_size": 40, "eagle_aux_hidden_state_layer_ids": (1, 2),
           "aux_hidden_state_layer_ids": [9], "num_target_layers": 4, "mask_token_id": 7,
           "transformer_layer_config": {"num_hidden_layers": 1, "hidden_size": 32,
                                        "num_attention_heads": 4, "num_key_value_heads": 2,
                                        "head_dim": 8, "intermediate_size": 72,
                                        "vocab_size": 61},
           "speculators_config": {"algorithm": "other", "default_proposal_method": "b",
                                  "proposal_methods": [
                                      {"proposal_type": "a", "speculative_tokens": 2},
                                      {"proposal_type": "b", "speculative_tokens": 5}],
                                  "verifier": {"name_or_path": "org/t"}}}
    assert _speculators_shapes(raw) == {
        "algorithm": "eagle3", "verifier": "org/t", "layers": 1, "hidden": 64,
        "draft_hidden": 32, "heads": 4, "kv_heads": 2, "head_dim": 8, "intermediate": 72,
        "vocab": 61, "draft_vocab": 40, "block_size": 6, "tap_layers": [1, 2],
        "num_target_layers": 4, "mask_token_id": 7}


def test_speculators_shapes_fallbacks():
    assert _speculators_shapes({}) == {
        "algorithm": None, "verifier": None, "layers": None, "hidden": None,
        "draft_hidden": None, "heads": None, "kv_heads": None, "head_dim": None,
        "intermediate": None, "vocab": None, "draft_vocab": None, "block_size": None,
        "tap_layers": None, "num_target_layers": None, "mask_token_id": None}
    raw = {"vocab_size": 50, "aux_hidden_state_layer_ids": [3],
           "transformer_layer_config": {"hidden_size": 16, "num_attention_heads": 2},
           "speculators_config": {"algorithm": "eagle", "default_proposal_method": "zzz",
                                  "proposal_methods": [
                                      {"proposal_type": "a", "speculative_tokens": 2},
                                      {"proposal_type": "b", "speculative_tokens": 5}]}}
    s = _speculators_shapes(raw)
    assert (s["algorithm"], s["hidden"], s["draft_hidden"], s["heads"], s["kv_heads"],
            s["vocab"], s["draft_vocab"], s["block_size"], s["tap_layers"]) == (
        "eagle", 16, 16, 2, 2, 50, 50, 3, [3])
    assert _speculators_shapes({"target_layer_ids": [0], "block_size": 9,
                                "speculators_config": {"proposal_methods": [
                                    {"speculative_tokens": 2}]}})["block_size"] == 9
    assert _speculators_shapes({"target_layer_ids": [0, 4]})["tap_layers"] == [0, 4]
    assert _speculators_shapes({"dflash_config": {"target_layer_ids": [5]}})[
        "tap_layers"] == [5]
    assert _speculators_shapes({"target_layer_ids": [], "speculators_config": {
        "proposal_methods": [{"speculative_tokens": 0}]}})[
        "tap_layers"] is None
    assert _speculators_shapes({"speculators_config": {"proposal_methods": [
        {"speculative_tokens": 0}]}})["block_size"] is None


def test_a_draft_that_is_not_run_counts_its_tensors_without_the_mapping(tmp_path):
    tl = target_dict("llama", 61, 32, 1)
    raw = {"speculators_model_type": "eagle3", "draft_vocab_size": 40,
           "transformer_layer_config": tl, "speculators_config": {"algorithm": "eagle3"}}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    save_file({"fc.weight": torch.zeros(32, 96), "lm_head.weight": torch.zeros(40, 32),
               "norm.weight": torch.zeros(32, dtype=torch.bfloat16),
               "d2t": torch.zeros(40, dtype=torch.int64),
               "t2d": torch.zeros(61, dtype=torch.bool)}, str(tmp_path / "model.safetensors"))
    part, cfg = draft_part(Located(path=tmp_path, source="here"), raw)
    assert cfg is None
    assert part["parameters"] == 32 * 96 + 40 * 32 + 32
    assert part["vocab_mapping"] == {"d2t": [40], "t2d": [61]}
    assert part["stored_dtype"] == "F32" and part["format"] == "speculators"
    assert (part["source"], part["path"], part["revision"], part["commit"]) == (
        "here", str(tmp_path), None, None)
    assert (part["draft_vocab"], part["vocab"], part["tokenizer"]) == (40, 61, None)


def _tok(tmp_path, data) -> object:
    (tmp_path / "tokenizer.json").write_text(json.dumps(data))
    return tmp_path


def test_tokenizer_vocabularies():
    assert tokenizer_vocab({}) == {}
    assert tokenizer_vocab({"model": {"vocab": {"a": 0, "b": 5}}}) == {"a": 0, "b": 5}
    assert tokenizer_vocab({"model": {"vocab": [["x", -1.0], ["y", -2.0], ["z", 0.0]]}}) == {
        "x": 0, "y": 1, "z": 2}
    added = [{"content": "<s>", "id": 9}, {"content": "a", "id": 7}, {"id": 3},
             {"content": "q"}, "junk"]
    assert tokenizer_vocab({"model": {"vocab": {"a": 0, "b": 1}}, "added_tokens": added}) == {
        "a": 7, "b": 1, "<s>": 9}


def test_tokenizer_summaries(tmp_path):
    assert tokenizer_summary(tmp_path) is None
    d = _tok(tmp_path, {"model": {"vocab": {"a": 0, "b": 4, "c": 4}},
                        "added_tokens": [{"content": "<e>", "id": 2}]})
    assert tokenizer_summary(d) == {"tokens": 3, "max_id": 4,
                                    "file": str(tmp_path / "tokenizer.json")}
    assert tokenizer_summary(_tok(tmp_path, {"model": {}})) == {
        "tokens": 0, "max_id": -1, "file": str(tmp_path / "tokenizer.json")}


def _numel(directory) -> int:
    """Elements of every tensor in ``directory``'s safetensors files (safetensors' own reader)."""
    from safetensors import safe_open

    n = 0
    for file in directory.glob("*.safetensors"):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                size = 1
                for s in f.get_slice(name).get_shape():
                    size *= s
                n += size
    return n


@pytest.mark.parametrize("variant", ["dflash2", "dflash1"])
def test_a_native_draft_described(tmp_path, variant):
    root = save_pair_dir(tmp_path, tiny_pair(variant, dtype=torch.float32), with_tokenizer=False)
    raw = json.loads((root / "draft/config.json").read_text())
    part, cfg = draft_part(Located(path=root / "draft", source="d"), raw)
    want = {"source": "d", "path": str(root / "draft"), "revision": None, "commit": None,
            "format": "dflash2" if variant == "dflash2" else "dflash", "vocab_mapping": None,
            "stored_dtype": "F32", "eos_token_id": raw.get("eos_token_id"),
            "bos_token_id": raw.get("bos_token_id"), "tokenizer": None, "layers": 2,
            "hidden": 32, "heads": 4, "kv_heads": 2, "head_dim": 8, "intermediate": 72,
            "vocab": 61, "draft_vocab": 61, "block_size": 8, "tap_layers": [0, 2],
            "num_target_layers": cfg.num_target_layers, "mask_token_id": MASK,
            "sliding_windows": [None, None], "causal_layers": [False, False],
            "own_embedding": False, "own_head": False, "parameters": _numel(root / "draft")}
    if variant == "dflash2":
        want.update(selector_rank=6, selector_top_k=4, conv_kernel_size=3)
    assert part == want


def test_a_reduced_speculators_dflash_draft_described(tmp_path):
    synthesize("toy-llama3", tmp_path, seed=2, layers=2, draft_layers=1,
               draft_format="speculators", layout="dflash", draft_vocab=300)
    raw = json.loads((tmp_path / "draft/config.json").read_text())
    r = inspect_models(tmp_path)
    d = r.draft
    assert (d["format"], d["algorithm"], d["vocab"], d["draft_vocab"]) == (
        "speculators", "dflash", 1256, 300)
    assert d["vocab_mapping"] == {"d2t": [300], "t2d": [1256]}
    assert d["tap_layers"] == [a - 1 for a in raw["aux_hidden_state_layer_ids"]]
    assert d["parameters"] == _numel(tmp_path / "draft")
    assert r.runnable is True and not r.problems


@pytest.mark.parametrize("raw", [
    {"speculators_config": ["x"]}, {"transformer_layer_config": "x"},
    {"speculators_config": {"proposal_methods": ["greedy"]}},
    {"speculators_config": {"proposal_methods": {"greedy": {}}}},
    {"speculators_config": {"proposal_methods": [{"speculative_tokens": "3"}]}},
    {"speculators_config": {"verifier": "org/t"}}, {"target_layer_ids": 5}])
def test_a_malformed_speculators_config_is_a_checkpoint_error(raw):
    with pytest.raises(CheckpointError, match=r"^malformed speculators config \(.*\): "
                                              "speculators_config, transformer_layer_config"):
        _speculators_shapes(raw)


@pytest.mark.parametrize("data", [
    {"model": [1]}, {"model": {"vocab": {"a": "x"}}}, {"model": {"vocab": [5]}},
    {"model": {"vocab": [[]]}}, {"added_tokens": [{"content": "a", "id": "q"}]},
    {"added_tokens": 5}])
def test_a_malformed_tokenizer_json_is_a_checkpoint_error(tmp_path, data):
    _tok(tmp_path, data)
    with pytest.raises(CheckpointError, match=r"tokenizer\.json: malformed tokenizer\.json "
                                              r"vocabulary \("):
        tokenizer_summary(tmp_path)


def test_a_deeply_nested_header_is_a_checkpoint_error(tmp_path):
    raw = b"[" * 100_000 + b"]" * 100_000
    with pytest.raises(CheckpointError, match="cannot read the safetensors header"):
        read_header(_raw_file(tmp_path / "deep.safetensors", len(raw), raw))
