"""A tensor-parallel rank's set-up for ``dflash2rt.run`` (tp > 1): the checks made before
ranks are spawned, the rank's backend, process group and sharded model pair, and the line
``RunStats.tensor_parallel`` gives of how the ranks split the target. ``a``: ``run``'s
arguments as a dict (model, draft, revision, draft_revision, dtype, backend, tp, tp_check)."""

from __future__ import annotations

import copy
import os
from typing import Any

from ..backend import Backend
from ..models import hub
from ..models.config import TargetConfig
from ..models.hf_loader import read_config
from ..models.pair import ModelPair, resolve_dtype
from ..registry import Registry
from . import group as tp_group, shard
from .shard import ShardPlan, check_shardable

TP_GRAPHS_ENV = "DFLASH2RT_TP_GRAPHS"    # "1": keep graph capture in tensor-parallel runs


def check_model_shardable(a: dict[str, Any]) -> None:
    """DistributedError unless the target's config shards over tp ranks."""
    model = a["model"]
    if isinstance(model, ModelPair):
        cfg = model.target.cfg
    else:
        target, _, _ = hub.locate_pair(model, a["draft"], a["revision"], a["draft_revision"],
                                       weights=False)
        cfg = TargetConfig.from_dict(read_config(target.path))
    check_shardable(cfg, a["tp"])


def rank_setup(a: dict[str, Any], be: Backend):
    """A rank's (backend on its device, TPGroup, sharded pair): an accelerator backend is
    taken again on device LOCAL_RANK; the pair is this rank's own (loaded without the
    process's cache, or a copy of a given ModelPair), its target sharded."""
    tp = a["tp"]
    _, _, local = tp_group.env_world() or (0, tp, 0)
    if be.device.type != "cpu" and not isinstance(a["backend"], Backend):
        be = Registry.discover().select(f"{be.name.split(':')[0]}:{local}").backend
    group = tp_group.join(be.device, tp, check=bool(a["tp_check"]))
    if be.graph_adapter is not None and os.environ.get(TP_GRAPHS_ENV) != "1":
        be = be.with_standing_fallback(         # this run's copy: eager, reported
            "graphs: off under tensor parallelism (collectives inside captured graphs are "
            f"untested; {TP_GRAPHS_ENV}=1 keeps them)")
        be.graph_adapter = None
    model = a["model"]
    if isinstance(model, ModelPair):
        pair = copy.deepcopy(model)
    else:
        target, draft_loc, name = hub.locate_pair(model, a["draft"], a["revision"],
                                                  a["draft_revision"])
        t = str(target.path.resolve())
        pair = shard.load_pair_shard(t, None if draft_loc is None
                                     else str(draft_loc.path.resolve()), group,
                                     resolve_dtype(a["dtype"], t, be.device), be.device, name)
    if getattr(pair.target, "shard_plan", None) is None:
        shard.shard_target(pair.target, group)
    return be, group, pair


def heads_line(pair: ModelPair, group: Any) -> str:
    """How the ranks split the target's heads: "query heads 2+1, KV heads 1 replicated"."""
    cfg = pair.target.full_cfg
    plans = [ShardPlan.of(cfg, r, group.world) for r in range(group.world)]
    kv = [len(p.kv_heads) for p in plans]
    shared = sum(kv) > cfg.num_key_value_heads
    return (f"query heads {'+'.join(str(p.n_heads) for p in plans)}, KV heads "
            f"{'+'.join(map(str, kv))}{' (replicated)' if shared else ''}")
