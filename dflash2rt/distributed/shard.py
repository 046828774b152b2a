"""Tensor-parallel target: the loaded ``TargetModel`` sharded in place over a TPGroup.

Megatron-style, on the target's own modules and code paths (models/target.py, layers.py run
unchanged on the shards):

- attention: q_proj / k_proj / v_proj keep the rows of this rank's heads (column-parallel),
  sharded **by KV head**: rank r holds KV heads [r·kv/tp, (r+1)·kv/tp) and the query heads
  that read them (contiguous GQA groups), so its KV cache holds kv/tp heads; o_proj keeps the
  matching columns (row-parallel) and its output is all-reduced (one all-reduce per layer);
- MLP: gate_proj / up_proj keep rows [r·I/tp, (r+1)·I/tp), down_proj those columns; its output
  is all-reduced (one all-reduce);
- row-parallel biases stay on rank 0 only (the all-reduce adds them once);
- LM head: vocabulary-parallel, rank r holds rows [r·⌈V/tp⌉, (r+1)·⌈V/tp⌉) (the last shard
  zero-padded), and the full logits [.., V] are all-gathered for every row the head is asked
  for: the target computes the head only for the rows that need logits (``logits_at``), and
  the draft's selector gets full logits from the same module. Gathering full logits is the
  simplest correct choice (every sampling and verify op runs unchanged on every rank); a
  sharded top-k / softmax would move less data;
- embedding, norms and rope: replicated. A tied LM head is untied (its shard is a copy).

After the all-reduce every rank holds the same hidden states (an all-reduce ends with the same
sum on every rank), so the taps the replicated draft reads, the logits and every decision
derived from them are identical on every rank.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist
from torch import nn

from ..errors import DistributedError
from ..models.config import TargetConfig
from ..models.layers import Attention, SwiGLU
from ..models.target import TargetModel
from .group import TPGroup


def check_shardable(cfg: TargetConfig, tp: int) -> None:
    """Typed error unless ``cfg`` shards over ``tp`` ranks (by KV head, and the MLP)."""
    if tp < 1:
        raise DistributedError(f"tp must be >= 1, got {tp}")
    if cfg.num_key_value_heads % tp:
        raise DistributedError(
            f"num_key_value_heads={cfg.num_key_value_heads} is not divisible by tp={tp}: the "
            "target's heads and KV cache are sharded by KV head; use a tp that divides it")
    if cfg.intermediate_size % tp:
        raise DistributedError(f"intermediate_size={cfg.intermediate_size} is not divisible by "
                               f"tp={tp}; use a tp that divides it")


def _rows(w: torch.Tensor, start: int, n: int) -> torch.Tensor:
    return w.detach()[start:start + n].clone()


def _cols(w: torch.Tensor, start: int, n: int) -> torch.Tensor:
    return w.detach()[:, start:start + n].clone()


def _set(lin: nn.Linear, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    lin.weight = nn.Parameter(weight, requires_grad=False)
    lin.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
    lin.out_features, lin.in_features = weight.shape


def _all_reduce_output(tp: TPGroup):
    def hook(_module, _inputs, out: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(out, group=tp.group)      # the row-parallel partial sums → the sum
        return out
    return hook


def _row_parallel(lin: nn.Linear, tp: TPGroup, start: int, n: int) -> None:
    """Keep input columns [start, start + n); bias on rank 0 only; all-reduce the output."""
    bias = lin.bias.detach().clone() if lin.bias is not None and tp.rank == 0 else None
    _set(lin, _cols(lin.weight, start, n), bias)
    lin.register_forward_hook(_all_reduce_output(tp))


def _column_parallel(lin: nn.Linear, start: int, n: int) -> None:
    bias = None if lin.bias is None else _rows(lin.bias, start, n)
    _set(lin, _rows(lin.weight, start, n), bias)


def shard_attention(a: Attention, tp: TPGroup) -> None:
    kv, nh, hd = a.n_kv_heads // tp.world, a.n_heads // tp.world, a.head_dim
    _column_parallel(a.q_proj, tp.rank * nh * hd, nh * hd)
    _column_parallel(a.k_proj, tp.rank * kv * hd, kv * hd)
    _column_parallel(a.v_proj, tp.rank * kv * hd, kv * hd)
    _row_parallel(a.o_proj, tp, tp.rank * nh * hd, nh * hd)
    a.n_heads, a.n_kv_heads = nh, kv


def shard_mlp(m: SwiGLU, tp: TPGroup) -> None:
    n = m.gate_proj.out_features // tp.world
    _column_parallel(m.gate_proj, tp.rank * n, n)
    _column_parallel(m.up_proj, tp.rank * n, n)
    _row_parallel(m.down_proj, tp, tp.rank * n, n)


class VocabParallelHead(nn.Module):
    """The LM head's vocabulary shard of this rank (``local``, an nn.Linear a backend's model
    pass may pack), whose outputs are all-gathered into the full logits [..., V]."""

    def __init__(self, weight: torch.Tensor, vocab: int, tp: TPGroup) -> None:
        super().__init__()
        per = -(-vocab // tp.world)                      # ⌈V / tp⌉ rows per rank
        shard = weight.detach()[tp.rank * per:(tp.rank + 1) * per]
        padded = shard.new_zeros(per, weight.shape[1])
        padded[:shard.shape[0]] = shard
        self.local = nn.Linear(weight.shape[1], per, bias=False,
                               device=weight.device, dtype=weight.dtype)
        self.local.weight = nn.Parameter(padded, requires_grad=False)
        self.vocab, self.tp = vocab, tp

    @property
    def weight(self) -> torch.Tensor:
        """The local shard [⌈V/tp⌉, H] (its dtype and device are the model's)."""
        return self.local.weight

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        part = self.local(h).contiguous()                # [..., ⌈V/tp⌉]
        parts = [torch.empty_like(part) for _ in range(self.tp.world)]
        dist.all_gather(parts, part, group=self.tp.group)
        return torch.cat(parts, dim=-1)[..., :self.vocab]  # [..., V]


def shard_target(target: TargetModel, tp: TPGroup) -> TargetModel:
    """Shard ``target`` in place over ``tp`` (module docstring) → it. ``target.cfg`` becomes
    the rank's local architecture (heads, KV heads, intermediate size divided by tp: what its
    KV cache and checks see); ``target.full_cfg`` keeps the checkpoint's."""
    cfg = target.cfg
    check_shardable(cfg, tp.world)
    if getattr(target, "full_cfg", None) is not None:
        raise DistributedError("this target is already sharded")
    head = target.lm_head.weight
    for layer in target.model.layers:
        shard_attention(layer.self_attn, tp)
        shard_mlp(layer.mlp, tp)
    target.lm_head = VocabParallelHead(head, cfg.vocab_size, tp)   # unties a tied head
    target.full_cfg = cfg
    target.cfg = dataclasses.replace(
        cfg, num_attention_heads=cfg.num_attention_heads // tp.world,
        num_key_value_heads=cfg.num_key_value_heads // tp.world,
        intermediate_size=cfg.intermediate_size // tp.world)
    return target
