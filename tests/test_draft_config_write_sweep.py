"""The config.json dicts ``draft_config_dict`` writes, against dicts written out by hand from
docs/models.md ("Draft formats") for DraftConfigs built field by field: native dflash / dflash2
(``block_size`` inside ``dflash_config`` or at the top), vLLM's speculators format (taps + 1,
``speculative_tokens`` = block - 1), ``is_causal`` only where every layer agrees, optional keys
only where they differ from their defaults, and each draft a layout cannot express refused."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest

from dflash2rt.errors import CheckpointError
from dflash2rt.models.config import TargetConfig
from dflash2rt.models.draft_config import DraftConfig
from dflash2rt.models.draft_config_write import draft_config_dict

V = 97
ARCH = TargetConfig.from_dict({"model_type": "qwen3", "vocab_size": V, "hidden_size": 64,
                               "intermediate_size": 112, "num_hidden_layers": 2,
                               "num_attention_heads": 4, "num_key_value_heads": 2,
                               "head_dim": 16})
# Layer 0 slides over 16 positions and is causal, layer 1 is full attention, non-causal.
C1 = DraftConfig(arch=ARCH, variant="dflash1", block_size=4, mask_token_id=96,
                 target_layer_ids=(0, 3), num_target_layers=None, sliding_windows=(16, None),
                 causal_layers=(True, False))
C2 = DraftConfig(arch=ARCH, variant="dflash2", block_size=4, mask_token_id=96,
                 target_layer_ids=(0, 3), num_target_layers=4, sliding_windows=(None, None),
                 conv_kernel_size=3, conv_group_size=16, selector_rank=8, selector_top_k=4,
                 causal_layers=(False, False))
SLIDING = {"use_sliding_window": True, "max_window_layers": 2, "sliding_window": 16,
           "layer_types": ["sliding_attention", "full_attention"]}
FULL = {"use_sliding_window": False, "max_window_layers": 2, "sliding_window": None,
        "layer_types": ["full_attention", "full_attention"]}
W1 = {**ARCH.to_dict(), **SLIDING, "architectures": ["DFlashDraftModel"],
      "dflash_config": {"block_size": 4, "mask_token_id": 96, "target_layer_ids": [0, 3]}}
W2 = {**ARCH.to_dict(), **FULL, "architectures": ["DFlash2DraftModel"], "is_causal": False,
      "num_target_layers": 4,
      "dflash_config": {"block_size": 4, "mask_token_id": 96, "target_layer_ids": [0, 3],
                        "input_embedding_scale": 1.0, "conv_kernel_size": 3,
                        "conv_group_size": 16, "selector_rank": 8, "selector_top_k": 4,
                        "output_multiplier": 1.0, "final_logit_softcapping": None}}


def _spec(kind: str, layers: dict, non_causal: bool, **more) -> dict:
    return {"architectures": ["DFlash2DraftModel" if kind == "dflash2" else "DFlashDraftModel"],
            "speculators_model_type": kind, "speculators_version": "0.4.0",
            "transformer_layer_config": {**ARCH.to_dict(), **layers}, "draft_vocab_size": V,
            "block_size": 4, "aux_hidden_state_layer_ids": [1, 4], "mask_token_id": 96,
            "target_hidden_size": None, "sliding_window_non_causal": non_causal,
            "projector_type": "dflash",
            "speculators_config": {
                "algorithm": kind,
                "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
                "default_proposal_method": "greedy",
                "verifier": {"name_or_path": None, "architectures": []}},
            **more}


S1 = _spec("dflash", SLIDING, False)
S2 = _spec("dflash2", FULL, True, conv_kernel_size=3, conv_group_size=16, selector_rank=8,
           selector_top_k=4, input_embedding_scale=1.0, output_multiplier=1.0,
           final_logit_softcapping=None, num_target_layers=4)


def with_dc(base: dict, **dc) -> dict:
    d = copy.deepcopy(base)
    d["dflash_config"].update(dc)
    return d


def test_native_layouts_as_written():
    assert draft_config_dict(C1) == draft_config_dict(C1, "dflash") == W1
    assert draft_config_dict(C2) == draft_config_dict(C2, "dflash2") == W2
    top = draft_config_dict(C1, block_at_top=True)
    assert top == {**with_dc(W1), "block_size": 4,
                   "dflash_config": {"mask_token_id": 96, "target_layer_ids": [0, 3]}}
    assert draft_config_dict(C2, block_at_top=True) == W2             # v1 only


def test_speculators_layout_as_written():
    assert draft_config_dict(C1, "speculators") == S1
    assert draft_config_dict(C2, "speculators") == S2
    assert draft_config_dict(replace(C1, source_format="speculators")) == S1   # as it was read
    assert draft_config_dict(replace(C2, source_format="speculators"), "dflash2") == W2


def test_optional_dflash_keys_only_when_not_their_defaults():
    c = replace(C1, input_embedding_scale=0.5, output_multiplier=2.0,
                final_logit_softcapping=30.0, num_target_layers=6)
    assert draft_config_dict(c) == {**with_dc(W1, input_embedding_scale=0.5,
                                              output_multiplier=2.0,
                                              final_logit_softcapping=30.0),
                                    "num_target_layers": 6}
    assert draft_config_dict(replace(C2, input_embedding_scale=0.5, output_multiplier=2.0,
                                     final_logit_softcapping=30.0, num_target_layers=None)) \
        == {k: v for k, v in with_dc(W2, input_embedding_scale=0.5, output_multiplier=2.0,
                                     final_logit_softcapping=30.0).items()
            if k != "num_target_layers"}
    s = draft_config_dict(replace(C2, input_embedding_scale=0.5, output_multiplier=2.0,
                                  final_logit_softcapping=30.0), "speculators")
    assert s == {**S2, "input_embedding_scale": 0.5, "output_multiplier": 2.0,
                 "final_logit_softcapping": 30.0}
    assert draft_config_dict(c, "speculators") == {
        **S1, "input_embedding_scale": 0.5, "output_multiplier": 2.0,
        "final_logit_softcapping": 30.0, "num_target_layers": 6}
    assert draft_config_dict(replace(C2, num_target_layers=None), "speculators") == \
        {k: v for k, v in S2.items() if k != "num_target_layers"}


def test_speculators_keeps_what_the_native_layout_keeps():
    """A v1 draft's multipliers, cap and trained depth survive a write in either layout (the
    speculators reader takes them for both kinds)."""
    c = replace(C1, input_embedding_scale=0.5, output_multiplier=2.0,
                final_logit_softcapping=30.0, num_target_layers=6)
    for fmt in ("dflash", "speculators"):
        back = DraftConfig.from_dict(draft_config_dict(c, fmt))
        assert (back.input_embedding_scale, back.output_multiplier,
                back.final_logit_softcapping, back.num_target_layers) == (0.5, 2.0, 30.0, 6)


@pytest.mark.parametrize("causal,written", [((True, True), True), ((False, False), False),
                                            ((), False)])
def test_is_causal_when_every_layer_agrees(causal, written):
    d = draft_config_dict(replace(C1, causal_layers=causal))
    assert d["is_causal"] is written
    assert {k: v for k, v in d.items() if k != "is_causal"} == W1


def test_mixed_causal_layers_must_be_the_sliding_ones():
    with pytest.raises(CheckpointError, match="mixed causal layers are written as the sliding-"
                                              "attention layers"):
        draft_config_dict(replace(C1, causal_layers=(False, True)))
    full = replace(C2, causal_layers=(True, False))
    with pytest.raises(CheckpointError, match="mixed causal layers"):
        draft_config_dict(full)


def test_speculators_causal_rules():
    """Sliding layers all causal or all non-causal, full layers never causal; with no sliding
    layer, the flag is the kind's default."""
    assert draft_config_dict(replace(C1, causal_layers=(False, False)),
                             "speculators") == {**S1, "sliding_window_non_causal": True}
    assert draft_config_dict(replace(C2, causal_layers=()), "speculators") == S2
    v1_full = replace(C1, sliding_windows=(None, None), causal_layers=())
    assert draft_config_dict(v1_full, "speculators") == _spec("dflash", FULL, False)
    for bad in (replace(C1, causal_layers=(True, True)), replace(C1, causal_layers=(False, True)),
                replace(C2, causal_layers=(True, False))):
        with pytest.raises(CheckpointError, match="the speculators format makes sliding layers "
                                                  "all causal or all non-causal"):
            draft_config_dict(bad, "speculators")


