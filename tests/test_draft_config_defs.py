"""DraftConfig against the draft formats written out anew from docs/models.md: each dflash_config
key and check alone beside good ones, every domain's edges, and the target checks one at a time."""

from __future__ import annotations

import copy
import dataclasses
import math

import pytest

from dflash2rt.errors import CheckpointError, DraftMismatchError
from dflash2rt.models.config import TargetConfig
from dflash2rt.models.draft_config import DraftConfig

from dict_edit import DROP, apply

V = 97
ARCH = {"model_type": "qwen3", "vocab_size": V, "hidden_size": 64, "intermediate_size": 112,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16}
V2 = {"architectures": ["DFlash2DraftModel"], **ARCH, "num_target_layers": 4,
      "dflash_config": {"block_size": 4, "mask_token_id": 96, "target_layer_ids": [0, 3],
                        "conv_kernel_size": 3, "conv_group_size": 16, "selector_rank": 8,
                        "selector_top_k": 4}}
V1 = {"architectures": ["DFlashDraftModel"], **ARCH,
      "dflash_config": {"block_size": 4, "mask_token_id": 96, "target_layer_ids": [1]}}
TARGET = TargetConfig.from_dict({**ARCH, "num_hidden_layers": 4})
V2_REQUIRED = ("block_size", "mask_token_id", "target_layer_ids", "conv_kernel_size",
               "conv_group_size", "selector_rank", "selector_top_k")
V1_REQUIRED = ("block_size", "mask_token_id", "target_layer_ids")
V2_ONLY = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")


def edit(base: dict, dflash: dict | None = None, **top) -> dict:
    d = copy.deepcopy(base)
    apply(d["dflash_config"], dflash or {})
    return apply(d, top)


def v2(dflash=None, **top) -> DraftConfig:
    return DraftConfig.from_dict(edit(V2, dflash, **top))


def v1(dflash=None, **top) -> DraftConfig:
    return DraftConfig.from_dict(edit(V1, dflash, **top))


def checked(cfg: DraftConfig, **changes) -> DraftConfig:
    c = dataclasses.replace(cfg, **changes)
    c.validate()
    return c


# ---- reading the native layouts --------------------------------------------------------------

def test_v2_as_written():
    c = v2(dflash={"output_multiplier": 2.5, "final_logit_softcapping": 30,
                   "input_embedding_scale": 0.5})
    assert (c.variant, c.format, c.source_format) == ("dflash2", "dflash2", "dflash2")
    assert (c.block_size, c.gamma, c.mask_token_id, c.target_layer_ids) == (4, 3, 96, (0, 3))
    assert (c.conv_kernel_size, c.conv_group_size, c.conv_groups) == (3, 16, 4)
    assert (c.selector_rank, c.selector_top_k, c.num_target_layers) == (8, 4, 4)
    assert (c.output_multiplier, c.final_logit_softcapping, c.input_embedding_scale) == \
        (2.5, 30.0, 0.5)
    assert c.sliding_windows == (None, None) and c.causal_layers == (False, False)
    assert (c.draft_vocab_size, c.reduced_vocab, c.head_rows) == (0, False, V)
    assert (c.own_head, c.own_embedding) == (False, False)
    assert c.arch == TargetConfig.from_dict(ARCH)


def test_v1_defaults():
    c = v1()
    assert (c.variant, c.format, c.source_format) == ("dflash1", "dflash", "dflash")
    assert (c.conv_kernel_size, c.conv_group_size, c.selector_rank, c.selector_top_k) == \
        (0, 0, 0, 1)
    assert (c.output_multiplier, c.final_logit_softcapping, c.input_embedding_scale) == \
        (1.0, None, 1.0)
    assert c.num_target_layers is None and c.target_layer_ids == (1,)


def test_v2_defaults():
    c = v2()
    assert (c.output_multiplier, c.final_logit_softcapping, c.input_embedding_scale) == \
        (1.0, None, 1.0)


@pytest.mark.parametrize("archs", [DROP, None, [], ["DFlash2DraftModel", "Other"]])
def test_architectures_default_to_dflash2(archs):
    assert v2(architectures=archs).variant == "dflash2"


@pytest.mark.parametrize("archs", [["Qwen3ForCausalLM"], ["DFlashDraftModel2"],
                                   ["Other", "DFlash2DraftModel"]])
def test_other_architectures(archs):
    with pytest.raises(CheckpointError, match="is not DFlash2DraftModel or DFlashDraftModel"):
        v2(architectures=archs)


