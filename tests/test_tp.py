"""Tensor parallelism on gloo (docs/tensor-parallel.md): TP=2 greedy speculative == TP=2
target-only == TP=1 target-only (a difference from TP=1 must be a float64 near-tie), seeded
T=1 tokens identical on every rank (the step hash check), a killed rank ends the run with a
clear error within the timeout; uneven query-head and MLP splits with replicated KV heads
(tp=3 on a tiny pair, the bundled pair's 3 heads / 1 KV head over tp=2), sharded loading.
Ranks are spawned processes (a few seconds each), so each test spawns once."""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch

import dflash2rt
from dflash2rt.distributed import launch
from dflash2rt.distributed.group import TPGroup
from dflash2rt.distributed.shard import check_shardable, shard_target
from dflash2rt.errors import DistributedError

from tiny_models import tiny_pair

PROMPTS = [[1, 2, 3, 4, 5], [7, 8, 9]]
NEW = 16


def _ranks_decode(pair) -> dict:
    """On each rank: greedy spec (fixed and adaptive), greedy target-only and seeded T=1, all
    with the step hash check; rank 0's tokens come back."""
    kw = dict(prompts=PROMPTS, max_new_tokens=NEW, tp=2, tp_check=True)
    runs = {"spec_fixed": dflash2rt.run(pair, "cpu", block_size=4, **kw),
            "spec_adaptive": dflash2rt.run(pair, "cpu", **kw),
            "target_only": dflash2rt.run(pair, "cpu", spec=False, **kw),
            "sampled": dflash2rt.run(pair, "cpu", temperature=1.0, seed=7, block_size=4, **kw)}
    if runs["spec_fixed"] is None:
        return {}
    return {k: r.tokens for k, r in runs.items()} | {"tp": runs["sampled"].stats.tensor_parallel}


def _greedy_margin(pair, prompt: list[int], prefix: list[int], a: int, b: int) -> float:
    """|logit_a - logit_b| of the unsharded target in float64 after prompt + prefix."""
    target = pair.target.double()
    ids = torch.tensor([prompt + prefix])
    pos = torch.arange(ids.shape[1])[None]
    logits = target.forward_full(ids, pos, torch.ones_like(ids, dtype=torch.bool)).logits[0, -1]
    return float((logits[a] - logits[b]).abs())


@pytest.mark.slow                       # spawns ranks (processes)
def test_tp2_greedy_equals_tp1_and_ranks_agree_on_sampled_tokens():
    pair = tiny_pair()
    ref = dflash2rt.run(pair, "cpu", prompts=PROMPTS, max_new_tokens=NEW, spec=False).tokens
    out = launch.spawn(_ranks_decode, 2, (pair,), timeout_s=60)
    assert out["spec_fixed"] == out["spec_adaptive"] == out["target_only"]
    assert "tp=2 over gloo" in out["tp"] and "hash check on" in out["tp"]
    for p, got, want in zip(PROMPTS, out["target_only"], ref):
        j = next((i for i, (x, y) in enumerate(zip(got, want)) if x != y), None)
        if j is not None:       # allowed only at a float64 near-tie of the two tokens
            assert _greedy_margin(pair, p, want[:j], got[j], want[j]) < 1e-9, (p, j)
    assert out["target_only"] == ref          # the tiny float64 pair has no near-tie
    assert all(len(t) == NEW for t in out["sampled"])   # same on every rank: the hash check


def _rank1_fails_at_step(pair, step: int, hang_s: float | None = None):
    """Rank 1 fails at its ``step``-th decode step (its target's ``step`` + 1-th forward:
    prefill's, then one per step of a fixed block): SIGKILLs itself, or with ``hang_s`` stops
    answering (sleeps that long); rank 0 is left alone."""
    if int(os.environ["RANK"]) == 1:
        seen = [0]

        def failing(module, args):
            seen[0] += 1
            if seen[0] == step + 1:
                if hang_s is None:
                    os.kill(os.getpid(), signal.SIGKILL)
                time.sleep(hang_s)
        pair.target.register_forward_pre_hook(failing)   # the rank's copy keeps the hook
    return dflash2rt.run(pair, "cpu", prompts=PROMPTS, max_new_tokens=64, block_size=4, tp=2)


