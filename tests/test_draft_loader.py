"""The published DFlash2 draft format: config and tensor names, round trips, and refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from dflash2rt.errors import CheckpointError
from dflash2rt.models.draft_config import DraftConfig
from dflash2rt.models.draft_loader import expected_tensors, load_draft, save_draft
from dflash2rt.models.hf_loader import save_target
from dflash2rt.models.pair import load_pair

from tiny_models import tiny_pair

# A published draft's config and tensor list (docs/design.md §2, tests/data/README.md).
FORMATS = Path(__file__).resolve().parent / "data"


def _published(name):
    return json.loads((FORMATS / name).read_text())


def test_published_config_and_tensor_list_match_our_model():
    cfg = DraftConfig.from_dict(_published("dflash2-draft-config.json"))
    assert cfg.variant == "dflash2" and cfg.block_size == 16 and cfg.conv_groups == 416
    assert cfg.sliding_windows == (2048,) * 5
    want = {n: tuple(v["shape"]) for n, v in _published("dflash2-draft-tensors.json").items()}
    assert expected_tensors(cfg) == want


@pytest.fixture
def saved(tmp_path):
    pair = tiny_pair("dflash2", block=4)
    save_target(pair.target, None, tmp_path / "target")
    save_draft(pair.draft, tmp_path / "draft")
    return pair, tmp_path


def test_round_trip_loads_bit_identical(saved):
    pair, root = saved
    loaded = load_pair(root / "target", root / "draft", dtype=torch.float64)
    for (n, a), (_, b) in zip(pair.draft.state_dict().items(), loaded.draft.state_dict().items()):
        assert torch.equal(a, b), n
    assert loaded.target.tap_layer_ids == pair.draft.cfg.target_layer_ids


def _edit_tensors(path: Path, fn):
    file = path / "model.safetensors"
    state = load_file(str(file))
    fn(state)
    save_file(state, str(file))


def _edit_config(path: Path, fn):
    file = path / "config.json"
    d = json.loads(file.read_text())
    fn(d)
    file.write_text(json.dumps(d))


def test_wrong_shape_is_named(saved):
    _, root = saved
    name = "layers.1.mlp_conv.kernel_projection.weight"
    _edit_tensors(root / "draft", lambda s: s.__setitem__(name, torch.zeros(3, 3)))
    with pytest.raises(CheckpointError, match=rf"{name} has shape \[3, 3\], expected"):
        load_draft(root / "draft")


def test_missing_tensor_is_named(saved):
    _, root = saved
    _edit_tensors(root / "draft", lambda s: s.pop("candidate_selector.successor_codebook"))
    with pytest.raises(CheckpointError, match="missing tensor candidate_selector.successor_codebook"):
        load_draft(root / "draft")


@pytest.mark.parametrize("where", ["top", "dflash_config"])
def test_unknown_config_key_is_named(saved, where):
    _, root = saved
    if where == "top":
        _edit_config(root / "draft", lambda d: d.__setitem__("frobnicate", 1))
    else:
        _edit_config(root / "draft", lambda d: d["dflash_config"].__setitem__("frobnicate", 1))
    with pytest.raises(CheckpointError, match="frobnicate"):
        load_draft(root / "draft")


@pytest.mark.parametrize("key, value, message", [
    ("vocab_size", 67, "vocab_size=67 does not match the target's vocab_size=61"),
    ("hidden_size", 48, "hidden_size=48 does not match the target's hidden_size=32"),
])
def test_draft_that_does_not_fit_the_target_is_refused(saved, key, value, message):
    _, root = saved
    _edit_config(root / "draft", lambda d: d.__setitem__(key, value))
    with pytest.raises(CheckpointError, match=message):
        load_pair(root / "target", root / "draft")


def test_target_layer_out_of_range_is_refused(saved):
    _, root = saved
    _edit_config(root / "draft", lambda d: d["dflash_config"].__setitem__("target_layer_ids",
                                                                          [0, 7]))
    with pytest.raises(CheckpointError, match=r"target_layer_ids \[7\]"):
        load_pair(root / "target", root / "draft")


def test_pickle_files_are_never_loaded(saved):
    _, root = saved
    (root / "draft" / "model.safetensors").unlink()
    (root / "draft" / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(CheckpointError, match="never loaded"):
        load_draft(root / "draft")