def test_v1_architecture_first():
    assert v1(architectures=["DFlashDraftModel", "DFlash2DraftModel"]).variant == "dflash1"


@pytest.mark.parametrize("d", [[], None, "x", 1])
def test_not_an_object(d):
    with pytest.raises(CheckpointError, match="draft config must be a JSON object"):
        DraftConfig.from_dict(d)


@pytest.mark.parametrize("dc", [DROP, None, [], "x", 4])
def test_dflash_config_an_object(dc):
    with pytest.raises(CheckpointError, match="lacks the 'dflash_config' object"):
        v2(dflash_config=dc)


@pytest.mark.parametrize("key", ["speculators_model_type", "speculators_config"])
def test_either_speculators_key_reads_the_speculators_format(key):
    """One of the two keys alone sends the dict to the speculators reader, whose first check
    is the model type."""
    d = edit(V2)
    d[key] = "eagle3" if key == "speculators_model_type" else {}
    with pytest.raises(CheckpointError, match="speculators_model_type"):
        DraftConfig.from_dict(d)


def test_block_size_at_the_top_level():
    assert v1(dflash={"block_size": DROP}, block_size=16).block_size == 16
    assert v1(block_size=16).block_size == 4        # dflash_config's wins
    assert v2(dflash={"block_size": DROP}, block_size=6).block_size == 6
    with pytest.raises(CheckpointError, match="lacks required key 'block_size'"):
        v1(dflash={"block_size": DROP})


@pytest.mark.parametrize("base", [V1, V2])
@pytest.mark.parametrize("key", ["blocksize", "mask_token", "gamma", "target_layers"])
def test_an_unknown_dflash_key_alone(base, key):
    with pytest.raises(CheckpointError, match=f"unknown dflash_config key '{key}'"):
        DraftConfig.from_dict(edit(base, {key: 1}))


@pytest.mark.parametrize("key", V2_ONLY)
def test_a_v2_key_in_a_v1_draft(key):
    with pytest.raises(CheckpointError, match=f"dflash_config.{key} belongs to DFlash2"):
        v1(dflash={key: 16})


@pytest.mark.parametrize("key,value", [("output_multiplier", 2.0),
                                       ("final_logit_softcapping", 15.0),
                                       ("input_embedding_scale", 3.0)])
def test_shared_keys_in_either_variant(key, value):
    assert getattr(v1(dflash={key: value}), key) == value
    assert getattr(v2(dflash={key: value}), key) == value


@pytest.mark.parametrize("key", V2_REQUIRED)
def test_a_v2_required_key_missing_alone(key):
    with pytest.raises(CheckpointError, match=f"lacks required key '{key}'"):
        v2(dflash={key: DROP})


@pytest.mark.parametrize("key", V1_REQUIRED)
def test_a_v1_required_key_missing_alone(key):
    with pytest.raises(CheckpointError, match=f"lacks required key '{key}'"):
        v1(dflash={key: DROP})


@pytest.mark.parametrize("key", ["output_multiplier", "final_logit_softcapping",
                                 "input_embedding_scale"])
def test_optional_keys_absent(key):
    v1(dflash={key: DROP})
    v2(dflash={key: DROP})


def test_the_decoder_config_without_the_draft_keys():
    """The draft's top-level keys and the sliding keys are not the decoder's; model_type
    defaults to qwen3."""
    c = v2(model_type=DROP, is_causal=True, use_sliding_window=True, sliding_window=3,
           max_window_layers=1)
    assert c.arch.model_type == "qwen3"
    assert c.sliding_windows == (None, 3) and c.causal_layers == (True, True)


@pytest.mark.parametrize("top,windows,causal", [
    ({"layer_types": ["sliding_attention", "full_attention"], "use_sliding_window": True,
      "sliding_window": 5}, (5, None), (True, False)),
    ({"layer_types": ["sliding_attention", "full_attention"], "use_sliding_window": True,
      "sliding_window": 5, "is_causal": False}, (5, None), (False, False)),
    ({"use_sliding_window": True, "sliding_window": 7, "max_window_layers": 0},
     (7, 7), (True, True)),
    ({"is_causal": True}, (None, None), (True, True)),
])
def test_attention_per_layer(top, windows, causal):
    c = v2(**top)
    assert c.sliding_windows == windows and c.causal_layers == causal
    assert tuple(c.causal(i) for i in range(2)) == causal


def test_no_causal_layers():
    c = dataclasses.replace(v2(), causal_layers=())
    assert (c.causal(0), c.causal(1)) == (False, False)


