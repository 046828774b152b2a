"""vLLM's speculators draft format (``dflash2rt.models.speculators_config``) against configs and
DraftConfigs written out by hand from docs/models.md ("Draft formats"): taps are hidden-state
indices (target layer + 1), the block from ``block_size`` or the first proposal method's
``speculative_tokens`` + 1, sliding layers causal unless ``sliding_window_non_causal`` (its
default: true for dflash2), and each refusal alone beside good keys."""

from __future__ import annotations

import copy

import pytest

from dflash2rt.errors import CheckpointError
from dflash2rt.models.config import TargetConfig
from dflash2rt.models.draft_config import DraftConfig
from dflash2rt.models.speculators_config import speculators_fields

from dict_edit import DROP, apply

V = 97
LAYER = {"model_type": "qwen3", "vocab_size": V, "hidden_size": 64, "intermediate_size": 112,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "head_dim": 16}
ARCH = TargetConfig.from_dict({**LAYER, "architectures": ["Qwen3ForCausalLM"]})
V1 = {"architectures": ["DFlashDraftModel"], "speculators_model_type": "dflash",
      "speculators_version": "0.4.0",
      "transformer_layer_config": {**LAYER, "use_sliding_window": True, "sliding_window": 16,
                                   "max_window_layers": 2,
                                   "layer_types": ["sliding_attention", "full_attention"]},
      "block_size": 4, "aux_hidden_state_layer_ids": [1, 4], "mask_token_id": 96,
      "speculators_config": {"algorithm": "dflash", "default_proposal_method": "greedy",
                             "proposal_methods": [{"proposal_type": "greedy",
                                                   "speculative_tokens": 3}],
                             "verifier": {"name_or_path": None, "architectures": []}}}
V2 = {**copy.deepcopy(V1), "architectures": ["DFlash2DraftModel"],
      "speculators_model_type": "dflash2", "conv_kernel_size": 3, "conv_group_size": 16,
      "selector_rank": 8, "selector_top_k": 4}
# What each reads as, written out: taps [1, 4] - 1; the whole vocabulary, the draft's own head.
WANT_V1 = DraftConfig(arch=ARCH, variant="dflash1", block_size=4, mask_token_id=96,
                      target_layer_ids=(0, 3), num_target_layers=None,
                      sliding_windows=(16, None), causal_layers=(True, False),
                      source_format="speculators", draft_vocab_size=V, own_head=True)
WANT_V2 = DraftConfig(arch=ARCH, variant="dflash2", block_size=4, mask_token_id=96,
                      target_layer_ids=(0, 3), num_target_layers=None,
                      sliding_windows=(16, None), causal_layers=(False, False),
                      conv_kernel_size=3, conv_group_size=16, selector_rank=8, selector_top_k=4,
                      source_format="speculators", draft_vocab_size=V, own_head=True)


def edit(base: dict, **top) -> dict:
    return apply(copy.deepcopy(base), top)


def layer(base: dict, **keys) -> dict:
    d = copy.deepcopy(base)
    apply(d["transformer_layer_config"], keys)
    return d


def read(d: dict) -> DraftConfig:
    return DraftConfig.from_dict(d)


def test_each_kind_as_written():
    assert read(V1) == WANT_V1 and read(V2) == WANT_V2
    assert DraftConfig(**speculators_fields(copy.deepcopy(V1))) == WANT_V1


@pytest.mark.parametrize("base,want", [(V1, WANT_V1), (V2, WANT_V2)])
def test_sliding_window_non_causal_as_given(base, want):
    assert read(edit(base, sliding_window_non_causal=False)).causal_layers == (True, False)
    assert read(edit(base, sliding_window_non_causal=True)).causal_layers == (False, False)
    full = layer(base, layer_types=["full_attention", "full_attention"])
    for flag in (False, True):
        assert read(edit(full, sliding_window_non_causal=flag)).causal_layers == (False, False)


def test_dflash2_fields_and_their_defaults():
    c = read(edit(V2, output_multiplier=0.5, final_logit_softcapping=30.0,
                  input_embedding_scale=2.0, num_target_layers=4))
    assert (c.output_multiplier, c.final_logit_softcapping, c.input_embedding_scale,
            c.num_target_layers) == (0.5, 30.0, 2.0, 4)
    nulls = read(edit(V2, output_multiplier=None, final_logit_softcapping=None,
                      input_embedding_scale=None, selector_top_k=None))
    assert (nulls.output_multiplier, nulls.final_logit_softcapping, nulls.input_embedding_scale,
            nulls.selector_top_k) == (1.0, None, 1.0, 1)
    assert read(edit(V1, output_multiplier=None, conv_kernel_size=None)) == WANT_V1
    with pytest.raises(CheckpointError, match="selector_rank must be >= 1"):
        read(edit(V2, selector_rank=DROP))                              # default 0: refused
    with pytest.raises(CheckpointError, match="conv_kernel_size must be an integer"):
        read(edit(V2, conv_kernel_size=3.0))


