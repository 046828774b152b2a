"""Tensor-parallel sharding against definitions written anew from distributed/shard.py's
docstrings: items dealt one by one, the largest equal local GQA group found by search, every
sliced tensor against index loops, and a sharded forward (ranks as threads over fake
collectives) against the unsharded model in float64."""

from __future__ import annotations

import dataclasses
import threading

import pytest
import torch
from safetensors.torch import load_file, save_file

from dflash2rt.distributed import shard
from dflash2rt.distributed.group import TPGroup
from dflash2rt.distributed.shard import (ShardPlan, VocabParallelHead, check_shardable,
                                         load_target_shard, shard_target, split)
from dflash2rt.errors import CheckpointError, DistributedError
from dflash2rt.models.config import TargetConfig
from dflash2rt.models.target import TargetModel

from tiny_models import _randomise, target_dict


def _cfg(heads: int, kv: int, inter: int = 70, vocab: int = 50, model_type: str = "qwen3",
         **kw) -> TargetConfig:
    d = target_dict(model_type, vocab=vocab)
    d.update(num_attention_heads=heads, num_key_value_heads=kv, intermediate_size=inter,
             head_dim=4, **kw)
    return TargetConfig.from_dict(d)


def _group(rank: int, world: int, group=None) -> TPGroup:
    return TPGroup(rank=rank, world=world, group=group, host_group=None, backend="gloo",
                   timeout_s=1)


# ---- references ---------------------------------------------------------------------------

def _dealt(n: int, world: int) -> list[tuple[int, int]]:
    """Each rank's [lo, hi) when n items are dealt one at a time to ranks 0, 1, ... in turn
    and each rank keeps a contiguous run: the first n % world ranks get one more."""
    sizes = [0] * world
    for i in range(n):
        sizes[i % world] += 1
    out, lo = [], 0
    for s in sizes:
        out.append((lo, lo + s))
        lo += s
    return out


