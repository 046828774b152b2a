"""The draft loader's name, shape, dtype and d2t / t2d checks against hand-written tensor lists
and the documented convention (draft id i at target id i + d2t[i], t2d marking exactly those)."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from dflash2rt.errors import CheckpointError, DraftMismatchError
from dflash2rt.models.config import TargetConfig
from dflash2rt.models.draft import DraftModel
from dflash2rt.models.draft_config import DraftConfig
from dflash2rt.models.draft_loader import (canonical_names, check_draft_tensors,
                                           check_vocab_mapping, load_draft, save_draft,
                                           stored_state)

V = 13
ARCH = {"model_type": "qwen3", "vocab_size": V, "hidden_size": 16, "intermediate_size": 24,
        "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
        "head_dim": 8}
V2 = {"architectures": ["DFlash2DraftModel"], **ARCH,
      "dflash_config": {"block_size": 4, "mask_token_id": 12, "target_layer_ids": [0, 1],
                        "conv_kernel_size": 2, "conv_group_size": 8, "selector_rank": 4,
                        "selector_top_k": 3}}
V1 = {"architectures": ["DFlashDraftModel"], **ARCH,
      "dflash_config": {"block_size": 4, "mask_token_id": 12, "target_layer_ids": [1]}}
PRED, SUCC = ("candidate_selector.predecessor_codebook", "candidate_selector.successor_codebook")
FILE = Path("/nowhere/model.safetensors")


def cfg_v2() -> DraftConfig:
    return DraftConfig.from_dict(copy.deepcopy(V2))


def cfg_v1() -> DraftConfig:
    return DraftConfig.from_dict(copy.deepcopy(V1))


def cfg_reduced(n: int = 5) -> DraftConfig:
    """A speculators v1 draft over ``n`` of the target's ids (own head, d2t and t2d)."""
    return dataclasses.replace(cfg_v1(), source_format="speculators", draft_vocab_size=n,
                               own_head=True)


def shapes(cfg: DraftConfig) -> dict[str, tuple[int, ...]]:
    return {n: tuple(t.shape) for n, t in DraftModel(cfg).state_dict().items()}


def headers(cfg: DraftConfig) -> dict[str, tuple]:
    """Safetensors headers of a complete checkpoint: floats F32, d2t I64, t2d BOOL."""
    dt = {"d2t": "I64", "t2d": "BOOL"}
    return {n: (FILE, s, dt.get(n, "F32")) for n, s in shapes(cfg).items()}


# ---- canonical_names ------------------------------------------------------------------------

def test_codebook_spellings():
    found = {PRED + ".weight": 0, SUCC: 0, "layers.0.mlp.up_proj.weight": 0,
             "candidate_selector.other.weight": 0, "lm_head.weight": 0}
    assert canonical_names(found) == {
        PRED + ".weight": PRED, SUCC: SUCC, "layers.0.mlp.up_proj.weight":
        "layers.0.mlp.up_proj.weight", "candidate_selector.other.weight":
        "candidate_selector.other.weight", "lm_head.weight": "lm_head.weight"}


@pytest.mark.parametrize("base", [PRED, SUCC])
def test_both_spellings_refused(base):
    with pytest.raises(CheckpointError, match=f"both {base} and {base}.weight are stored"):
        canonical_names({base: 0, base + ".weight": 0})
    assert canonical_names({base + ".weight": 0}) == {base + ".weight": base}
    assert canonical_names({base: 0}) == {base: base}


# ---- check_draft_tensors: one fault at a time -------------------------------------------------

@pytest.mark.parametrize("make", [cfg_v1, cfg_v2, cfg_reduced])
def test_complete_checkpoint(make):
    cfg = make()
    assert check_draft_tensors(cfg, headers(cfg), "here") == shapes(cfg)


def test_codebooks_with_weight_suffix():
    cfg = cfg_v2()
    found = headers(cfg)
    found[PRED + ".weight"] = found.pop(PRED)
    assert check_draft_tensors(cfg, found, "here") == shapes(cfg)


@pytest.mark.parametrize("make,hint", [(cfg_v1, True), (cfg_v2, False)])
def test_unexpected_tensor(make, hint):
    cfg = make()
    found = headers(cfg)
    found["extra.weight"] = (FILE, (2,), "F32")
    with pytest.raises(CheckpointError, match=r"unexpected tensor extra\.weight in "
                                              r"model\.safetensors") as e:
        check_draft_tensors(cfg, found, "here")
    assert ("DFlash2 tensors in a DFlash v1 draft?" in str(e.value)) == hint


def test_wrong_shape_alone():
    cfg = cfg_v2()
    found = headers(cfg)
    name = "norm.weight"
    _, shape, dt = found[name]
    found[name] = (FILE, (shape[0] + 1,), dt)
    with pytest.raises(CheckpointError, match=rf"tensor {name} has shape \[17\], expected \[16\]"):
        check_draft_tensors(cfg, found, "here")


