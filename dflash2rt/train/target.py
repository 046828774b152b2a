"""Train the small Qwen3 target from scratch by next-token prediction (AdamW, cosine schedule)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..errors import InvalidInputError
from ..models.config import TargetConfig
from ..models.target import TargetModel
from .progress import Progress


@dataclass(frozen=True)
class TargetShape:
    """Deep and narrow: on a CPU a decode step costs about per layer, so 8 layers against a 1-layer
    draft make the spec step cheap relative to a target step (the previous 4 × 256 target against
    a 2-layer draft: a spec step cost ~2.7 target-only steps); ~3.9M params, the training FLOPs
    per token of the previous 4 × 256 shape."""

    hidden: int = 192
    layers: int = 8
    heads: int = 3
    kv_heads: int = 1
    head_dim: int = 64
    intermediate: int = 512
    max_position: int = 1024


def target_config_dict(shape: TargetShape, vocab_size: int, eos_id: int) -> dict:
    """A HF Qwen3 config.json dict (transformers reads it too)."""
    cfg = TargetConfig.from_dict({
        "model_type": "qwen3", "vocab_size": vocab_size, "hidden_size": shape.hidden,
        "intermediate_size": shape.intermediate, "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads, "num_key_value_heads": shape.kv_heads,
        "head_dim": shape.head_dim, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "max_position_embeddings": shape.max_position, "tie_word_embeddings": False,
        "eos_token_id": eos_id, "bos_token_id": None, "pad_token_id": eos_id})
    return cfg.to_dict()


def init_weights(module: torch.nn.Module, gen: torch.Generator, std: float = 0.02,
                 residual_layers: int = 1) -> None:
    """N(0, std) for matrices (output projections scaled by 1/sqrt(2L)), ones for norms."""
    with torch.no_grad():
        for name, p in sorted(module.named_parameters()):
            if name.endswith("norm.weight") or p.dim() == 1:
                p.fill_(1.0)
                continue
            s = std / math.sqrt(2 * residual_layers) if name.endswith(("o_proj.weight",
                                                                          "down_proj.weight")) else std
            p.copy_(torch.randn(p.shape, generator=gen) * s)


def token_stream(docs: list[list[int]], eos_id: int) -> torch.Tensor:
    """Documents joined with EOS after each: [N] int64."""
    flat: list[int] = []
    for ids in docs:
        flat.extend(ids)
        flat.append(eos_id)
    return torch.tensor(flat, dtype=torch.int64)


def sample_windows(stream: torch.Tensor, batch: int, length: int, gen: torch.Generator) -> torch.Tensor:
    """[batch, length] windows at seeded random offsets."""
    if stream.numel() <= length:
        raise InvalidInputError(f"a stream of {stream.numel()} tokens is too short for windows "
                                f"of {length} tokens (it needs at least {length + 1})")
    starts = torch.randint(0, stream.numel() - length, (batch,), generator=gen)
    return torch.stack([stream[s:s + length] for s in starts.tolist()])


def lm_logits(model: TargetModel, ids: torch.Tensor) -> torch.Tensor:
    """Full-sequence causal forward (no cache) with grads: ids [R, T] → logits [R, T, V]."""
    r, t = ids.shape
    pos = torch.arange(t, device=ids.device).expand(r, t)
    return model.forward_full(ids, pos, torch.ones(r, t, dtype=torch.bool, device=ids.device)).logits


def lm_taps(model: TargetModel, seqs: list[list[int]]) -> torch.Tensor:
    """Taps of right-padded sequences: [R, T_max, n_taps, H] (rows past a sequence are garbage)."""
    return lm_forward(model, seqs).taps


def lm_forward(model: TargetModel, seqs: list[list[int]]):
    """One causal forward of right-padded sequences → TargetOutput (logits [R, T_max, V] and taps
    [R, T_max, n_taps, H]; rows past a sequence are garbage)."""
    r, t = len(seqs), max(len(s) for s in seqs)
    dev = model.lm_head.weight.device
    ids = torch.zeros(r, t, dtype=torch.int64)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = torch.tensor(s)
    valid = torch.arange(t).expand(r, t) < torch.tensor([len(s) for s in seqs]).view(r, 1)
    pos = torch.arange(t).expand(r, t)
    return model.forward_full(ids.to(dev), pos.to(dev), valid.to(dev))


def cosine_lr(step: int, total: int, peak: float, warmup: int, floor: float = 0.1) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = (step - warmup) / max(1, total - warmup)
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * frac)))


def make_optimizer(model: torch.nn.Module, lr: float, weight_decay: float,
                   no_decay: tuple[str, ...] = ("embed_tokens",)) -> torch.optim.AdamW:
    """AdamW; matrices decay, vectors and ``no_decay`` names do not."""
    decay, keep = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (keep if p.dim() < 2 or any(k in name for k in no_decay) else decay).append(p)
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                              {"params": keep, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.95))


def train_target(model: TargetModel, stream: torch.Tensor, steps: int, batch: int, seq_len: int,
                 lr: float, seed: int, every: int = 20) -> list[float]:
    """Next-token training on random windows of ``stream``; returns the per-step losses."""
    gen = torch.Generator().manual_seed(seed)
    opt = make_optimizer(model, lr, 0.1)
    model.train().requires_grad_(True)
    prog = Progress("target", steps, every)
    losses = []
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = cosine_lr(step, steps, lr, min(100, steps // 10 + 1))
        win = sample_windows(stream, batch, seq_len + 1, gen)           # [R, T + 1]
        logits = lm_logits(model, win[:, :-1])                           # [R, T, V]
        loss = F.cross_entropy(logits.flatten(0, 1), win[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        prog.step(step + 1, batch * seq_len, loss=sum(losses[-every:]) / len(losses[-every:]),
                  lr=opt.param_groups[0]["lr"])
    model.eval().requires_grad_(False)
    return losses


@torch.no_grad()
def eval_stats(model: TargetModel, stream: torch.Tensor, windows: int, seq_len: int, seed: int
               ) -> dict[str, float]:
    """Mean next-token cross-entropy and mean entropy of the model's law (nats) on seeded windows."""
    gen = torch.Generator().manual_seed(seed)
    loss = ent = 0.0
    for _ in range(windows):
        win = sample_windows(stream, 1, seq_len + 1, gen)
        logp = torch.log_softmax(lm_logits(model, win[:, :-1]).flatten(0, 1).double(), -1)
        loss += -logp.gather(1, win[:, 1:].reshape(-1, 1)).mean().item()
        ent += -(logp.exp() * logp).sum(-1).mean().item()
    return {"loss": loss / windows, "entropy": ent / windows}
