"""Tiny random transformers Qwen3/Llama checkpoints and a float64 HF oracle for target-model parity tests."""

from __future__ import annotations

import json
from pathlib import Path
from types import MethodType
from typing import Any

import torch

TINY = dict(
    vocab_size=97, hidden_size=64, intermediate_size=112, num_attention_heads=4, num_key_value_heads=2, head_dim=16
)

# name -> (model_type, config kwargs); every rope type we support and both bias/tying options appear.
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "qwen3": ("qwen3", dict(num_hidden_layers=2)),
    "qwen3-tied-bias": ("qwen3", dict(num_hidden_layers=2, tie_word_embeddings=True, attention_bias=True)),
    "qwen3-linear-v4cfg": ("qwen3", dict(num_hidden_layers=2, rope_theta=5000.0,
                                         rope_scaling={"rope_type": "linear", "factor": 2.0})),
    "llama-bias": ("llama", dict(num_hidden_layers=3, attention_bias=True, mlp_bias=True)),
    "llama3": ("llama", dict(num_hidden_layers=3, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16})),
    "yarn": ("llama", dict(num_hidden_layers=3, max_position_embeddings=1024, rope_scaling={
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256})),
}


def _hf_classes(model_type: str) -> tuple[type, type]:
    import transformers

    if model_type == "qwen3":
        return transformers.Qwen3Config, transformers.Qwen3ForCausalLM
    return transformers.LlamaConfig, transformers.LlamaForCausalLM


def write_checkpoint(case: str, path: Path, seed: int = 0) -> Path:
    """save_pretrained a random tiny model; the v4cfg case rewrites config.json in transformers-4 style."""
    model_type, extra = CASES[case]
    config_cls, model_cls = _hf_classes(model_type)
    kwargs = {**TINY, **extra}
    torch.manual_seed(seed)
    model = model_cls(config_cls(**kwargs))
    with torch.no_grad():  # weights far from init, so norms, biases and attention all matter
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            else:
                p.copy_(0.15 * torch.randn_like(p))
    model.save_pretrained(path, safe_serialization=True)
    if case.endswith("v4cfg"):
        cfg = json.loads((path / "config.json").read_text())
        cfg.pop("rope_parameters")
        cfg["rope_theta"], cfg["rope_scaling"] = kwargs["rope_theta"], kwargs["rope_scaling"]
        (path / "config.json").write_text(json.dumps(cfg))
    return path


def _rmsnorm_forward(self: Any, x: torch.Tensor) -> torch.Tensor:
    h = x.to(torch.promote_types(x.dtype, torch.float32))
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
    return self.weight * h.to(x.dtype)


def _rope_forward(self: Any, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    cdt = torch.promote_types(x.dtype, torch.float32)
    freqs = position_ids[..., None].to(cdt) * self.inv_freq.to(device=x.device, dtype=cdt)
    emb = torch.cat((freqs, freqs), dim=-1)
    return (emb.cos() * self.attention_scaling).to(x.dtype), (emb.sin() * self.attention_scaling).to(x.dtype)


def load_hf_oracle(path: Path) -> torch.nn.Module:
    """The HF model in float64 with its float32 islands widened to the input dtype.

    transformers casts RMSNorm inputs and rope angles to float32 unconditionally (a no-op for float32,
    an upcast for bf16); in float64 that would be a downcast. The patches compute in
    promote(dtype, float32) instead: identical for fp32/bf16, exact float64 for float64. Attention runs
    through torch SDPA, which stays in float64.
    """
    import transformers

    major = int(transformers.__version__.split(".")[0])
    dtype_kw = {"dtype" if major >= 5 else "torch_dtype": torch.float64}  # `dtype` is the 5.x spelling
    model = transformers.AutoModelForCausalLM.from_pretrained(path, attn_implementation="sdpa", **dtype_kw)
    for module in model.modules():
        name = type(module).__name__
        if name.endswith("RMSNorm"):
            module.forward = MethodType(_rmsnorm_forward, module)
        elif name.endswith("RotaryEmbedding"):
            module.forward = MethodType(_rope_forward, module)
    return model.eval()


@torch.no_grad()
def hf_run(model: torch.nn.Module, ids: list[int]) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """Logits [n, V] and hidden_states (each [n, H]) of one unpadded sequence."""
    out = model(input_ids=torch.tensor([ids]), output_hidden_states=True)
    return out.logits[0], tuple(h[0] for h in out.hidden_states)