def test_each_layout_reads_back():
    for c in (C1, C2, replace(C1, sliding_windows=(16, 16), causal_layers=(True, True)),
              replace(C2, num_target_layers=None, output_multiplier=0.5)):
        for fmt, block_at_top in ((c.format, False), (c.format, True), ("speculators", False)):
            back = DraftConfig.from_dict(draft_config_dict(c, fmt, block_at_top))
            spec = fmt == "speculators"
            assert back == replace(c, source_format=fmt, own_head=spec,
                                   draft_vocab_size=V if spec else 0)


def test_what_a_layout_cannot_express_is_refused():
    for c, fmt in ((C1, "dflash2"), (C2, "dflash")):
        with pytest.raises(CheckpointError) as info:
            draft_config_dict(c, fmt)
        assert str(info.value) == f"a {c.variant} draft cannot be written as {fmt}"
    reduced = replace(C1, draft_vocab_size=40, own_head=True)
    with pytest.raises(CheckpointError, match=r"a reduced draft vocabulary \(d2t/t2d\) exists "
                                              r"in the speculators format only"):
        draft_config_dict(reduced, "dflash")
    assert draft_config_dict(reduced, "speculators")["draft_vocab_size"] == 40
    assert draft_config_dict(replace(C1, draft_vocab_size=V))["architectures"] == \
        ["DFlashDraftModel"]                                    # the whole vocabulary: not reduced
    two = replace(C1, sliding_windows=(16, 8), causal_layers=(True, True))
    for fmt in ("dflash", "speculators"):
        with pytest.raises(CheckpointError, match=r"one sliding_window per draft, got \[8, 16\]"):
            draft_config_dict(two, fmt)


@pytest.mark.parametrize("causal", [True, False])
def test_a_one_layer_draft(causal):
    arch = TargetConfig.from_dict({**ARCH.to_dict(), "num_hidden_layers": 1})
    c = replace(C1, arch=arch, sliding_windows=(None,), causal_layers=(causal,))
    d = draft_config_dict(c)
    assert d["is_causal"] is causal and d["layer_types"] == ["full_attention"]
    assert DraftConfig.from_dict(d) == replace(c, source_format="dflash")
