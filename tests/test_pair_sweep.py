"""ModelPair and the loading checks of ``dflash2rt.models.pair`` against answers written out anew:
the tokenizer's EOS ids at the vocabulary's edges, the tap check, the union of EOS ids, dtype
"auto" per device and config key, and the weights ``load_pair`` asks the device for (the element
count of the tensors the saved pair holds)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from dflash2rt.errors import CheckpointError, DraftMismatchError, InvalidInputError
from dflash2rt.models import pair as pair_mod
from dflash2rt.models.config import TargetConfig
from dflash2rt.models.pair import ModelPair, check_dtype, load_pair, resolve_dtype
from dflash2rt.models.target import TargetModel
from dflash2rt.models.tokenizer import TextTokenizer

from tiny_models import VOCAB, save_pair_dir, target_dict, tiny_pair


def _tok(*eos: int) -> TextTokenizer:
    return TextTokenizer(backend=None, eos_token_ids=eos, bos_token_id=None)


def _target(taps=(0, 2), **cfg) -> TargetModel:
    return TargetModel(TargetConfig.from_dict({**target_dict(), **cfg}), taps)


@pytest.mark.parametrize("eos", [(0,), (VOCAB - 1,), (0, VOCAB - 1), ()])
def test_tokenizer_eos_inside_the_vocabulary(eos):
    p = tiny_pair()
    assert ModelPair(p.target, p.draft, _tok(*eos)).eos_token_ids == eos


@pytest.mark.parametrize("eos,outside", [((VOCAB,), [VOCAB]), ((-1,), [-1]),
                                         ((VOCAB + 9, 3, -2, VOCAB), [-2, VOCAB, VOCAB + 9])])
def test_tokenizer_eos_outside_the_vocabulary_is_refused(eos, outside):
    p = tiny_pair()
    for draft in (p.draft, None):
        with pytest.raises(CheckpointError) as info:
            ModelPair(p.target, draft, _tok(*eos))
        assert str(info.value).startswith(f"the tokenizer's eos_token_id {outside} (")
        assert str(info.value).endswith(f"outside the vocabulary [0, {VOCAB}): such a token can "
                                        "never be generated")


def test_eos_ids_are_the_sorted_union_of_config_and_tokenizer():
    target = _target(eos_token_id=[9, 3])
    assert ModelPair(target, None).eos_token_ids == (3, 9)
    assert ModelPair(target, None, _tok(9, 1, 40)).eos_token_ids == (1, 3, 9, 40)
    assert ModelPair(_target(), None, _tok(5)).eos_token_ids == (5,)
    assert ModelPair(_target(), None).eos_token_ids == ()


def test_taps_must_be_the_drafts_target_layer_ids():
    p = tiny_pair()                                                     # draft taps (0, 2)
    for taps in ((0,), (2, 0), (0, 1), (0, 2, 1), ()):
        with pytest.raises(InvalidInputError, match=r"differ from the draft's target_layer_ids "
                                                    r"\(0, 2\)"):
            ModelPair(_target(taps), p.draft)
    assert ModelPair(_target([0, 2]), p.draft).draft is p.draft         # a list is the same taps
    for taps in ((), (1,), (2, 0)):                                     # no draft: any taps
        assert ModelPair(_target(taps), None).draft is None


def test_a_draft_for_another_target_is_refused():
    p = tiny_pair()
    with pytest.raises(DraftMismatchError, match="hidden_size"):
        ModelPair(TargetModel(TargetConfig.from_dict(target_dict(hidden=48)), (0, 2)), p.draft)


def test_dtype_and_device_are_the_lm_heads():
    p = tiny_pair(dtype=torch.float32)
    assert (p.dtype, p.device) == (torch.float32, torch.device("cpu"))
    p = tiny_pair(dtype=torch.bfloat16)
    assert (p.dtype, p.device) == (torch.bfloat16, torch.device("cpu"))


@pytest.mark.parametrize("given,want", [
    ("auto", "auto"), ("half", torch.float16), ("float", torch.float32),
    ("float64", torch.float64), (torch.float8_e5m2, torch.float8_e5m2)])
def test_check_dtype(given, want):
    assert check_dtype(given) == want


@pytest.mark.parametrize("config,want", [
    ({}, torch.bfloat16),
    ({"torch_dtype": "float16"}, torch.float16),
    ({"dtype": "float32", "torch_dtype": "float16"}, torch.float32),
    ({"dtype": None, "torch_dtype": "float64"}, torch.float64),
    ({"dtype": "bfloat16"}, torch.bfloat16),
])
def test_auto_off_the_cpu_is_the_configs_dtype(tmp_path, config, want):
    (tmp_path / "config.json").write_text(json.dumps(config))
    for device in ("cuda", "cuda:1", torch.device("xpu"), "meta"):
        assert resolve_dtype("auto", tmp_path, device) == want
    assert resolve_dtype("auto", tmp_path, "cpu") == torch.float32
    assert resolve_dtype("float16", tmp_path, "cpu") == torch.float16
    assert resolve_dtype(torch.float64, tmp_path, "cuda") == torch.float64


def test_auto_on_the_cpu_reads_no_config(tmp_path):
    assert resolve_dtype("auto", tmp_path / "absent", torch.device("cpu")) == torch.float32
    with pytest.raises(CheckpointError, match="config.json not found"):
        resolve_dtype("auto", tmp_path / "absent", "cuda")
    (tmp_path / "config.json").write_text(json.dumps({"dtype": "float8_e4m3fn"}))
    with pytest.raises(CheckpointError, match=r"dtype 'float8_e4m3fn' is not one of bfloat16, "
                                              r"float16, float32, float64; pass dtype"):
        resolve_dtype("auto", tmp_path, "cuda")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A tiny pair on disk, its draft also in the speculators format with its own embedding and
    head, and the element counts of the tensors each directory holds."""
    from dataclasses import replace

    from safetensors import safe_open

    from dflash2rt.models.draft import DraftModel
    from dflash2rt.models.draft_loader import save_draft

    pair = tiny_pair(dtype=torch.float32)
    root = save_pair_dir(tmp_path_factory.mktemp("pair"), pair)
    own = replace(pair.draft.cfg, source_format="speculators", own_head=True, own_embedding=True,
                  draft_vocab_size=VOCAB)
    save_draft(DraftModel(own), root / "spec", "speculators")
    counts = {}
    for side in ("target", "draft", "spec"):
        with safe_open(str(root / side / "model.safetensors"), "pt") as f:
            counts[side] = sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())
    assert counts["spec"] == counts["draft"] + 2 * VOCAB * 32      # + embedding + head [V, H]
    return root, counts


