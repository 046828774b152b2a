"""Every published draft layout (docs/models.md, "Draft formats"): a synthetic pair in exactly
that layout (``dflash2rt synth --draft-format F --layout L``, toy sizes) loads through
``dflash2rt.run`` with no flag but its path, greedy speculative decoding equals target-only
decoding, and ``dflash2rt inspect --json`` names its format. Then the attention rules of the
draft layers (sliding windows, causal layers), the speculators format's tap offset and d2t
convention, and a reduced draft vocabulary at T = 1 (exact by the conformance criterion)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import dflash2rt
from dflash2rt.cli import main
from dflash2rt.errors import CheckpointError
from dflash2rt.models.draft import DraftModel
from dflash2rt.models.draft_config import DraftConfig
from dflash2rt.models.draft_config_write import draft_config_dict
from dflash2rt.models.draft_loader import load_draft
from dflash2rt.synth import synthesize

from tiny_models import draft_dict

VARIANTS = [   # (shape, draft format, layout, draft vocabulary, the format inspect reports)
    ("toy-qwen3", "dflash2", "published", None, "dflash2"),
    ("toy-qwen3", "dflash2", "codebook-weight", None, "dflash2"),
    ("toy-qwen3", "dflash2", "mixed-attention", None, "dflash2"),
    ("toy-llama3", "dflash", "block-at-top", None, "dflash"),
    ("toy-qwen3", "dflash", "nested", None, "dflash"),
    ("toy-qwen3", "speculators", "dflash", None, "speculators"),
    ("toy-llama3", "speculators", "dflash", 300, "speculators"),
    ("toy-qwen3", "speculators", "dflash2", None, "speculators"),
]


@pytest.fixture(scope="module")
def synth_root(tmp_path_factory):
    return tmp_path_factory.mktemp("formats")


def _pair(root: Path, shape, fmt, layout, vocab) -> Path:
    out = root / f"{shape}-{fmt}-{layout}-{vocab}"
    if not out.exists():
        synthesize(shape, out, seed=2, layers=2, draft_layers=2, draft_format=fmt,
                   layout=layout, draft_vocab=vocab)
    return out


@pytest.mark.parametrize("shape,fmt,layout,vocab,reported", VARIANTS,
                         ids=[f"{v[1]}-{v[2]}-{v[0]}" + (f"-v{v[3]}" if v[3] else "")
                              for v in VARIANTS])
def test_each_layout_loads_decodes_losslessly_and_is_inspected(synth_root, shape, fmt, layout,
                                                               vocab, reported, capsys):
    out = _pair(synth_root, shape, fmt, layout, vocab)
    raw = json.loads((out / "draft" / "config.json").read_text())
    tensors = set(_names(out / "draft"))
    if layout == "block-at-top":
        assert "block_size" in raw and "block_size" not in raw["dflash_config"]
    if layout == "codebook-weight":
        assert "candidate_selector.predecessor_codebook.weight" in tensors
    if layout == "published":
        assert "candidate_selector.predecessor_codebook" in tensors
    if fmt == "speculators":
        assert raw["aux_hidden_state_layer_ids"] == [i + 1 for i in
                                                     DraftConfig.from_dict(raw).target_layer_ids]
        assert {"embed_tokens.weight", "lm_head.weight"} <= tensors
        assert ({"d2t", "t2d"} <= tensors) == bool(vocab)
    kw = dict(prompts=[[3, 17, 5, 900, 41, 7]], max_new_tokens=10, backend="cpu")
    spec = dflash2rt.run(str(out), block_size=4, **kw)
    ref = dflash2rt.run(str(out), spec=False, **kw)
    assert spec.tokens == ref.tokens and len(ref.tokens[0]) == 10
    assert spec.stats.mode == "spec" and spec.stats.num_drafts > 0
    capsys.readouterr()
    assert main(["inspect", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["format"] == reported and report["runnable"] is True
    assert report["draft"]["draft_vocab"] == (vocab or report["target"]["vocab"])


def _names(path: Path):
    from safetensors import safe_open

    with safe_open(str(path / "model.safetensors"), framework="pt") as f:
        return list(f.keys())


def test_speculators_tap_offset_and_d2t_convention(synth_root):
    """aux_hidden_state_layer_ids are hidden-state indices (0 = embeddings): tap i is aux i + 1
    (speculators' converter, vLLM's update_dflash); the draft's logit for draft id i lands on
    target id i + d2t[i] (vLLM's compute_logits), −inf on every other id."""
    out = _pair(synth_root, "toy-llama3", "speculators", "dflash", 300)
    draft, cfg = load_draft(out / "draft", torch.float32)
    raw = json.loads((out / "draft" / "config.json").read_text())
    assert list(cfg.target_layer_ids) == [a - 1 for a in raw["aux_hidden_state_layer_ids"]]
    assert cfg.reduced_vocab and cfg.draft_vocab_size == 300 and cfg.own_embedding
    h = torch.randn(1, 2, cfg.arch.hidden_size)
    own = draft.lm_head(h)
    placed = draft.logits(h, target=None)
    ids = torch.arange(300) + draft.d2t
    assert torch.equal(placed[..., ids], own)
    assert torch.isneginf(placed).sum() == 2 * (cfg.arch.vocab_size - 300)
    assert torch.equal(draft.t2d.nonzero().view(-1), ids.sort().values)


def test_bad_vocab_mappings_are_refused(synth_root, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    src = _pair(synth_root, "toy-llama3", "speculators", "dflash", 300)
    for edit, message in [(lambda s: s["d2t"].__setitem__(0, 5000), "outside"),
                          (lambda s: s["d2t"].__setitem__(1, s["d2t"][0] - 1), "same target id"),
                          (lambda s: s["t2d"].__setitem__(0, ~s["t2d"][0]), "t2d does not mark")]:
        shutil.rmtree(tmp_path / "d", ignore_errors=True)
        shutil.copytree(src / "draft", tmp_path / "d")
        state = load_file(str(tmp_path / "d" / "model.safetensors"))
        edit(state)
        save_file(state, str(tmp_path / "d" / "model.safetensors"))
        with pytest.raises(CheckpointError, match=message):
            load_draft(tmp_path / "d")


def test_speculators_refusals():
    base = draft_config_dict(DraftConfig.from_dict(draft_dict("dflash1")), "speculators")
    for key, value, message in [("projector_type", "domino", "Domino"),
                                ("shift_label", True, "another block layout"),
                                ("speculators_model_type", "eagle3", "not other algorithms"),
                                ("aux_hidden_state_layer_ids", [0, 2], "embedding output"),
                                ("some_new_key", 1, "not understood")]:
        with pytest.raises(CheckpointError, match=message):
            DraftConfig.from_dict({**base, key: value})
    v2 = draft_config_dict(DraftConfig.from_dict(draft_dict("dflash2")), "speculators")
    with pytest.raises(CheckpointError, match="reduced vocabulary"):
        DraftConfig.from_dict({**v2, "draft_vocab_size": 20})


def test_layer_attention_rules_of_each_layout():
    d = draft_dict("dflash2", layers=3)
    assert DraftConfig.from_dict(d).causal_layers == (False,) * 3      # no layer_types: full
    mixed = {**d, "use_sliding_window": True, "sliding_window": 5,
             "layer_types": ["sliding_attention", "full_attention", "sliding_attention"]}
    cfg = DraftConfig.from_dict(mixed)                                  # z-lab: sliding causal
    assert cfg.sliding_windows == (5, None, 5) and cfg.causal_layers == (True, False, True)
    assert DraftConfig.from_dict({**mixed, "is_causal": False}).causal_layers == (False,) * 3
    assert DraftConfig.from_dict({**mixed, "is_causal": True}).causal_layers == (True,) * 3
    for c in (cfg, replace(cfg, causal_layers=(False,) * 3)):
        for fmt in ("dflash2", "speculators"):
            assert DraftConfig.from_dict(draft_config_dict(c, fmt)) == replace(
                c, source_format=fmt, own_head=fmt == "speculators",
                draft_vocab_size=c.arch.vocab_size if fmt == "speculators" else 0,
                num_target_layers=c.num_target_layers)


def _draft_forward(cfg, ctx_len=12, block=4, seed=0, perturb=None):
    """The draft's block hidden [1, B, H] after ``ctx_len`` committed rows of random context;
    ``perturb(cache, emb)`` edits the context K/V or the block inputs first."""
    from dflash2rt import get_backend

    torch.manual_seed(seed)
    model = DraftModel(cfg).double()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    cache = model.empty_cache(1, 32, torch.float64, "cpu")
    torch.manual_seed(seed + 1)
    for k in cache.k:
        k.normal_()
    for v in cache.v:
        v.normal_()
    emb = torch.randn(1, block, cfg.arch.hidden_size, dtype=torch.float64)
    if perturb is not None:
        perturb(cache, emb)
    lens = torch.tensor([ctx_len])
    pos = lens.view(1, 1) + torch.arange(block)
    with torch.no_grad():
        return model(emb, pos, cache, lens, get_backend("cpu"))


def test_sliding_windows_and_causal_layers_are_honoured():
    """A sliding layer reads only the last ``sliding_window`` positions of the context (the
    draft's context is the whole sequence, so it does exceed the window); a causal layer's block
    row reads no later block row; a full non-causal layer reads everything."""
    base = {**draft_dict("dflash1", layers=2), "use_sliding_window": True, "sliding_window": 6}
    sliding = DraftConfig.from_dict({**base, "layer_types": ["sliding_attention"] * 2,
                                     "is_causal": False})
    full = DraftConfig.from_dict({**base, "layer_types": ["full_attention"] * 2})
    causal = DraftConfig.from_dict({**base, "layer_types": ["sliding_attention"] * 2})

    def old_context(cache, emb):            # position 0: outside every block row's window of 6
        for k in cache.k:
            k[:, 0] += 5

    def last_block_row(cache, emb):
        emb[:, -1] += 5

    for cfg, old_matters, later_matters in [(sliding, False, True), (full, True, True),
                                            (causal, False, False)]:
        ref = _draft_forward(cfg)
        a = _draft_forward(cfg, perturb=old_context)
        b = _draft_forward(cfg, perturb=last_block_row)
        assert (not torch.equal(a, ref)) == old_matters
        assert (not torch.equal(b[:, :-1], ref[:, :-1])) == later_matters


@pytest.mark.slow                       # runs the conformance suite in a subprocess
def test_reduced_vocab_t1_is_exact_by_the_conformance_criterion():
    """The conformance suite's reduced-vocabulary levels (L1 mapping, L2 proposal law, L3 joint
    law sampled at T = 1 and greedy) on the CPU backend, small sizes."""
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(root / "conformance")])}
    res = subprocess.run([sys.executable, "-m", "dflash2rt", "conformance", "--backend", "cpu",
                          "--small", "-k", "reduced_vocab"], capture_output=True, text=True,
                         env=env, cwd=root, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    assert "7 passed" in res.stdout