def test_the_draft_vocabulary():
    assert read(edit(V1, draft_vocab_size=V)).draft_vocab_size == V
    assert read(edit(V1, draft_vocab_size=0)).draft_vocab_size == V     # 0 / null: the whole one
    assert read(edit(V1, draft_vocab_size=None)).draft_vocab_size == V
    c = read(edit(V1, draft_vocab_size=40))
    assert c.draft_vocab_size == 40 and c.reduced_vocab and c.head_rows == 40
    with pytest.raises(CheckpointError, match="draft_vocab_size must be an integer"):
        read(edit(V1, draft_vocab_size=40.0))


def test_block_from_the_first_proposal_method():
    def methods(*ms):
        return edit(V1, block_size=DROP, speculators_config={"proposal_methods": list(ms)})
    assert read(methods({"speculative_tokens": 7}, {"speculative_tokens": 2})).block_size == 8
    assert read(methods({"speculative_tokens": 1})).block_size == 2
    assert read(methods("greedy", {"speculative_tokens": 5})).block_size == 6   # dicts only
    assert read(edit(V1, block_size=6)).block_size == 6                # block_size first
    for bad in (methods(), methods({"proposal_type": "greedy"}),
                methods({"speculative_tokens": "3"}), methods({"speculative_tokens": None}),
                edit(V1, block_size=DROP, speculators_config=None),
                edit(V1, block_size=None, speculators_config={}),
                edit(V1, mask_token_id=DROP), edit(V1, mask_token_id=None)):
        with pytest.raises(CheckpointError, match="lacks block_size .* or mask_token_id"):
            read(bad)
    with pytest.raises(CheckpointError, match="block_size must be an integer, got 4.0"):
        read(edit(V1, block_size=4.0))
    with pytest.raises(CheckpointError, match="mask_token_id must be an integer"):
        read(edit(V1, mask_token_id="96"))


@pytest.mark.parametrize("aux,taps", [([1], (0,)), ([4, 2], (3, 1)), ([2, 3, 4], (1, 2, 3))])
def test_taps_are_hidden_state_indices_minus_one(aux, taps):
    assert read(edit(V1, aux_hidden_state_layer_ids=aux)).target_layer_ids == taps


@pytest.mark.parametrize("aux", [[], None, 3, "1", (1, 2), {}])
def test_aux_layers_must_be_a_nonempty_list(aux):
    with pytest.raises(CheckpointError, match="lacks aux_hidden_state_layer_ids"):
        read(edit(V1, aux_hidden_state_layer_ids=aux))
    with pytest.raises(CheckpointError, match="lacks aux_hidden_state_layer_ids"):
        read(edit(V1, aux_hidden_state_layer_ids=DROP))


@pytest.mark.parametrize("aux", [[0], [2, 0], [-1, 3]])
def test_the_embedding_output_is_not_a_tap(aux):
    with pytest.raises(CheckpointError, match=r"aux_hidden_state_layer_ids \[.*\]: id 0 is the "
                                              r"embedding output"):
        read(edit(V1, aux_hidden_state_layer_ids=aux))


@pytest.mark.parametrize("kind", ["eagle3", "DFlash", "dflash3", None, 1, ["dflash"]])
def test_other_algorithms_are_refused(kind):
    with pytest.raises(CheckpointError) as info:
        speculators_fields(edit(V1, speculators_model_type=kind))
    assert str(info.value) == (f"speculators_model_type {kind!r}: dflash2rt runs the speculators "
                               "DFlash drafts (dflash, dflash2), not other algorithms (EAGLE-3, "
                               "MTP, ...)")


def test_keys():
    for key, value in (("lambda_base_start", 1.0), ("loss_config", {}), ("dtype", "bfloat16"),
                       ("transformers_version", "4.57"), ("pad_token_id", 0),
                       ("tie_word_embeddings", False), ("projector_type", "dflash"),
                       ("shift_label", False), ("sample_from_anchor", None)):
        assert read(edit(V1, **{key: value})) == WANT_V1, key
    with pytest.raises(CheckpointError, match="key 'draft_head' is not understood"):
        read(edit(V1, draft_head=1))
    with pytest.raises(CheckpointError, match="projector_type='domino': only the plain"):
        read(edit(V1, projector_type="domino"))
    for key in ("shift_label", "sample_from_anchor"):
        with pytest.raises(CheckpointError, match=f"{key}=true: the draft was trained for "
                                                  "another block layout"):
            read(edit(V2, **{key: True}))


def test_the_layer_config():
    for bad in (DROP, None, [LAYER]):
        with pytest.raises(CheckpointError, match="lacks the 'transformer_layer_config' object"):
            read(edit(V1, transformer_layer_config=bad))
    c = read(layer(V1, model_type="llama", is_causal=True, architectures=["LlamaForCausalLM"]))
    assert c == WANT_V1                       # Qwen3 layers whatever it says; is_causal unread
    flat = read(layer(V1, use_sliding_window=False))
    assert flat.sliding_windows == (None, None) and flat.causal_layers == (True, False)


def test_target_hidden_size_is_the_drafts_or_absent():
    assert read(edit(V1, target_hidden_size=64)) == WANT_V1
    assert read(edit(V1, target_hidden_size=None)) == WANT_V1
    with pytest.raises(CheckpointError, match="target_hidden_size=128 differs from the draft's "
                                              "hidden_size=64"):
        read(edit(V1, target_hidden_size=128))
