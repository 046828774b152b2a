"""Tiny random target / draft pairs built in memory (float64 by default) for engine tests."""

from __future__ import annotations

import torch

from dflash2rt.models.config import TargetConfig
from dflash2rt.models.draft import DraftModel
from dflash2rt.models.draft_config import DraftConfig
from dflash2rt.models.pair import ModelPair
from dflash2rt.models.target import TargetModel

VOCAB, HIDDEN, MASK = 61, 32, 60


def target_dict(model_type: str = "qwen3", vocab: int = VOCAB, hidden: int = HIDDEN,
                layers: int = 3) -> dict:
    return {"model_type": model_type, "vocab_size": vocab, "hidden_size": hidden,
            "intermediate_size": 2 * hidden + 8, "num_hidden_layers": layers,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": hidden // 4,
            "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 512,
            "tie_word_embeddings": False, "eos_token_id": None}


def draft_dict(variant: str = "dflash2", block: int = 8, layers: int = 2, taps=(0, 2),
               vocab: int = VOCAB, hidden: int = HIDDEN, top_k: int = 4) -> dict:
    d = target_dict("qwen3", vocab, hidden, layers)
    d.pop("tie_word_embeddings")
    d["architectures"] = ["DFlash2DraftModel" if variant == "dflash2" else "DFlashDraftModel"]
    dc = {"block_size": block, "mask_token_id": MASK, "target_layer_ids": list(taps)}
    if variant == "dflash2":
        dc.update(conv_kernel_size=3, conv_group_size=8, selector_rank=6, selector_top_k=top_k,
                  output_multiplier=0.5, final_logit_softcapping=10.0)
    d["dflash_config"] = dc
    return d


def _randomise(module: torch.nn.Module, gen: torch.Generator, scale: float = 0.3) -> None:
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
            else:
                p.copy_(scale * torch.randn(p.shape, generator=gen, dtype=p.dtype))


def tiny_pair(variant: str = "dflash2", block: int = 8, seed: int = 0, model_type: str = "qwen3",
              dtype: torch.dtype = torch.float64, draft_seed: int | None = None) -> ModelPair:
    gen = torch.Generator().manual_seed(seed)
    dcfg = DraftConfig.from_dict(draft_dict(variant, block))
    target = TargetModel(TargetConfig.from_dict(target_dict(model_type)),
                         dcfg.target_layer_ids).to(dtype)
    _randomise(target, gen, 0.3)
    draft = DraftModel(dcfg).to(dtype)
    _randomise(draft, torch.Generator().manual_seed(seed + 1 if draft_seed is None
                                                    else draft_seed))
    target.requires_grad_(False)
    draft.requires_grad_(False)
    return ModelPair(target.eval(), draft.eval())


def successor(x: int, vocab: int) -> int:
    """The permutation the oracle target follows greedily."""
    return (5 * x + 3) % vocab


def oracle_pair(block: int = 8, dtype: torch.dtype = torch.float64, alpha: float = 20.0
                ) -> ModelPair:
    """A bigram target (greedy next token = successor(x)) and a DFlash2 draft whose lattice
    encodes that bigram exactly, so every greedy draft is accepted (τ = block size).

    Target: one-hot embeddings, attention and MLP outputs zeroed, LM head row y = e_{x : f(x)=y}.
    Draft: sublayers output zero, mask rows normalise to √H·e_mask, hidden_projection maps that
    to P = 1, codebooks A[x] = α·e_x and Bc[y] = e_{f⁻¹(y)} give edge score α·[y = f(prev)].
    """
    vocab, hidden = 29, 32
    mask = vocab - 1
    d = draft_dict("dflash2", block, layers=1, taps=(0, 1), vocab=vocab, hidden=hidden,
                   top_k=vocab)
    d["dflash_config"].update(mask_token_id=mask, selector_rank=vocab, output_multiplier=0.1,
                              final_logit_softcapping=1.0)
    dcfg = DraftConfig.from_dict(d)
    target = TargetModel(TargetConfig.from_dict(target_dict("qwen3", vocab, hidden, 2)),
                         dcfg.target_layer_ids).to(dtype)
    draft = DraftModel(dcfg).to(dtype)
    inv = [0] * vocab
    for x in range(vocab):
        inv[successor(x, vocab)] = x
    with torch.no_grad():
        for p in (*target.parameters(), *draft.parameters()):
            p.zero_()
        for name, p in (*target.named_parameters(), *draft.named_parameters()):
            if "norm" in name:
                p.fill_(1.0)
        target.model.embed_tokens.weight[:, :vocab] = torch.eye(vocab, dtype=dtype)
        for y in range(vocab):
            target.lm_head.weight[y, inv[y]] = 1.0
        for layer in draft.layers:
            layer.attention_conv.base_kernel[:, 0] = 1.0
            layer.mlp_conv.base_kernel[:, 0] = 1.0
        sel = draft.candidate_selector
        sel.hidden_projection.weight[:, mask] = hidden ** -0.5
        sel.predecessor_codebook.copy_(alpha * torch.eye(vocab, dtype=dtype))
        for y in range(vocab):
            sel.successor_codebook[y, inv[y]] = 1.0
    target.requires_grad_(False)
    draft.requires_grad_(False)
    return ModelPair(target.eval(), draft.eval())


def char_tokenizer_json(vocab: int = VOCAB) -> str:
    """A character-level tokenizer.json over ``vocab`` ids (letters, digits, punctuation)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789 .,:;()=+-*/\n_'\"[]{}<>!?#@"
    chars = {c: i for i, c in enumerate(alphabet[:vocab - 2])}
    chars["<unk>"], chars["<eos>"] = vocab - 2, vocab - 1
    tok = Tokenizer(models.WordLevel(vocab=chars, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return tok.to_str()


def save_pair_dir(root, pair: ModelPair, with_tokenizer: bool = True):
    """Write ``root/target`` (HF format, optional tokenizer.json) and ``root/draft``."""
    from pathlib import Path

    from dflash2rt.models.draft_loader import save_draft
    from dflash2rt.models.hf_loader import save_target

    root = Path(root)
    save_target(pair.target, None, root / "target")
    save_draft(pair.draft, root / "draft")
    if with_tokenizer:
        (root / "target" / "tokenizer.json").write_text(char_tokenizer_json())
    return root


def fixed_policy(block: int, **kw):
    """An adaptive policy over ``block``'s default candidates with a fixed cost table in which
    each doubling of the block costs a little more: every block size can win, from the
    acceptance the run observes and never from the machine's timings (a measured policy
    follows them: a test asserting what adaptive chose must not)."""
    from dflash2rt.engine.policy.adaptive import AdaptivePolicy
    from dflash2rt.engine.policy.schedule import default_candidates

    cands = default_candidates(block)
    return AdaptivePolicy(cands, {b: 1.0 + 0.15 * b.bit_length() for b in cands}, **kw)