def _kv_heads(q0: int, q1: int, heads: int, kv: int) -> tuple[int, ...]:
    """The local KV heads: the largest group size G (dividing the local query heads) such
    that every run of G consecutive local query heads reads one checkpoint KV head; local
    KV head j is the one its group reads."""
    reads = [q * kv // heads for q in range(q0, q1)]      # the checkpoint KV head of each
    n = len(reads)
    best = 1
    for g in range(1, n + 1):
        if n % g == 0 and all(len(set(reads[j:j + g])) == 1 for j in range(0, n, g)):
            best = g
    return tuple(reads[j] for j in range(0, n, best))


def _ceil_div(a: int, b: int) -> int:
    p = 0
    while p * b < a:
        p += 1
    return p


# ---- check_shardable, split, ShardPlan ----------------------------------------------------

def test_check_shardable_each_bound_alone():
    cfg = _cfg(5, 1, inter=7)
    for tp in (1, 2, 5):
        check_shardable(cfg, tp)
    for tp in (0, -1):
        with pytest.raises(DistributedError, match=f"tp must be >= 1, got {tp}"):
            check_shardable(cfg, tp)
    with pytest.raises(DistributedError, match="num_attention_heads=5 is less than tp=6"):
        check_shardable(cfg, 6)                         # intermediate 7 would still do
    check_shardable(_cfg(6, 1, inter=6), 6)             # both exactly tp
    with pytest.raises(DistributedError, match="intermediate_size=5 is less than tp=6"):
        check_shardable(_cfg(6, 1, inter=5), 6)         # heads fine, intermediate one short
    with pytest.raises(DistributedError, match="less than tp=7"):
        ShardPlan.of(_cfg(6, 1, inter=70), 0, 7)        # the plan checks first


def test_split_against_items_dealt_one_by_one():
    for n in range(0, 23):
        for world in range(1, 9):
            want = _dealt(n, world)
            assert [split(n, world, r) for r in range(world)] == want, (n, world)


@pytest.mark.parametrize("heads,kv", [(1, 1), (2, 1), (3, 1), (4, 2), (6, 3), (8, 2), (8, 4),
                                      (12, 4), (12, 6), (16, 8), (15, 5), (32, 8), (9, 9)])
def test_plans_against_the_largest_equal_group(heads, kv):
    vocab = 50
    for tp in range(1, heads + 1):
        cfg = _cfg(heads, kv, inter=70 + heads, vocab=vocab)
        qs, ms = _dealt(heads, tp), _dealt(70 + heads, tp)
        for r in range(tp):
            p = ShardPlan.of(cfg, r, tp)
            assert (p.rank, p.world, p.head_dim, p.vocab) == (r, tp, 4, vocab)
            assert p.heads == qs[r] and p.mlp == ms[r], (heads, kv, tp, r)
            assert p.n_heads == qs[r][1] - qs[r][0]
            assert p.kv_heads == _kv_heads(*qs[r], heads, kv), (heads, kv, tp, r)
            assert p.vocab_per == _ceil_div(vocab, tp)
            local = p.local_cfg(cfg)
            assert (local.num_attention_heads, local.num_key_value_heads,
                    local.intermediate_size) == (p.n_heads, len(p.kv_heads), ms[r][1] - ms[r][0])
            same = ("num_attention_heads", "num_key_value_heads", "intermediate_size")
            for f in dataclasses.fields(cfg):
                if f.name not in same:
                    assert getattr(local, f.name) == getattr(cfg, f.name), f.name


def test_plan_hand_values_and_describe():
    """8 heads / 2 KV heads / 70 rows over tp=3: heads 3+3+2, rank 1 reads KV heads 0, 1, 1
    (one query head of KV head 0, two of KV head 1: groups of one), MLP rows 24+23+23."""
    cfg = _cfg(8, 2, inter=70, vocab=50)
    plans = [ShardPlan.of(cfg, r, 3) for r in range(3)]
    assert [p.heads for p in plans] == [(0, 3), (3, 6), (6, 8)]
    assert [p.kv_heads for p in plans] == [(0,), (0, 1, 1), (1,)]
    assert [p.mlp for p in plans] == [(0, 24), (24, 47), (47, 70)]
    assert [p.vocab_per for p in plans] == [17] * 3
    assert plans[1].describe() == ("rank 1: query heads [3, 6), KV heads [0, 1, 1], "
                                   "MLP rows [24, 47)")
    six = [ShardPlan.of(_cfg(6, 2), r, 4) for r in range(4)]   # heads 2+2+1+1, groups of 3
    assert [p.kv_heads for p in six] == [(0,), (0, 1), (1,), (1,)]
    assert ShardPlan.of(_cfg(6, 2, vocab=48), 0, 4).vocab_per == 12   # V divisible by tp
    assert hash(plans[1]) == hash(ShardPlan.of(cfg, 1, 3))          # a frozen value
    with pytest.raises(dataclasses.FrozenInstanceError):
        plans[1].rank = 0


# ---- local_tensor ----------------------------------------------------------------------

def _full_tensors(cfg: TargetConfig) -> dict[str, torch.Tensor]:
    """Every kind of checkpoint tensor, each value distinct (its flat index)."""
    H, hd, I, V = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size, cfg.vocab_size
    nq, nkv = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
    shapes = {"self_attn.q_proj.weight": (nq, H), "self_attn.k_proj.weight": (nkv, H),
              "self_attn.v_proj.weight": (nkv, H), "self_attn.o_proj.weight": (H, nq),
              "self_attn.q_proj.bias": (nq,), "self_attn.k_proj.bias": (nkv,),
              "self_attn.v_proj.bias": (nkv,), "self_attn.o_proj.bias": (H,),
              "mlp.gate_proj.weight": (I, H), "mlp.up_proj.weight": (I, H),
              "mlp.down_proj.weight": (H, I), "mlp.gate_proj.bias": (I,),
              "mlp.up_proj.bias": (I,), "mlp.down_proj.bias": (H,),
              "input_layernorm.weight": (H,), "self_attn.q_norm.weight": (hd,)}
    out = {f"model.layers.1.{k}": s for k, s in shapes.items()}
    out |= {"model.embed_tokens.weight": (V, H), "lm_head.weight": (V, H),
            "model.norm.weight": (H,)}
    return {k: torch.arange(float(torch.Size(s).numel())).reshape(s) for k, s in out.items()}


def _want(name: str, t: torch.Tensor, cfg: TargetConfig, r: int, tp: int) -> torch.Tensor | None:
    """Rank r's part of ``t`` by index loops over the module docstring's rules."""
    heads, kv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    q0, q1 = _dealt(heads, tp)[r]
    m0, m1 = _dealt(cfg.intermediate_size, tp)[r]
    q_rows = [h * hd + d for h in range(q0, q1) for d in range(hd)]
    kv_rows = [k * hd + d for k in _kv_heads(q0, q1, heads, kv) for d in range(hd)]
    if name == "lm_head.weight":
        per = _ceil_div(cfg.vocab_size, tp)
        rows = [t[v] if v < cfg.vocab_size else torch.zeros(t.shape[1])
                for v in range(r * per, (r + 1) * per)]
        return torch.stack(rows)
    for key, idx in (("q_proj", q_rows), ("k_proj", kv_rows), ("v_proj", kv_rows),
                     ("gate_proj", list(range(m0, m1))), ("up_proj", list(range(m0, m1)))):
        if f".{key}." in name:
            return torch.stack([t[i] for i in idx])
    for key, idx in (("o_proj", q_rows), ("down_proj", list(range(m0, m1)))):
        if f".{key}.bias" in name:
            return t.clone() if r == 0 else None
        if f".{key}.weight" in name:
            return torch.stack([t[:, i] for i in idx], dim=1)
    return t.clone()                                   # replicated


@pytest.mark.parametrize("heads,kv,tp,vocab", [(8, 2, 3, 50), (6, 2, 4, 9), (4, 2, 2, 48),
                                               (3, 1, 2, 7), (16, 8, 5, 10), (4, 4, 1, 5)])
def test_local_tensors_against_index_loops(heads, kv, tp, vocab):
    cfg = _cfg(heads, kv, inter=23, vocab=vocab)
    full = _full_tensors(cfg)
    for r in range(tp):
        plan = ShardPlan.of(cfg, r, tp)
        for name, t in full.items():
            want = _want(name, t, cfg, r, tp)
            got = plan.local_tensor(name, t)
            if want is None:
                assert got is None, (name, r)
                continue
            assert got is not None and got.dtype == t.dtype, (name, r)
            assert torch.equal(got, want), (name, r)


def test_a_padded_vocabulary_shard_past_the_end_is_all_zeros():
    cfg = _cfg(4, 2, inter=23, vocab=9)            # ⌈9/4⌉ = 3: rank 3 starts at row 9
    head = torch.arange(1.0, 9 * cfg.hidden_size + 1).reshape(9, -1)
    shards = [ShardPlan.of(cfg, r, 4).local_tensor("lm_head.weight", head) for r in range(4)]
    assert [tuple(s.shape) for s in shards] == [(3, cfg.hidden_size)] * 4
    assert torch.equal(torch.cat(shards)[:9], head)
    assert not shards[3].any()


def test_sliced_tensors_own_their_storage():
    """A slice never keeps the full weight alive: its storage holds its own elements only."""
    cfg = _cfg(8, 2, inter=23, vocab=50)
    full = _full_tensors(cfg)
    plan = ShardPlan.of(cfg, 1, 3)
    for name, t in full.items():
        got = plan.local_tensor(name, t)
        if got is None:
            continue
        assert got.is_contiguous(), name
        if tuple(got.shape) != tuple(t.shape):
            assert got.untyped_storage().nbytes() == got.numel() * got.element_size(), name
    base = torch.arange(64.0).reshape(16, 4)
    for src in (base[4:12], base[:, 1:3], base.t()):     # views: rows, columns, transposed
        got = shard._own(src)
        assert got._base is None and torch.equal(got, src)
        assert got.untyped_storage().nbytes() == got.numel() * got.element_size()
    plain = torch.arange(6.0)
    assert shard._own(plain).data_ptr() == plain.data_ptr()       # already its own: no copy


# ---- the vocabulary-parallel head -------------------------------------------------------

def test_vocab_parallel_head_gathers_the_full_logits(monkeypatch):
    """Every rank's head with a fake all-gather that hands it the other ranks' shard outputs
    (from zero-padded rows written out here) → h @ W.T over the whole vocabulary."""
    V, H, tp = 10, 6, 4
    gen = torch.Generator().manual_seed(1)
    W = torch.randn(V, H, generator=gen, dtype=torch.float64)
    h = torch.randn(2, 3, H, generator=gen, dtype=torch.float64)
    per = 3
    padded = torch.zeros(per * tp, H, dtype=torch.float64)
    padded[:V] = W
    outs = [h @ padded[k * per:(k + 1) * per].T for k in range(tp)]
    for r in range(tp):
        def all_gather(parts, part, group=None, r=r):
            assert len(parts) == tp and group == ("g", r)
            assert torch.allclose(part, outs[r], rtol=0, atol=1e-12)
            for k in range(tp):
                parts[k].copy_(outs[k])
        monkeypatch.setattr(shard.dist, "all_gather", all_gather)
        head = VocabParallelHead(H, V, _group(r, tp, ("g", r)), torch.float64, device="cpu")
        assert tuple(head.weight.shape) == (per, H) and head.weight is head.local.weight
        assert head.vocab == V
        with torch.no_grad():
            head.local.weight.copy_(padded[r * per:(r + 1) * per])
            got = head(h)
        assert got.shape == (2, 3, V)
        assert torch.allclose(got, h @ W.T, rtol=0, atol=1e-12)


# ---- a whole sharded forward: ranks as threads over fake collectives --------------------

class _Ring:
    """Fake collectives for ``world`` ranks running as threads: all-reduce (sum) and
    all-gather meet at a barrier; each call counted per rank."""

    def __init__(self, world: int) -> None:
        self.world, self.bar = world, threading.Barrier(world, timeout=120)
        self.slots: list = [None] * world
        self.reduces, self.gathers = [0] * world, [0] * world

    def all_reduce(self, out, group=None, op=None):
        r = group.rank
        self.reduces[r] += 1
        self.slots[r] = out.clone()
        self.bar.wait()
        total = self.slots[0].clone()
        for s in self.slots[1:]:
            total += s
        self.bar.wait()
        out.copy_(total)

    def all_gather(self, parts, part, group=None):
        r = group.rank
        self.gathers[r] += 1
        self.slots[r] = part.clone()
        self.bar.wait()
        for k in range(self.world):
            parts[k].copy_(self.slots[k])
        self.bar.wait()


class _Rank:
    def __init__(self, rank: int) -> None:
        self.rank = rank


def _model(cfg: TargetConfig, seed: int) -> TargetModel:
    m = TargetModel(cfg).double()
    _randomise(m, torch.Generator().manual_seed(seed))
    return m.requires_grad_(False).eval()


def _sharded_logits(cfg: TargetConfig, tp: int, ids, monkeypatch) -> tuple[list, _Ring]:
    ring = _Ring(tp)
    monkeypatch.setattr(shard.dist, "all_reduce", ring.all_reduce)
    monkeypatch.setattr(shard.dist, "all_gather", ring.all_gather)
    models = [shard_target(_model(cfg, 7), _group(r, tp, _Rank(r))) for r in range(tp)]
    out: list = [None] * tp
    pos = torch.arange(ids.shape[1]).expand(ids.shape[0], -1)
    valid = torch.ones_like(ids, dtype=torch.bool)

    def run(r):
        try:
            out[r] = models[r].forward_full(ids, pos, valid).logits
        except BaseException as e:                  # let the other ranks leave the barrier
            out[r] = e
            ring.bar.abort()
    threads = [threading.Thread(target=run, args=(r,)) for r in range(tp)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for o in out:
        if isinstance(o, BaseException):
            raise o
    return out, ring


@pytest.mark.parametrize("model_type,heads,kv,tp,bias", [
    ("qwen3", 8, 2, 3, {}), ("llama", 6, 2, 4, {"attention_bias": True, "mlp_bias": True}),
    ("llama", 4, 2, 2, {"attention_bias": True}),
    ("qwen3", 3, 1, 2, {"tie_word_embeddings": True})])
def test_a_sharded_forward_equals_the_unsharded_model(monkeypatch, model_type, heads, kv, tp,
                                                      bias):
    """Row-parallel biases counted once, replicated KV heads, the padded head: every rank's
    logits equal the unsharded model's; one all-reduce per attention and per MLP each layer,
    one all-gather per forward."""
    cfg = _cfg(heads, kv, inter=23, vocab=37, model_type=model_type, **bias)
    ids = torch.tensor([[1, 5, 9, 2, 30, 36], [4, 4, 0, 7, 8, 3]])
    pos = torch.arange(ids.shape[1]).expand(2, -1)
    want = _model(cfg, 7).forward_full(ids, pos, torch.ones_like(ids, dtype=torch.bool)).logits
    got, ring = _sharded_logits(cfg, tp, ids, monkeypatch)
    for r in range(tp):
        assert got[r].shape == want.shape
        assert torch.allclose(got[r], want, rtol=0, atol=1e-9), r
    assert ring.reduces == [2 * cfg.num_hidden_layers] * tp
    assert ring.gathers == [1] * tp


def test_shard_target_shapes_biases_and_configs():
    cfg = _cfg(6, 2, inter=23, vocab=37, model_type="llama", attention_bias=True,
               mlp_bias=True)
    for r in range(4):
        plan = ShardPlan.of(cfg, r, 4)
        m = shard_target(_model(cfg, 7), _group(r, 4))
        assert m.full_cfg == cfg and m.shard_plan == plan and m.cfg == plan.local_cfg(cfg)
        a, mlp = m.model.layers[0].self_attn, m.model.layers[0].mlp
        assert (a.n_heads, a.n_kv_heads) == (plan.n_heads, len(plan.kv_heads))
        nq, nkv, ni = plan.n_heads * 4, len(plan.kv_heads) * 4, plan.mlp[1] - plan.mlp[0]
        H = cfg.hidden_size
        assert (a.q_proj.out_features, a.q_proj.in_features) == (nq, H)
        assert (a.k_proj.out_features, a.v_proj.out_features) == (nkv, nkv)
        assert (a.o_proj.out_features, a.o_proj.in_features) == (H, nq)
        assert (mlp.gate_proj.out_features, mlp.up_proj.out_features) == (ni, ni)
        assert (mlp.down_proj.out_features, mlp.down_proj.in_features) == (H, ni)
        assert a.q_proj.bias is not None and mlp.gate_proj.bias is not None
        assert (a.o_proj.bias is not None) == (r == 0)
        assert (mlp.down_proj.bias is not None) == (r == 0)
        assert not any(p.requires_grad for p in m.parameters())
        assert tuple(m.lm_head.weight.shape) == (10, H)          # ⌈37/4⌉
        assert m.lm_head.weight.dtype == torch.float64
        with pytest.raises(DistributedError, match="already sharded"):
            shard_target(m, _group(r, 4))
    plain = shard_target(_model(_cfg(6, 2, inter=23, model_type="llama"), 7), _group(0, 4))
    assert plain.model.layers[0].self_attn.o_proj.bias is None
    assert plain.model.layers[0].mlp.down_proj.bias is None


# ---- loading a tied checkpoint that stores a head -----------------------------------------

def test_a_tied_checkpoint_whose_stored_head_differs_is_refused(tmp_path):
    from dflash2rt.models.hf_loader import save_target

    cfg = _cfg(8, 2, inter=23, vocab=37, tie_word_embeddings=True)
    root = save_target(_model(cfg, 7).float(), None, tmp_path / "t")
    state = load_file(str(root / "model.safetensors"))
    emb = state["model.embed_tokens.weight"]
    state["lm_head.weight"] = emb.clone()
    save_file(state, str(root / "model.safetensors"), metadata={"format": "pt"})
    for r in range(3):                                 # the same head: loads on every rank
        m, full = load_target_shard(root, _group(r, 3))
        assert full == cfg
        want = _want("lm_head.weight", emb, cfg, r, 3)
        assert torch.equal(m.lm_head.weight, want)
    bad = emb.clone()
    bad[36, 0] += 1                                     # one cell, in rank 2's rows only
    state["lm_head.weight"] = bad
    save_file(state, str(root / "model.safetensors"), metadata={"format": "pt"})
    load_target_shard(root, _group(0, 3))               # rank 0's rows agree
    with pytest.raises(CheckpointError, match="lm_head.weight differs"):
        load_target_shard(root, _group(2, 3))


def test_load_pair_shard_with_and_without_a_draft(tmp_path):
    """The target's shard, the draft whole with the target's taps, the tokenizer only where
    tokenizer.json is, the name given or the target directory's."""
    from dflash2rt.distributed.shard import load_pair_shard
    from tiny_models import save_pair_dir, tiny_pair

    pair = tiny_pair(dtype=torch.float32)
    root = save_pair_dir(tmp_path / "p", pair)
    group = _group(1, 2)
    got = load_pair_shard(root / "target", root / "draft", group, name="named")
    assert got.name == "named" and got.tokenizer is not None
    assert got.target.shard_plan == ShardPlan.of(pair.target.cfg, 1, 2)
    assert got.target.tap_layer_ids == pair.target.tap_layer_ids
    want = pair.draft.state_dict()
    assert sorted(got.draft.state_dict()) == sorted(want)
    for k, v in got.draft.state_dict().items():
        assert torch.equal(v, want[k]), k
    alone = load_pair_shard(root / "target", None, group)
    assert alone.draft is None and alone.name == "target"
    assert alone.target.tap_layer_ids == ()
    (root / "target" / "tokenizer.json").unlink()
    assert load_pair_shard(root / "target", None, group).tokenizer is None
