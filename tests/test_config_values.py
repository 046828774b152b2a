"""Every value of a checkpoint's config.json that dflash2rt reads is checked where it is read:
a value of the wrong type or out of its domain is a CheckpointError naming the key, never a
TypeError from deep inside, and never a model that computes something else (a truthy string
read as true, a rope theta of 0, an EOS id the model can never produce)."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import re

import pytest

from dflash2rt.bundled import bundled_path
from dflash2rt.errors import CheckpointError
from dflash2rt.models.config import TargetConfig
from dflash2rt.models.draft_config import DraftConfig

ROOT = bundled_path("stdlib-code")
TARGET = json.loads((ROOT / "target" / "config.json").read_text(encoding="utf-8"))
DRAFT = json.loads((ROOT / "draft" / "config.json").read_text(encoding="utf-8"))
VOCAB = TARGET["vocab_size"]


def target(**changes) -> TargetConfig:
    d = copy.deepcopy(TARGET)
    d.update(changes)
    return TargetConfig.from_dict(d)


def draft(dflash=None, **changes) -> DraftConfig:
    d = copy.deepcopy(DRAFT)
    d.update(changes)
    d["dflash_config"].update(dflash or {})
    return DraftConfig.from_dict(d)


INTS = ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
        "num_attention_heads"]


@pytest.mark.parametrize("key", INTS)
@pytest.mark.parametrize("value", [1.5, 8.0, "8", None, True, 0, -8])
def test_integer_keys(key, value):
    with pytest.raises(CheckpointError, match=f"{key}"):
        target(**{key: value})
    with pytest.raises(CheckpointError, match=f"{key}"):
        draft(**{key: value})


@pytest.mark.parametrize("key", ["tie_word_embeddings", "attention_bias"])
@pytest.mark.parametrize("value", ["no", "false", 0, 1, None, [False]])
def test_flags_are_booleans(key, value):
    with pytest.raises(CheckpointError, match=f"{key} must be true or false"):
        target(**{key: value})


def test_flags_as_written():
    assert target(tie_word_embeddings=False).tie_word_embeddings is False
    assert target(attention_bias=True).attention_bias is True
    assert target(tie_word_embeddings=True).tie_word_embeddings is True


@pytest.mark.parametrize("value", ["x", "1e-6", None, True, 0, -1e-6, math.nan])
def test_rms_norm_eps(value):
    with pytest.raises(CheckpointError, match="rms_norm_eps must be"):
        target(rms_norm_eps=value)


@pytest.mark.parametrize("value", ["x", "10000", None, True, 0, -1.0, math.nan, math.inf])
def test_rope_theta(value):
    with pytest.raises(CheckpointError, match="rope_theta must be a finite number > 0"):
        target(rope_theta=value)
    with pytest.raises(CheckpointError, match="rope_theta must be a finite number > 0"):
        draft(rope_theta=value)


@pytest.mark.parametrize("factor", [0, -2.0, math.inf, math.nan, "2", True])
def test_rope_factor(factor):
    with pytest.raises(CheckpointError, match="factor"):
        target(rope_scaling={"rope_type": "linear", "factor": factor})


def test_rope_values_at_their_edges_are_kept():
    assert target(rope_theta=1e-3).rope.theta == 1e-3
    assert target(rope_theta=500000).rope.theta == 500000.0
    assert target(rope_scaling={"rope_type": "linear", "factor": 0.5}).rope.factor == 0.5


@pytest.mark.parametrize("eos", [-1, VOCAB, VOCAB + 7, [0, VOCAB], [-2, 3]])
def test_eos_ids_inside_the_vocabulary(eos):
    bad = [e for e in (eos if isinstance(eos, list) else [eos]) if not 0 <= e < VOCAB]
    with pytest.raises(CheckpointError, match=re.escape(f"eos_token_id {bad} outside the vocabulary")):
        target(eos_token_id=eos)


def test_eos_ids_at_the_vocabularys_edges():
    assert target(eos_token_id=[0, VOCAB - 1]).eos_token_ids == (0, VOCAB - 1)
    assert target(eos_token_id=None).eos_token_ids == ()


@pytest.mark.parametrize("key", ["conv_kernel_size", "conv_group_size", "selector_rank",
                                 "selector_top_k", "block_size", "mask_token_id"])
@pytest.mark.parametrize("value", [None, "4", 4.0, True, [4]])
def test_draft_integer_keys(key, value):
    with pytest.raises(CheckpointError, match=f"dflash_config.{key} must be an integer"):
        draft({key: value})


@pytest.mark.parametrize("key", ["output_multiplier", "input_embedding_scale"])
@pytest.mark.parametrize("value", [None, "1", True, math.nan, math.inf, -math.inf, [1.0]])
def test_draft_number_keys(key, value):
    with pytest.raises(CheckpointError, match=f"dflash_config.{key} must be a finite number"):
        draft({key: value})


@pytest.mark.parametrize("value", ["x", "30", True, math.nan, math.inf])
def test_softcap_is_a_number_or_null(value):
    with pytest.raises(CheckpointError, match="dflash_config.final_logit_softcapping must be"):
        draft({"final_logit_softcapping": value})


def test_draft_numbers_as_written():
    cfg = draft({"output_multiplier": 2, "input_embedding_scale": 0.5,
                 "final_logit_softcapping": 30})
    assert (cfg.output_multiplier, cfg.input_embedding_scale, cfg.final_logit_softcapping) == \
        (2.0, 0.5, 30.0)
    assert draft({"final_logit_softcapping": None}).final_logit_softcapping is None


@pytest.mark.parametrize("value", [None, "1,4,7", 7, {"0": 1}])
def test_target_layer_ids_a_list(value):
    with pytest.raises(CheckpointError, match="target_layer_ids must be a list"):
        draft({"target_layer_ids": value})


@pytest.mark.parametrize("value", [[1, "4"], [1.0], [True, 4], [None]])
def test_target_layer_ids_integers(value):
    with pytest.raises(CheckpointError, match="target_layer_ids must be an integer"):
        draft({"target_layer_ids": value})


def test_selector_top_k_at_most_the_vocabulary():
    assert draft({"selector_top_k": VOCAB}).selector_top_k == VOCAB
    with pytest.raises(CheckpointError, match=f"selector_top_k={VOCAB + 1} is more candidates"):
        draft({"selector_top_k": VOCAB + 1})


def _copy_pair(tmp_path):
    import shutil

    for side in ("target", "draft"):
        shutil.copytree(ROOT / side, tmp_path / side)
    return tmp_path


@pytest.mark.parametrize("eos", [VOCAB, [0, VOCAB + 3], -1])
def test_generation_config_eos_inside_the_vocabulary(tmp_path, eos):
    from dflash2rt.models.pair import load_pair

    root = _copy_pair(tmp_path)
    (root / "target" / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
    bad = [e for e in (eos if isinstance(eos, list) else [eos]) if not 0 <= e < VOCAB]
    with pytest.raises(CheckpointError, match=re.escape(f"eos_token_id {bad}")):
        load_pair(root / "target", root / "draft")
    (root / "target" / "generation_config.json").write_text(
        json.dumps({"eos_token_id": [0, VOCAB - 1]}))
    assert load_pair(root / "target", root / "draft").eos_token_ids == (0, VOCAB - 1)


@pytest.mark.parametrize("text, match", [
    ("{", "cannot read"), ("[1]", "must hold a JSON object"),
    ('{"chat_template": 3}', "chat_template must be a string"),
    ('{"chat_template": {"default": "x"}}', "chat_template must be a string"),
    ('{"chat_template": ["x"]}', "list must hold objects"),
])
def test_a_malformed_tokenizer_config_is_named(tmp_path, text, match):
    from dflash2rt.serve.chat import find_template, special_tokens

    (tmp_path / "tokenizer_config.json").write_text(text)
    with pytest.raises(CheckpointError, match=match):
        find_template(tmp_path, None)
    if "chat_template" not in text:
        with pytest.raises(CheckpointError, match=match):
            special_tokens(tmp_path)


def test_tokenizer_config_without_a_template(tmp_path):
    from dflash2rt.serve.chat import find_template

    for text, want in (('{}', None), ('{"chat_template": null}', None),
                       ('{"chat_template": [{"name": "tools", "template": "T"}]}', None),
                       ('{"chat_template": [{"name": "default", "template": "D"}]}', "D")):
        (tmp_path / "tokenizer_config.json").write_text(text)
        assert find_template(tmp_path, None) == want


def _speculators(**changes) -> DraftConfig:
    from dflash2rt.models.draft_config_write import draft_config_dict

    d = draft_config_dict(DraftConfig.from_dict(copy.deepcopy(DRAFT)), "speculators")
    d.update(changes)
    return DraftConfig.from_dict(d)


@pytest.mark.parametrize("key", ["conv_kernel_size", "conv_group_size", "selector_rank",
                                 "selector_top_k", "block_size", "mask_token_id"])
@pytest.mark.parametrize("value", ["4", 4.0, 1.5, True, [4], math.nan])
def test_speculators_integer_keys(key, value):
    with pytest.raises(CheckpointError, match=f"^{key} must be an integer"):
        _speculators(**{key: value})


@pytest.mark.parametrize("key", ["output_multiplier", "input_embedding_scale",
                                 "final_logit_softcapping"])
@pytest.mark.parametrize("value", ["1", True, math.nan, math.inf, [1.0]])
def test_speculators_number_keys(key, value):
    with pytest.raises(CheckpointError, match=f"^{key} must be a finite number"):
        _speculators(**{key: value})


def test_speculators_values_as_written_and_nulls_as_defaults():
    base = _speculators()
    assert _speculators(output_multiplier=2, input_embedding_scale=0.5) == \
        dataclasses.replace(base, output_multiplier=2.0, input_embedding_scale=0.5)
    nulls = _speculators(output_multiplier=None, input_embedding_scale=None,
                         final_logit_softcapping=None)
    assert (nulls.output_multiplier, nulls.input_embedding_scale,
            nulls.final_logit_softcapping) == (1.0, 1.0, None)
    with pytest.raises(CheckpointError, match="output_multiplier must be > 0, got 0"):
        _speculators(output_multiplier=0)          # refused, not read as the default
    assert _speculators(input_embedding_scale=0).input_embedding_scale == 0.0


@pytest.mark.parametrize("kind", [[], {}, None, 3, "eagle3"])
def test_speculators_kind(kind):
    with pytest.raises(CheckpointError, match="speculators_model_type"):
        _speculators(speculators_model_type=kind)