def test_dataclass_defaults():
    c = DraftConfig(arch=TargetConfig.from_dict(ARCH), variant="dflash1", block_size=4,
                    mask_token_id=0, target_layer_ids=(0,), num_target_layers=None,
                    sliding_windows=(None, None))
    assert (c.conv_kernel_size, c.conv_group_size, c.selector_rank, c.selector_top_k) == \
        (0, 0, 0, 1)
    assert (c.output_multiplier, c.final_logit_softcapping, c.input_embedding_scale) == \
        (1.0, None, 1.0)
    assert (c.causal_layers, c.source_format, c.draft_vocab_size) == ((), "", 0)
    assert (c.own_head, c.own_embedding, c.format, c.head_rows) == (False, False, "dflash", V)
    assert dataclasses.replace(c, variant="dflash2").format == "dflash2"
    c.validate()


def test_frozen():
    """A config is a value (docs/design.md: frozen dataclass configs): no field can be set."""
    c = v2()
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.block_size = 8
    assert hash(c) == hash(v2()) and c.block_size == 4


# ---- validate: each check alone --------------------------------------------------------------

@pytest.mark.parametrize("make", [v1, v2])
def test_block_size_edges(make):
    assert make(dflash={"block_size": 2}).block_size == 2
    for bad in (1, 0, -4):
        with pytest.raises(CheckpointError, match=f"block_size={bad} must be >= 2"):
            make(dflash={"block_size": bad})


def test_target_layer_ids_empty():
    with pytest.raises(CheckpointError, match="target_layer_ids is empty"):
        v2(dflash={"target_layer_ids": []})
    assert v2(dflash={"target_layer_ids": [2]}).target_layer_ids == (2,)


@pytest.mark.parametrize("key", V2_ONLY)
def test_v2_sizes_at_least_one(key):
    with pytest.raises(CheckpointError, match=f"dflash_config.{key} must be >= 1"):
        v2(dflash={key: 0})
    with pytest.raises(CheckpointError, match=f"dflash_config.{key} must be >= 1"):
        v2(dflash={key: -1})
    one = {key: 1}
    assert getattr(v2(dflash=one), key) == 1


def test_selector_top_k_at_most_the_vocabulary():
    assert v2(dflash={"selector_top_k": V}).selector_top_k == V
    with pytest.raises(CheckpointError, match=f"selector_top_k={V + 1} is more candidates"):
        v2(dflash={"selector_top_k": V + 1})


@pytest.mark.parametrize("group,ok", [(1, True), (64, True), (32, True), (3, False),
                                      (48, False), (128, False)])
def test_conv_group_divides_hidden(group, ok):
    if ok:
        assert v2(dflash={"conv_group_size": group}).conv_groups == 64 // group
    else:
        with pytest.raises(CheckpointError, match=f"conv_group_size={group} does not divide"):
            v2(dflash={"conv_group_size": group})


def test_v1_skips_the_v2_checks():
    c = v1()
    assert checked(c, selector_top_k=V + 5).selector_top_k == V + 5
    assert checked(c, conv_group_size=3).conv_group_size == 3


@pytest.mark.parametrize("make", [v1, v2])
@pytest.mark.parametrize("cap,ok", [(None, True), (1e-300, True), (30.0, True), (0, False),
                                    (-0.0, False), (-5.0, False)])
def test_softcap_edges(make, cap, ok):
    if ok:
        assert make(dflash={"final_logit_softcapping": cap}).final_logit_softcapping == cap
    else:
        with pytest.raises(CheckpointError, match="final_logit_softcapping must be > 0"):
            make(dflash={"final_logit_softcapping": cap})


@pytest.mark.parametrize("make", [v1, v2])
@pytest.mark.parametrize("m,ok", [(1e-300, True), (1.0, True), (7, True), (0, False),
                                  (-0.0, False), (-1.0, False)])
def test_output_multiplier_edges(make, m, ok):
    if ok:
        assert make(dflash={"output_multiplier": m}).output_multiplier == m
    else:
        with pytest.raises(CheckpointError, match="output_multiplier must be > 0"):
            make(dflash={"output_multiplier": m})


def test_nan_scales_refused_by_validate():
    with pytest.raises(CheckpointError, match="final_logit_softcapping"):
        checked(v1(), final_logit_softcapping=math.nan)
    with pytest.raises(CheckpointError, match="output_multiplier"):
        checked(v1(), output_multiplier=math.nan)