@pytest.mark.parametrize("dt,ok", [("F64", True), ("F32", True), ("F16", True), ("BF16", True),
                                   ("I64", False), ("BOOL", False), ("F8_E4M3", False),
                                   ("U8", False)])
def test_weight_dtypes(dt, ok):
    cfg = cfg_v2()
    found = headers(cfg)
    found["norm.weight"] = (FILE, found["norm.weight"][1], dt)
    if ok:
        check_draft_tensors(cfg, found, "here")
    else:
        with pytest.raises(CheckpointError, match=f"tensor norm.weight has dtype {dt}; expected "
                                                  "one of F64, F32, F16, BF16"):
            check_draft_tensors(cfg, found, "here")


@pytest.mark.parametrize("name,dt,ok", [("d2t", "I64", True), ("d2t", "I32", True),
                                        ("d2t", "F32", False), ("d2t", "BOOL", False),
                                        ("t2d", "BOOL", True), ("t2d", "U8", True),
                                        ("t2d", "I64", False), ("t2d", "F32", False)])
def test_mapping_dtypes(name, dt, ok):
    cfg = cfg_reduced()
    found = headers(cfg)
    found[name] = (FILE, found[name][1], dt)
    if ok:
        check_draft_tensors(cfg, found, "here")
    else:
        with pytest.raises(CheckpointError, match=f"tensor {name} has dtype {dt}"):
            check_draft_tensors(cfg, found, "here")


@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_missing_tensors_counted(k):
    cfg = cfg_v2()
    found = headers(cfg)
    gone = sorted(found)[-k:]
    for name in gone:
        del found[name]
    more = f" (and {k - 1} more)" if k > 1 else ""
    want = f"missing tensor {gone[0]}{more} in the dflash2 draft at here"
    with pytest.raises(CheckpointError) as e:
        check_draft_tensors(cfg, found, "here")
    assert str(e.value) == want


# ---- check_vocab_mapping ---------------------------------------------------------------------

def mapping(ids: list[int], marks: list[int] | None = None):
    """d2t and t2d for draft ids placed at target ids ``ids`` (t2d marks ``marks``)."""
    d2t = torch.tensor([t - i for i, t in enumerate(ids)], dtype=torch.int64)
    t2d = torch.zeros(V, dtype=torch.bool)
    for t in (ids if marks is None else marks):
        t2d[t] = True
    return d2t, t2d


@pytest.mark.parametrize("ids", [[0, 1, 2, 3, 4], [12, 0, 5, 3, 11], [8, 9, 10, 11, 12],
                                 [4, 3, 2, 1, 0]])
def test_a_good_mapping(ids):
    d2t, t2d = mapping(ids)
    check_vocab_mapping(d2t, t2d, cfg_reduced(), "here")
    check_vocab_mapping(d2t, t2d.to(torch.uint8), cfg_reduced(), "here")


@pytest.mark.parametrize("ids,i", [([0, 1, -1, 3, 4], 2), ([0, 1, 2, 3, V], 4),
                                   ([V + 5, 1, -2, 3, 4], 0), ([-1, 1, 2, 3, 4], 0)])
def test_an_id_outside_the_vocabulary(ids, i):
    d2t, _ = mapping([0, 1, 2, 3, 4])
    d2t = torch.tensor([t - j for j, t in enumerate(ids)], dtype=torch.int64)
    t2d = torch.zeros(V, dtype=torch.bool)
    with pytest.raises(CheckpointError) as e:
        check_vocab_mapping(d2t, t2d, cfg_reduced(), "here")
    assert str(e.value).startswith(f"here: d2t[{i}] = {ids[i] - i} places draft id {i} at "
                                   f"target id {ids[i]}, outside [0, {V})")


@pytest.mark.parametrize("ids", [[0, 0, 2, 3, 4], [1, 2, 3, 4, 1], [12, 12, 12, 12, 12]])
def test_two_draft_ids_on_one_target_id(ids):
    d2t, t2d = mapping(ids)
    with pytest.raises(CheckpointError, match="here: d2t maps two draft ids to the same"):
        check_vocab_mapping(d2t, t2d, cfg_reduced(), "here")


@pytest.mark.parametrize("marks,n", [([0, 1, 2, 3, 4, 5], 6), ([0, 1, 2, 3], 4),
                                     ([0, 1, 2, 3, 12], 5), ([], 0)])
def test_t2d_marks_exactly_the_mapped_ids(marks, n):
    d2t, t2d = mapping([0, 1, 2, 3, 4], marks)
    with pytest.raises(CheckpointError) as e:
        check_vocab_mapping(d2t, t2d, cfg_reduced(), "here")
    assert str(e.value) == (f"here: t2d does not mark exactly the target ids d2t maps to "
                            f"({n} marked, 5 mapped)")


