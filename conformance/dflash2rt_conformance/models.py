"""Model pairs for the step and end-to-end levels, and their NumPy views for the reference.

``tiny_pair`` builds a small random Qwen3/Llama target and DFlash2 draft in memory (the suite
never imports the project's tests/). ``l4_pair`` resolves ``--dflash2rt-model``: ``auto`` uses
the bundled pair when ``dflash2rt.bundled`` has one (a load failure then fails L4 with the
error: it never degrades silently), the tiny pair only when no bundled pair is installed;
``tiny`` asks for the tiny pair. ``describe_l4`` names the choice for every report.
"""

from __future__ import annotations

import torch

from dflash2rt.models.config import TargetConfig
from dflash2rt.models.draft import DraftModel
from dflash2rt.models.draft_config import DraftConfig
from dflash2rt.models.pair import ModelPair
from dflash2rt.models.target import TargetModel

VOCAB, HIDDEN = 61, 32                      # a prime vocabulary, not a multiple of 16


def target_dict(model_type: str, layers: int = 3, vocab: int = VOCAB) -> dict:
    """The tiny target's config.json (a Qwen3 or Llama ``model_type``)."""
    return {"model_type": model_type, "vocab_size": vocab, "hidden_size": HIDDEN,
            "intermediate_size": 2 * HIDDEN + 8, "num_hidden_layers": layers,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": HIDDEN // 4,
            "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 512,
            "tie_word_embeddings": False, "eos_token_id": None}


def _draft_dict(block: int, taps=(0, 2), conv_taps: int = 2, top_k: int = 4,
                vocab: int = VOCAB) -> dict:
    d = target_dict("qwen3", 2, vocab)
    d.pop("tie_word_embeddings")
    d["architectures"] = ["DFlash2DraftModel"]
    d["dflash_config"] = {"block_size": block, "mask_token_id": vocab - 1,
                          "target_layer_ids": list(taps), "conv_kernel_size": conv_taps,
                          "conv_group_size": 8, "selector_rank": 6, "selector_top_k": top_k,
                          "output_multiplier": 0.5, "final_logit_softcapping": 10.0}
    return d


def _randomise(module: torch.nn.Module, seed: int, scale: float) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g, dtype=torch.float64))
            else:
                p.copy_(scale * torch.randn(p.shape, generator=g, dtype=torch.float64))


def tiny_pair(seed: int = 0, dtype: torch.dtype = torch.float64, model_type: str = "qwen3",
              block: int = 8, conv_taps: int = 2, top_k: int = 4, vocab: int = VOCAB
              ) -> ModelPair:
    dcfg = DraftConfig.from_dict(_draft_dict(block, conv_taps=conv_taps, top_k=top_k,
                                             vocab=vocab))
    target = TargetModel(TargetConfig.from_dict(target_dict(model_type, vocab=vocab)),
                         dcfg.target_layer_ids).double()
    draft = DraftModel(dcfg).double()
    _randomise(target, seed, 0.3)
    _randomise(draft, seed + 1, 0.3)
    target, draft = target.to(dtype).eval(), draft.to(dtype).eval()
    target.requires_grad_(False)
    draft.requires_grad_(False)
    return ModelPair(target, draft, name=f"tiny-{model_type}-seed{seed}")


TINY = f"tiny random pair (Qwen3 target and DFlash2 draft, V={VOCAB}, H={HIDDEN}, seed 0"


def bundled_default() -> tuple[str | None, str]:
    """(the bundled pair ``auto`` uses, "") or (None, why no bundled pair is installed)."""
    try:
        from dflash2rt import api, bundled
    except ImportError as exc:
        return None, f"dflash2rt.bundled cannot be imported: {exc}"
    names = bundled.bundled_models()
    if not names:
        return None, "dflash2rt.bundled holds no model pair"
    return (api.DEFAULT_MODEL if api.DEFAULT_MODEL in names else names[0]), ""


def describe_l4(option: str) -> str:
    """What ``--dflash2rt-model option`` runs at L4, without loading it (header, reports)."""
    if option == "tiny":
        return f"{TINY}; asked for: --dflash2rt-model tiny)"
    if option == "auto":
        name, why = bundled_default()
        return f"bundled {name!r}" if name else f"{TINY}; {why})"
    return option


def l4_pair(option: str, device, dtype: torch.dtype = torch.float32) -> tuple[ModelPair, str]:
    """(pair, description) for ``--dflash2rt-model``. Raises when the pair asked for (or, for
    ``auto``, the installed bundled pair) cannot be loaded."""
    desc = describe_l4(option)
    if option == "tiny" or (option == "auto" and desc.startswith("tiny")):
        return pair_on(tiny_pair(0, dtype), device), f"{desc} ({dtype})"
    from dflash2rt import api

    name = bundled_default()[0] if option == "auto" else option
    try:
        return api.resolve_model(name, device, dtype), f"{desc} ({dtype})"
    except Exception as exc:
        what = "the bundled pair" if option == "auto" else "the L4 model"
        raise RuntimeError(f"{what} {name!r} cannot be loaded ({type(exc).__name__}: {exc}); "
                           "L4 does not fall back: fix it, or run the tiny random pair with "
                           "--dflash2rt-model tiny (named in every report)") from exc


def pair_on(pair: ModelPair, device) -> ModelPair:
    """``pair`` with its models moved to ``device`` (the same tokenizer and name)."""
    return ModelPair(pair.target.to(device), pair.draft.to(device), pair.tokenizer, pair.name)


def target_reference(model: TargetModel) -> tuple[dict, dict]:
    """(float64 NumPy weights, reference config) of a target."""
    c = model.cfg
    w = {k: v.detach().double().cpu().numpy() for k, v in model.state_dict().items()}
    cfg = {"layers": c.num_hidden_layers, "heads": c.num_attention_heads,
           "kv_heads": c.num_key_value_heads, "head_dim": c.head_dim, "eps": c.rms_norm_eps,
           "qk_norm": c.qk_norm, "config": c.to_dict()}   # rope: reference.rope from config
    return w, cfg


def draft_reference(model: DraftModel) -> tuple[dict, dict]:
    d, a = model.cfg, model.cfg.arch
    if any(x is not None for x in d.sliding_windows):
        raise NotImplementedError("the reference draft has no sliding-window attention")
    w = {k: v.detach().double().cpu().numpy() for k, v in model.state_dict().items()}
    cfg = {"layers": a.num_hidden_layers, "heads": a.num_attention_heads,
           "kv_heads": a.num_key_value_heads, "head_dim": a.head_dim, "eps": a.rms_norm_eps,
           "qk_norm": True, "config": a.to_dict(),          # rope: reference.rope from config
           "taps": tuple(d.target_layer_ids), "block": d.block_size, "mask": d.mask_token_id,
           "scale": d.input_embedding_scale, "conv": d.variant == "dflash2",
           "selector": None if d.variant != "dflash2" else {
               "top_k": d.selector_top_k, "output_multiplier": d.output_multiplier,
               "softcap": d.final_logit_softcapping}}
    return w, cfg