@pytest.mark.slow                       # spawns ranks (processes)
def test_a_killed_rank_ends_the_run_with_a_clear_error_within_the_timeout():
    timeout = 20.0
    t0 = time.monotonic()
    with pytest.raises(DistributedError) as e:
        launch.spawn(_rank1_fails_at_step, 2, (tiny_pair(), 3), timeout_s=timeout, grace_s=5)
    took = time.monotonic() - t0
    msg = str(e.value)
    assert "rank 1: died, killed by SIGKILL" in msg and "rank 1 first" in msg, msg
    assert "rank 0:" in msg and "terminated" not in msg, msg   # rank 0 ended by itself
    assert took < timeout + 15, took


@pytest.mark.slow                       # spawns ranks (processes)
def test_a_hung_rank_times_the_others_out_instead_of_hanging_them():
    timeout = 4.0
    t0 = time.monotonic()
    with pytest.raises(DistributedError) as e:
        launch.spawn(_rank1_fails_at_step, 2, (tiny_pair(), 2, 600.0), timeout_s=timeout,
                     grace_s=2)
    took = time.monotonic() - t0
    msg = str(e.value)
    assert "rank 0: " in msg and "rank 0 first" in msg, msg           # rank 0 timed out
    assert "rank 1: still running" in msg and "terminated" in msg, msg
    assert took < 2 * timeout + 2 + 15, took


def _disagree():
    from dflash2rt.distributed.consensus import StepCheck
    from dflash2rt.distributed.group import join

    g = join(torch.device("cpu"), 2, check=True)
    StepCheck(g)([[0, 0, 5]])                          # the same rows: passes
    StepCheck(g)([[0, 0, 5 + g.rank]])                 # rank 1 committed another token


@pytest.mark.slow                       # spawns ranks (processes)
def test_the_step_hash_check_raises_when_ranks_disagree():
    with pytest.raises(DistributedError, match="ranks disagree on the tokens committed at step 0"):
        launch.spawn(_disagree, 2, timeout_s=20)


def _cfg(heads: int, kv: int, intermediate: int = 72):
    from dflash2rt.models.config import TargetConfig
    from tiny_models import target_dict

    d = target_dict()
    d.update(num_attention_heads=heads, num_key_value_heads=kv, intermediate_size=intermediate)
    return TargetConfig.from_dict(d)


@pytest.mark.parametrize("heads,kv,tp", [(3, 1, 2), (4, 2, 3), (8, 2, 3), (8, 4, 3), (32, 8, 3),
                                         (16, 8, 16), (4, 4, 2)])