class _Asked(Exception):
    """Raised by the recording check: the weights are never read."""


@pytest.fixture
def cpu_shapes(monkeypatch):
    """The tensor shapes of the models built on the CPU (tiny: building them on the meta device
    costs a first-use import of torch's decompositions longer than this file's tests)."""
    from dflash2rt.models.draft import DraftModel
    from dflash2rt.models.hf_loader import stored_shapes

    monkeypatch.setattr(pair_mod, "target_tensors",
                        lambda cfg, taps=(): stored_shapes(TargetModel(cfg, taps), cfg))
    monkeypatch.setattr(pair_mod, "expected_tensors", lambda cfg: {
        n: tuple(t.shape) for n, t in DraftModel(cfg).state_dict().items()})


def test_load_pair_asks_for_the_saved_weights(saved, monkeypatch, cpu_shapes):
    root, counts = saved

    def record(shapes, dtype, device, what):
        raise _Asked(sum(math.prod(s) for s in shapes.values()), dtype, device, what)
    monkeypatch.setattr(pair_mod, "check_weights_fit", record)
    what = f"the models at {root / 'target'}"
    for draft, dtype, want in (
            ("draft", torch.float64, (counts["target"] + counts["draft"], torch.float64, "cpu",
                                      what + " with their draft")),
            (None, "auto", (counts["target"], torch.float32, "cpu", what)),
            ("spec", "float16", (counts["target"] + counts["spec"], torch.float16, "cpu",
                                 what + " with their draft"))):
        with pytest.raises(_Asked) as info:
            load_pair(root / "target", None if draft is None else root / draft, dtype)
        assert info.value.args == want


def test_load_pair_assembles_and_names_the_pair(saved, monkeypatch, cpu_shapes, tmp_path):
    """The loaders stubbed with an in-memory pair: what load_pair puts together around them."""
    import shutil

    root, _ = saved
    p = tiny_pair()
    monkeypatch.setattr(pair_mod, "load_target",
                        lambda d, dtype, dev, taps: (p.target, p.target.cfg))
    monkeypatch.setattr(pair_mod, "load_draft", lambda d, dtype, dev, target: (p.draft, None))
    got = load_pair(root / "target", root / "draft")
    assert (got.target, got.draft, got.name) == (p.target, p.draft, "target")
    assert got.tokenizer is not None
    alone = load_pair(root / "target", None, name="mine")
    assert (alone.draft, alone.name) == (None, "mine")
    shutil.copytree(root / "target", tmp_path / "bare")
    (tmp_path / "bare" / "tokenizer.json").unlink()
    assert load_pair(tmp_path / "bare", None).tokenizer is None


@pytest.mark.slow
def test_load_pair_end_to_end(saved, tmp_path):
    import shutil

    root, _ = saved
    alone = load_pair(root / "target", None, name="mine")
    assert alone.name == "mine" and alone.draft is None and alone.dtype == torch.float32
    assert alone.tokenizer is not None and alone.target.tap_layer_ids == ()
    shutil.copytree(root / "target", tmp_path / "target")
    (tmp_path / "target" / "tokenizer.json").unlink()
    spec = load_pair(tmp_path / "target", root / "spec")
    assert spec.tokenizer is None and spec.name == "target"
    assert spec.draft.cfg.own_embedding and spec.draft.cfg.own_head
    assert spec.target.tap_layer_ids == (0, 2)


def test_load_pair_of_a_file_is_a_checkpoint_error(tmp_path):
    (tmp_path / "file").write_text("{}")
    with pytest.raises(CheckpointError):
        load_pair(tmp_path / "file", None)
