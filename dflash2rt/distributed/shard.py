"""Tensor-parallel target: a ``TargetModel`` sharded over a TPGroup, either sliced in place
after a full load (``shard_target``) or loaded shard by shard from its safetensors files, each
rank reading only its slices (``load_target_shard``). Both go through one ``ShardPlan``.

Megatron-style, on the target's own modules and code paths (models/target.py, layers.py run
unchanged on the shards):

- attention, by **query head**: rank r keeps a contiguous slice of the query heads (sizes
  differing by at most one: the first ``nh % tp`` ranks get one more) in q_proj
  (column-parallel), and the KV heads its query heads read in k_proj / v_proj. When the
  slice's query heads read their KV heads unevenly (tp does not divide the KV heads, or
  exceeds them), a KV head is **replicated** as often as needed for the local query heads to
  form equal GQA groups (group size: the gcd of the counts), so the attention op's GQA rule
  (local query head i reads local KV head i // (nh / n_kv)) holds on every rank; tp > KV heads
  gives each rank the one KV head its queries read, as vLLM replicates them. o_proj keeps the
  matching input columns (row-parallel) and its output is all-reduced (one all-reduce per
  layer). Each rank's KV cache holds its local KV heads;
- MLP: gate_proj / up_proj keep a contiguous slice of the intermediate rows (sizes differing by
  at most one), down_proj those columns; its output is all-reduced (one all-reduce);
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
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from ..errors import CheckpointError, DistributedError
from ..models.config import TargetConfig
from ..models.target import TargetModel
from .group import TPGroup


def check_shardable(cfg: TargetConfig, tp: int) -> None:
    """Typed error unless ``cfg`` shards over ``tp`` ranks: every rank needs at least one
    query head and one intermediate row (KV heads are replicated where tp needs it)."""
    if tp < 1:
        raise DistributedError(f"tp must be >= 1, got {tp}")
    if cfg.num_attention_heads < tp:
        raise DistributedError(
            f"num_attention_heads={cfg.num_attention_heads} is less than tp={tp}: every rank "
            "needs at least one query head; use a smaller tp")
    if cfg.intermediate_size < tp:
        raise DistributedError(f"intermediate_size={cfg.intermediate_size} is less than tp={tp}")


def split(n: int, world: int, rank: int) -> tuple[int, int]:
    """Rank ``rank``'s contiguous slice [lo, hi) of ``n`` items over ``world`` ranks: sizes
    differ by at most one, the first ``n % world`` ranks holding one more."""
    base, extra = divmod(n, world)
    lo = rank * base + min(rank, extra)
    return lo, lo + base + (rank < extra)


@dataclass(frozen=True)
class ShardPlan:
    """What rank ``rank`` of ``world`` holds of a target (module docstring)."""

    rank: int
    world: int
    head_dim: int
    heads: tuple[int, int]          # its query heads [lo, hi)
    kv_heads: tuple[int, ...]       # the checkpoint's KV head of each local KV head (repeats)
    mlp: tuple[int, int]            # its intermediate rows [lo, hi)
    vocab: int                      # the full vocabulary
    vocab_per: int                  # ⌈V / tp⌉: LM-head rows per rank (the last zero-padded)

    @classmethod
    def of(cls, cfg: TargetConfig, rank: int, world: int) -> ShardPlan:
        check_shardable(cfg, world)
        q0, q1 = split(cfg.num_attention_heads, world, rank)
        g = cfg.num_attention_heads // cfg.num_key_value_heads       # query heads per KV head
        counts = [(kv, min(q1, (kv + 1) * g) - max(q0, kv * g))
                  for kv in range(q0 // g, (q1 - 1) // g + 1)]
        local_g = math.gcd(*(c for _, c in counts))                  # the local GQA group size
        kv_heads = tuple(kv for kv, c in counts for _ in range(c // local_g))
        return cls(rank, world, cfg.head_dim, (q0, q1), kv_heads,
                   split(cfg.intermediate_size, world, rank), cfg.vocab_size,
                   -(-cfg.vocab_size // world))

    @property
    def n_heads(self) -> int:
        return self.heads[1] - self.heads[0]

    def local_cfg(self, cfg: TargetConfig) -> TargetConfig:
        """The rank's architecture: what its modules, KV cache and checks see."""
        return dataclasses.replace(cfg, num_attention_heads=self.n_heads,
                                   num_key_value_heads=len(self.kv_heads),
                                   intermediate_size=self.mlp[1] - self.mlp[0])

    def describe(self) -> str:
        """One line: this rank's query heads, KV heads and MLP rows."""
        return (f"rank {self.rank}: query heads [{self.heads[0]}, {self.heads[1]}), KV heads "
                f"{list(self.kv_heads)}, MLP rows [{self.mlp[0]}, {self.mlp[1]})")

    # ---- slicing one tensor (a torch tensor or a safetensors slice: both take [a:b], [:, a:b])

    def _kv_rows(self, src) -> torch.Tensor:
        hd, lo, hi = self.head_dim, min(self.kv_heads), max(self.kv_heads) + 1
        block = _own(src[lo * hd:hi * hd])                          # the KV heads it reads
        if self.kv_heads == tuple(range(lo, hi)):
            return block
        idx = torch.tensor([(kv - lo) * hd + d for kv in self.kv_heads for d in range(hd)])
        return block.index_select(0, idx)

    def local_tensor(self, name: str, src) -> torch.Tensor | None:
        """This rank's part of checkpoint tensor ``name`` from ``src`` (its full tensor or a
        safetensors slice of it: only the part read) → its own tensor, or None (a row-parallel
        bias on ranks other than 0). ``lm_head.weight``: the padded vocabulary shard."""
        hd, (q0, q1), (m0, m1) = self.head_dim, self.heads, self.mlp
        part = _PART.search(name)
        if name == "lm_head.weight":
            per, v0 = self.vocab_per, self.rank * self.vocab_per
            rows = _own(src[v0:min(v0 + per, self.vocab)])
            if rows.shape[0] == per:
                return rows
            padded = rows.new_zeros(per, rows.shape[1])
            padded[:rows.shape[0]] = rows
            return padded
        if part is None:                                            # replicated
            return src.detach() if isinstance(src, torch.Tensor) else _own(src[:])
        module, kind = part.group(1), part.group(2)
        if module == "q_proj":
            return _own(src[q0 * hd:q1 * hd])
        if module in ("k_proj", "v_proj"):
            return self._kv_rows(src)
        if module in ("gate_proj", "up_proj"):
            return _own(src[m0:m1])
        # row-parallel: o_proj, down_proj
        if kind == "bias":
            return _own(src[:]) if self.rank == 0 else None
        lo, hi = (q0 * hd, q1 * hd) if module == "o_proj" else (m0, m1)
        return _own(src[:, lo:hi])