@pytest.mark.parametrize("dv,ok,reduced,rows", [
    (0, True, False, V), (1, True, True, 1), (V - 1, True, True, V - 1), (V, True, False, V),
    (V + 1, False, None, None), (-1, False, None, None)])
def test_draft_vocab_size_edges(dv, ok, reduced, rows):
    c = v1()
    if not ok:
        with pytest.raises(CheckpointError, match=f"draft_vocab_size={dv} must be in"):
            checked(c, draft_vocab_size=dv)
        return
    c = checked(c, draft_vocab_size=dv)
    assert (c.reduced_vocab, c.head_rows) == (reduced, rows)


@pytest.mark.parametrize("dv,ok", [(0, True), (V, True), (V - 1, False), (1, False)])
def test_a_reduced_dflash2_refused(dv, ok):
    if ok:
        assert checked(v2(), draft_vocab_size=dv).draft_vocab_size == dv
    else:
        with pytest.raises(CheckpointError, match="reduced vocabulary"):
            checked(v2(), draft_vocab_size=dv)


# ---- with_tensors ---------------------------------------------------------------------------

def test_with_tensors_native_unchanged():
    c = v2()
    assert c.with_tensors(["embed_tokens.weight", "lm_head.weight"]) is c


@pytest.mark.parametrize("dv,names,emb,head", [
    (0, [], False, False), (0, ["embed_tokens.weight"], True, False),
    (0, ["lm_head.weight"], False, True),
    (V, ["lm_head.weight", "embed_tokens.weight"], True, True),
    (V - 1, [], False, True), (V - 1, ["embed_tokens.weight"], True, True),
    (0, ["embed_tokens", "lm_head"], False, False)])
def test_with_tensors_speculators(dv, names, emb, head):
    c = dataclasses.replace(v1(), source_format="speculators", draft_vocab_size=dv)
    got = c.with_tensors(iter(names))
    assert (got.own_embedding, got.own_head) == (emb, head)
    assert got.format == "speculators"


# ---- check_target: each mismatch alone ------------------------------------------------------

def test_fits_its_target():
    v2().check_target(TARGET)
    v1().check_target(TARGET)


def test_hidden_size_mismatch():
    t = TargetConfig.from_dict({**ARCH, "hidden_size": 128, "num_hidden_layers": 4})
    with pytest.raises(DraftMismatchError, match="hidden_size=64 does not match"):
        v2().check_target(t)


def test_vocab_mismatch():
    t = TargetConfig.from_dict({**ARCH, "vocab_size": 98, "num_hidden_layers": 4})
    with pytest.raises(DraftMismatchError, match="has no d2t/t2d mapping") as e:
        v2().check_target(t)
    assert "vocab_size=97 does not match the target's vocab_size=98" in str(e.value)
    reduced = dataclasses.replace(v1(), draft_vocab_size=50)
    with pytest.raises(DraftMismatchError, match="its d2t/t2d map a 50-id draft vocabulary"):
        reduced.check_target(t)


@pytest.mark.parametrize("ids,bad", [((4,), [4]), ((-1,), [-1]), ((0, 4, 3, 9), [4, 9])])
def test_taps_outside_the_target(ids, bad):
    with pytest.raises(DraftMismatchError, match="outside the target's 4 layers") as e:
        dataclasses.replace(v2(), target_layer_ids=ids).check_target(TARGET)
    assert f"target_layer_ids {bad} are" in str(e.value)


@pytest.mark.parametrize("ids", [(0,), (3,), (0, 1, 2, 3)])
def test_taps_inside_the_target(ids):
    dataclasses.replace(v2(), target_layer_ids=ids).check_target(TARGET)


@pytest.mark.parametrize("n,ok", [(None, True), (4, True), (3, False), (5, False), (0, False)])
def test_num_target_layers(n, ok):
    c = v2(num_target_layers=n)
    if ok:
        c.check_target(TARGET)
    else:
        with pytest.raises(DraftMismatchError, match=f"num_target_layers={n}, the target has 4"):
            c.check_target(TARGET)


@pytest.mark.parametrize("mask,ok", [(0, True), (V - 1, True), (V, False), (-1, False),
                                     (10**9, False)])
def test_mask_token_inside_the_vocabulary(mask, ok):
    c = dataclasses.replace(v2(), mask_token_id=mask)
    if ok:
        c.check_target(TARGET)
    else:
        with pytest.raises(DraftMismatchError, match=f"mask_token_id={mask} is outside"):
            c.check_target(TARGET)