def test_shard_plans_split_query_heads_unevenly_and_replicate_kv_heads(heads, kv, tp):
    """Contiguous query-head slices differing by at most one; each rank's KV heads are the
    ones its query heads read (repeated into equal GQA groups), so local query head i reads
    local KV head i // (local heads / local KV heads): the attention op's rule."""
    from dflash2rt.distributed.shard import ShardPlan

    cfg = _cfg(heads, kv, intermediate=70)
    plans = [ShardPlan.of(cfg, r, tp) for r in range(tp)]
    sizes = [p.n_heads for p in plans]
    assert sum(sizes) == heads and max(sizes) - min(sizes) <= 1
    assert [p.heads for p in plans] == [(sum(sizes[:r]), sum(sizes[:r + 1])) for r in range(tp)]
    rows = [p.mlp[1] - p.mlp[0] for p in plans]
    assert sum(rows) == 70 and max(rows) - min(rows) <= 1
    for p in plans:
        group = p.n_heads // len(p.kv_heads)
        assert p.n_heads % len(p.kv_heads) == 0
        for i in range(p.n_heads):
            assert p.kv_heads[i // group] == (p.heads[0] + i) // (heads // kv)
        p.local_cfg(cfg)                             # a valid TargetConfig
    if tp <= kv and kv % tp == 0:                    # the even case: no replication
        assert sum(len(p.kv_heads) for p in plans) == kv


def test_fewer_query_heads_than_ranks_are_refused():
    cfg = tiny_pair().target.cfg                          # 4 heads, 2 KV heads
    check_shardable(cfg, 3)                               # uneven, KV heads replicated: fine
    with pytest.raises(DistributedError, match="num_attention_heads=4 is less than tp=5"):
        check_shardable(cfg, 5)
    pair = tiny_pair()
    group = TPGroup(rank=0, world=5, group=None, host_group=None, backend="gloo", timeout_s=1)
    with pytest.raises(DistributedError, match="less than tp=5"):
        shard_target(pair.target, group)                  # refused before anything is sharded
    assert pair.target.model.layers[0].self_attn.n_kv_heads == 2
    with pytest.raises(DistributedError, match="less than tp=5"):
        dflash2rt.run(pair, "cpu", prompts=PROMPTS, tp=5)   # before spawning anything


def _uneven_pair():
    """A float64 tiny pair with 8 query heads, 2 KV heads, 70 intermediate rows: over tp=3
    the heads split 3+3+2 (rank 1 reads both KV heads unevenly: KV heads [0, 1, 1]) and the
    MLP 24+23+23."""
    from dflash2rt.models.config import TargetConfig
    from dflash2rt.models.draft import DraftModel
    from dflash2rt.models.draft_config import DraftConfig
    from dflash2rt.models.pair import ModelPair
    from dflash2rt.models.target import TargetModel
    from tiny_models import _randomise, draft_dict, target_dict

    d = target_dict()
    d.update(num_attention_heads=8, num_key_value_heads=2, intermediate_size=70, head_dim=8)
    dcfg = DraftConfig.from_dict(draft_dict())
    target = TargetModel(TargetConfig.from_dict(d), dcfg.target_layer_ids).double()
    _randomise(target, torch.Generator().manual_seed(3))
    draft = DraftModel(dcfg).double()
    _randomise(draft, torch.Generator().manual_seed(4))
    return ModelPair(target.requires_grad_(False).eval(), draft.requires_grad_(False).eval())


@pytest.mark.slow                       # spawns ranks (processes)
def test_uneven_heads_replicated_kv_and_uneven_mlp_over_tp3_equal_tp1(tmp_path):
    """tp=3 on 8 heads / 2 KV heads / 70 MLP rows, loaded shard by shard from a directory:
    greedy spec == target-only == TP=1, every difference a float64 near-tie."""
    from dflash2rt.qualify.tp_equivalence import tp_equivalence
    from tiny_models import save_pair_dir

    root = save_pair_dir(tmp_path / "pair", _uneven_pair())   # float64 checkpoint
    res = tp_equivalence(str(root), [[1, 2, 3, 4, 5], [7, 8, 9]], max_new_tokens=12, tp=3,
                         block_size=4, timeout_s=60, dtype=torch.float64)
    assert res.ok, res.summary()
    assert res.equal, res.summary()                  # float64: no near-tie here
    assert res.max_logit_diff < 1e-9, res.summary()
    assert "query heads 3+3+2, KV heads 1+3+1 (replicated)" in res.tensor_parallel


BUNDLED_PROMPTS, BUNDLED_TOKENS = 4, 64


@pytest.mark.slow                       # spawns ranks (processes)
def test_bundled_pair_tp2_greedy_equals_tp1_up_to_near_ties():
    """The bundled stdlib-code pair (3 query heads, 1 KV head: split 2+1, the KV head
    replicated) with tp=2 on held-out prompts: spec == target-only == TP=1 target-only, any
    difference explained by a float64 logit near-tie; the largest logit difference TP=2 vs
    TP=1 (teacher-forced) stays at float32 rounding."""
    import json
    from pathlib import Path

    from dflash2rt.qualify.tp_equivalence import tp_equivalence

    root = Path(dflash2rt.__file__).parent / "bundled" / "stdlib-code"
    prompts = [p["prompt"] for p in
               json.loads((root / "heldout_prompts.json").read_text())[:BUNDLED_PROMPTS]]
    res = tp_equivalence("stdlib-code", prompts, BUNDLED_TOKENS, tp=2, timeout_s=120)
    print(res.summary())
    assert res.ok, res.summary()
    assert res.max_logit_diff < 1e-5 * max(res.max_logit, 1.0) * 10, res.summary()
    assert "query heads 2+1, KV heads 1+1 (replicated)" in res.tensor_parallel


def test_tp_arguments_are_checked_before_spawning():
    with pytest.raises(dflash2rt.errors.InvalidInputError, match="tp must be a positive"):
        dflash2rt.run(tiny_pair(), "cpu", prompts=PROMPTS, tp=0)
    with pytest.raises(dflash2rt.errors.InvalidInputError, match="picklable"):
        dflash2rt.run(tiny_pair(), "cpu", prompts=PROMPTS, tp=2, on_tokens=lambda i, t: None)


@pytest.mark.slow                       # spawns ranks (processes)
def test_cli_tp_spawns_ranks_and_prints_once(tmp_path, capsys):
    import json

    from dflash2rt.cli import main
    from tiny_models import save_pair_dir

    pair = tiny_pair(dtype=torch.float32)
    root = save_pair_dir(tmp_path / "pair", pair)
    ref = dflash2rt.run(str(root), "cpu", prompts=[[3, 4, 5]], max_new_tokens=8, spec=False)
    argv = ["run", "--model", str(root), "--backend", "cpu", "--prompt-file", "",
            "--max-new-tokens", "8", "--block-size", "4", "--tp", "2", "--tp-check", "--json"]
    (tmp_path / "p.json").write_text("[[3, 4, 5]]")
    argv[argv.index("--prompt-file") + 1] = str(tmp_path / "p.json")
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["tokens"] == ref.tokens and out["stats"]["tensor_parallel"].startswith("tp=2")


@pytest.mark.parametrize("tied", [False, True])
def test_sharded_loading_reads_the_same_tensors_as_slicing_a_full_load(tmp_path, tied):
    """Every rank's tensors from ``load_target_shard`` (slices read from the safetensors)
    equal those of a full load sliced in place by ``shard_target``, for each rank of an
    uneven tp=3 split, tied embeddings included (no collective runs while loading)."""
    from dflash2rt.distributed.shard import load_target_shard
    from dflash2rt.models.config import TargetConfig
    from dflash2rt.models.hf_loader import load_target, save_target
    from dflash2rt.models.target import TargetModel
    from tiny_models import _randomise, target_dict

    d = target_dict()
    d.update(num_attention_heads=8, num_key_value_heads=2, intermediate_size=70, head_dim=8,
             tie_word_embeddings=tied)
    target = TargetModel(TargetConfig.from_dict(d), (0, 2))
    _randomise(target, torch.Generator().manual_seed(5))
    save_target(target, None, tmp_path / "t")
    for rank in range(3):
        group = TPGroup(rank=rank, world=3, group=None, host_group=None, backend="gloo",
                        timeout_s=1)
        full, _ = load_target(tmp_path / "t", torch.float32, "cpu", (0, 2))
        want = shard_target(full, group).state_dict()
        got_model, cfg = load_target_shard(tmp_path / "t", group, torch.float32, "cpu", (0, 2))
        got = got_model.state_dict()
        assert cfg.num_attention_heads == 8 and got_model.cfg == full.cfg
        assert sorted(got) == sorted(want)
        for name in want:
            assert torch.equal(got[name], want[name]), name
        assert got_model.rope_inv_freq_bits.device.type == "cpu"