_PART = re.compile(r"\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)\.(weight|bias)$")


def _own(t: torch.Tensor) -> torch.Tensor:
    """A tensor with its own storage (a view of a full weight would keep all of it alive)."""
    return t.detach().clone() if t._base is not None or not t.is_contiguous() else t.detach()


def _all_reduce_output(tp: TPGroup):
    def hook(_module, _inputs, out: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(out, group=tp.group)      # the row-parallel partial sums → the sum
        return out
    return hook


class VocabParallelHead(nn.Module):
    """The LM head's vocabulary shard of this rank (``local``, an nn.Linear [⌈V/tp⌉, H] a
    backend's model pass may pack), whose outputs are all-gathered into the full logits."""

    def __init__(self, hidden: int, vocab: int, tp: TPGroup, dtype: torch.dtype,
                 device: torch.device | str = "meta") -> None:
        super().__init__()
        per = -(-vocab // tp.world)
        self.local = nn.Linear(hidden, per, bias=False, device=device, dtype=dtype)
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


def _meta_linear(lin: nn.Linear, out_f: int, in_f: int, bias: bool) -> None:
    dt = lin.weight.dtype
    lin.weight = nn.Parameter(torch.empty(out_f, in_f, device="meta", dtype=dt),
                              requires_grad=False)
    lin.bias = nn.Parameter(torch.empty(out_f, device="meta", dtype=dt),
                            requires_grad=False) if bias else None
    lin.out_features, lin.in_features = out_f, in_f


def _restructure(target: TargetModel, plan: ShardPlan, tp: TPGroup) -> None:
    """Give ``target``'s modules the rank's shapes (empty meta weights, filled by
    ``load_state_dict(assign=True)`` next), the all-reduce hooks and the vocabulary head."""
    cfg, hd = target.cfg, plan.head_dim
    nq, nkv, ni = plan.n_heads * hd, len(plan.kv_heads) * hd, plan.mlp[1] - plan.mlp[0]
    for layer in target.model.layers:
        a, m = layer.self_attn, layer.mlp
        bias = a.q_proj.bias is not None
        _meta_linear(a.q_proj, nq, cfg.hidden_size, bias)
        _meta_linear(a.k_proj, nkv, cfg.hidden_size, bias)
        _meta_linear(a.v_proj, nkv, cfg.hidden_size, bias)
        _meta_linear(a.o_proj, cfg.hidden_size, nq, a.o_proj.bias is not None and tp.rank == 0)
        a.o_proj.register_forward_hook(_all_reduce_output(tp))
        a.n_heads, a.n_kv_heads = plan.n_heads, len(plan.kv_heads)
        mb = m.gate_proj.bias is not None
        _meta_linear(m.gate_proj, ni, cfg.hidden_size, mb)
        _meta_linear(m.up_proj, ni, cfg.hidden_size, mb)
        _meta_linear(m.down_proj, cfg.hidden_size, ni, mb and tp.rank == 0)
        m.down_proj.register_forward_hook(_all_reduce_output(tp))
    target.lm_head = VocabParallelHead(cfg.hidden_size, cfg.vocab_size, tp,
                                       target.model.embed_tokens.weight.dtype)


def _local_name(name: str) -> str:
    return "lm_head.local.weight" if name == "lm_head.weight" else name


def _install(target: TargetModel, plan: ShardPlan, tp: TPGroup,
             state: dict[str, torch.Tensor]) -> TargetModel:
    """Restructure ``target`` for ``plan`` and load the rank's tensors ``state`` (local names)."""
    _restructure(target, plan, tp)
    target.load_state_dict(state, strict=True, assign=True)
    target.requires_grad_(False)
    target.full_cfg, target.shard_plan = target.cfg, plan
    target.cfg = plan.local_cfg(target.cfg)
    return target


def shard_target(target: TargetModel, tp: TPGroup) -> TargetModel:
    """Shard a fully loaded ``target`` in place over ``tp`` (module docstring) → it.
    ``target.cfg`` becomes the rank's local architecture (``ShardPlan.local_cfg``: what its KV
    cache and checks see); ``target.full_cfg`` keeps the checkpoint's, ``target.shard_plan``
    the plan."""
    if getattr(target, "full_cfg", None) is not None:
        raise DistributedError("this target is already sharded")
    plan = ShardPlan.of(target.cfg, tp.rank, tp.world)
    state = {}
    for name, t in target.state_dict().items():
        local = plan.local_tensor(name, t)
        if local is not None:
            state[_local_name(name)] = local
    return _install(target, plan, tp, state)


def load_target_shard(path: str | Path, tp: TPGroup, dtype: torch.dtype = torch.float32,
                      device: torch.device | str = "cpu", tap_layer_ids: Sequence[int] = ()
                      ) -> tuple[TargetModel, TargetConfig]:
    """Load rank ``tp.rank``'s shard of the target at ``path``: each tensor's slice is read
    from the memory-mapped safetensors file (``safe_open(...).get_slice(name)[...]``), one
    tensor at a time, so the rank's peak host memory is about its share plus the replicated
    parts (embedding, norms), not the whole checkpoint. → (sharded target, full config)."""
    from safetensors import safe_open

    from ..models import hf_loader as hf

    path = Path(path)
    cfg = TargetConfig.from_dict(hf.read_config(path))
    plan = ShardPlan.of(cfg, tp.rank, tp.world)
    with torch.device("meta"):
        model = TargetModel(cfg, tap_layer_ids)
    expected = hf.stored_shapes(model, cfg)
    found = hf.scan_tensors(hf.tensor_files(path))
    hf.check_tensor_names(expected, found, cfg)
    with torch.device("meta"):
        local_model = TargetModel(plan.local_cfg(cfg), tap_layer_ids)
    local_shapes = {n: tuple(t.shape) for n, t in local_model.state_dict().items()}
    hf.check_weights_fit(local_shapes, dtype, device,
                         f"rank {tp.rank}'s shard of the target at {path}")
    sources = dict(expected)
    head_src = "lm_head.weight"
    if cfg.tie_word_embeddings:
        head_src = "model.embed_tokens.weight"        # the tied head's rows come from it
        sources.pop("lm_head.weight", None)
    state: dict[str, torch.Tensor] = {}
    by_file: dict[Path, list[str]] = {}
    for name in sources:
        by_file.setdefault(found[name][0], []).append(name)
    for file in sorted(by_file):
        for name in by_file[file]:
            # one file opening per tensor: closing it unmaps the pages a column slice touched
            with safe_open(str(file), framework="pt", device="cpu") as f:
                sl = f.get_slice(name)
                t = plan.local_tensor(name, sl)
                if t is not None:
                    state[_local_name(name)] = t.to(device=device, dtype=dtype)
                if name == head_src:
                    state["lm_head.local.weight"] = plan.local_tensor(
                        "lm_head.weight", sl).to(device=device, dtype=dtype)
                del sl
    if cfg.tie_word_embeddings and "lm_head.weight" in found:
        with safe_open(str(found["lm_head.weight"][0]), framework="pt", device="cpu") as f:
            head = plan.local_tensor("lm_head.weight", f.get_slice("lm_head.weight"))
        if not torch.equal(head.to(device=device, dtype=dtype), state["lm_head.local.weight"]):
            raise CheckpointError("tie_word_embeddings is true but lm_head.weight differs from "
                                  "model.embed_tokens.weight")
    _install(model, plan, tp, state)
    model.to(device)                                  # the rope buffer was built on the CPU
    model.source_dir = str(path)
    return model.eval(), cfg


def load_pair_shard(target_dir: str | Path, draft_dir: str | Path | None, tp: TPGroup,
                    dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
                    name: str = ""):
    """``models.pair.load_pair`` for one rank: the target's shard (``load_target_shard``),
    the draft whole (replicated), the tokenizer."""
    from ..models.draft_config import DraftConfig
    from ..models.draft_loader import load_draft
    from ..models.hf_loader import load_tokenizer, read_config
    from ..models.pair import ModelPair

    draft_cfg = None
    if draft_dir is not None:
        draft_cfg = DraftConfig.from_dict(read_config(draft_dir))
        draft_cfg.check_target(TargetConfig.from_dict(read_config(target_dir)))
    taps = draft_cfg.target_layer_ids if draft_cfg else ()
    target, cfg = load_target_shard(target_dir, tp, dtype, device, taps)
    draft = None if draft_dir is None else load_draft(draft_dir, dtype, device, target=cfg)[0]
    tok = load_tokenizer(target_dir) if (Path(target_dir) / "tokenizer.json").is_file() else None
    return ModelPair(target, draft, tok, name or Path(target_dir).name)