# ---- stored_state, save_draft and load_draft ----------------------------------------------------

def seeded(cfg: DraftConfig) -> DraftModel:
    torch.manual_seed(0)
    model = DraftModel(cfg)
    with torch.no_grad():
        for t in model.parameters():
            t.uniform_(-1, 1)
    return model.requires_grad_(False)


@pytest.mark.parametrize("suffix", [False, True])
def test_stored_names(suffix):
    model = seeded(cfg_v2())
    state = stored_state(model, suffix)
    names = set(model.state_dict())
    want = {(n + ".weight" if suffix and n in (PRED, SUCC) else n) for n in names}
    assert set(state) == want
    for n, t in model.state_dict().items():
        stored = state[n + ".weight" if suffix and n in (PRED, SUCC) else n]
        assert torch.equal(stored, t) and stored.is_contiguous()


@pytest.mark.parametrize("suffix", [False, True])
def test_round_trip(tmp_path, suffix):
    model = seeded(cfg_v2())
    save_draft(model, tmp_path, codebook_suffix=suffix)
    assert ((PRED + ".weight") in load_file(str(tmp_path / "model.safetensors"))) == suffix
    loaded, cfg = load_draft(tmp_path, dtype=torch.float64)
    assert cfg == model.cfg and loaded.source_dir == str(tmp_path)
    assert not loaded.training
    for n, t in model.state_dict().items():
        got = loaded.state_dict()[n]
        assert got.dtype == torch.float64 and torch.equal(got, t.double()), n
    assert not any(p.requires_grad for p in loaded.parameters())


def test_load_checks_the_target(tmp_path):
    save_draft(seeded(cfg_v2()), tmp_path)
    small = TargetConfig.from_dict({**ARCH, "num_hidden_layers": 1})
    with pytest.raises(DraftMismatchError, match="outside the target's 1 layers"):
        load_draft(tmp_path, target=small)
    load_draft(tmp_path, target=TargetConfig.from_dict({**ARCH, "num_hidden_layers": 2}))


def reduced_checkpoint(path: Path, ids: list[int], d2t_dtype=torch.int32,
                       t2d_dtype=torch.uint8) -> DraftModel:
    model = seeded(cfg_reduced(len(ids)))
    d2t, t2d = mapping(ids)
    model.d2t.copy_(d2t)
    model.t2d.copy_(t2d)
    save_draft(model, path)
    state = load_file(str(path / "model.safetensors"))
    state["d2t"] = state["d2t"].to(d2t_dtype)
    state["t2d"] = state["t2d"].to(t2d_dtype)
    save_file(state, str(path / "model.safetensors"))
    return model


def test_reduced_draft_mapping_tensors(tmp_path):
    ids = [12, 0, 5, 3, 11]
    model = reduced_checkpoint(tmp_path, ids)
    loaded, cfg = load_draft(tmp_path, dtype=torch.float16)
    assert cfg.reduced_vocab and cfg.draft_vocab_size == 5 and cfg.own_head
    assert loaded.d2t.dtype == torch.int64 and loaded.t2d.dtype == torch.bool
    assert loaded.d2t.tolist() == [t - i for i, t in enumerate(ids)]
    assert loaded.t2d.nonzero().view(-1).tolist() == sorted(ids)
    assert loaded.lm_head.weight.dtype == torch.float16
    assert torch.equal(loaded.lm_head.weight, model.lm_head.weight.half())


def test_reduced_draft_mapping_checked_on_load(tmp_path):
    reduced_checkpoint(tmp_path, [0, 1, 2, 3, 4])
    state = load_file(str(tmp_path / "model.safetensors"))
    state["t2d"][7] = 1
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"t2d does not mark exactly .* \(6 marked, 5 "):
        load_draft(tmp_path)


def test_stored_names_by_default():
    model = seeded(cfg_v2())
    assert set(stored_state(model)) == set(model.state_dict())


def test_save_defaults(tmp_path):
    """By default a draft is written in the layout it was read from, nested block_size,
    bare codebooks, into a directory made with its parents; writing again replaces it."""
    where = tmp_path / "a" / "b"
    save_draft(seeded(cfg_v1()), where)
    save_draft(seeded(cfg_v1()), where)
    d = json.loads((where / "config.json").read_text())
    assert "block_size" not in d and d["dflash_config"]["block_size"] == 4
    assert d["architectures"] == ["DFlashDraftModel"]
    save_draft(seeded(cfg_v2()), where)
    assert PRED in load_file(str(where / "model.safetensors"))


def test_written_config_reads_back(tmp_path):
    cfg = cfg_v1()
    save_draft(seeded(cfg), tmp_path)
    d = json.loads((tmp_path / "config.json").read_text())
    assert DraftConfig.from_dict(d) == cfg
