"""A tensor-parallel rank's set-up with its collaborators scripted (hub, process group,
registry, shard loader): which config is checked, which backend a rank runs on, when graphs are
turned off, which pair is loaded or copied and sharded, and the heads line, each written out
here by hand."""

from __future__ import annotations

import types
from pathlib import Path

import pytest
import torch

from dflash2rt import get_backend
from dflash2rt.distributed import group as tp_group, rank_setup, shard
from dflash2rt.errors import DistributedError
from dflash2rt.models import hub
from dflash2rt.models.config import TargetConfig
from dflash2rt.models.pair import ModelPair
from dflash2rt.registry import Registry
from tiny_models import target_dict


def _cfg(heads=4, kv=2, inter=72):
    return TargetConfig.from_dict({**target_dict("qwen3"), "num_attention_heads": heads,
                                   "num_key_value_heads": kv, "intermediate_size": inter})


def _pair(cfg=None, shard_plan=None):
    target = types.SimpleNamespace(cfg=cfg or _cfg(), full_cfg=cfg or _cfg(),
                                   shard_plan=shard_plan)
    return ModelPair(target, None)


def _loc(path):
    return types.SimpleNamespace(path=Path(path))


def test_a_given_pair_is_checked_on_its_own_config(monkeypatch):
    monkeypatch.setattr(hub, "locate_pair", lambda *a, **k: pytest.fail("located"))
    rank_setup.check_model_shardable({"model": _pair(_cfg(heads=4)), "tp": 4})
    with pytest.raises(DistributedError, match="num_attention_heads=4 is less than tp=5"):
        rank_setup.check_model_shardable({"model": _pair(_cfg(heads=4)), "tp": 5})


def test_a_named_model_is_checked_from_its_config_without_weights(monkeypatch, tmp_path):
    calls = []

    def locate_pair(*a, **kw):
        calls.append((a, kw))
        return _loc(tmp_path / "t"), None, "n"

    monkeypatch.setattr(hub, "locate_pair", locate_pair)
    monkeypatch.setattr(rank_setup, "read_config",
                        lambda path: {**target_dict("qwen3"), "intermediate_size": 3})
    a = {"model": "m", "draft": "d", "revision": "r", "draft_revision": "dr", "tp": 3}
    rank_setup.check_model_shardable(a)
    assert calls == [(("m", "d", "r", "dr"), {"weights": False})]
    with pytest.raises(DistributedError, match="intermediate_size=3 is less than tp=4"):
        rank_setup.check_model_shardable({**a, "tp": 4})


class FakeBackend:
    def __init__(self, name="cpu", device="cpu", graphs=None, fallbacks=()):
        self.name, self.device, self.graph_adapter = name, torch.device(device), graphs
        self.fallbacks = list(fallbacks)

    def with_standing_fallback(self, why):
        return FakeBackend(self.name, str(self.device), self.graph_adapter,
                           [*self.fallbacks, why])


@pytest.fixture
def rig(monkeypatch):
    log = {"world": None, "joined": [], "selected": [], "sharded": [], "loaded": []}
    monkeypatch.setattr(tp_group, "env_world", lambda: log["world"])
    monkeypatch.setattr(tp_group, "join", lambda device, tp, check=False:
                        log["joined"].append((device, tp, check)) or ("G", tp))

    class Reg:
        def select(self, name):
            log["selected"].append(name)
            return types.SimpleNamespace(backend=FakeBackend(name, "cuda:" + name[-1]))

    monkeypatch.setattr(Registry, "discover", classmethod(lambda cls: Reg()))
    monkeypatch.setattr(shard, "shard_target",
                        lambda target, group: log["sharded"].append((target, group)))
    monkeypatch.delenv(rank_setup.TP_GRAPHS_ENV, raising=False)
    return log


def _a(model, backend="cpu", tp=2, tp_check=0, **kw):
    return {"model": model, "draft": None, "revision": None, "draft_revision": None,
            "dtype": None, "backend": backend, "tp": tp, "tp_check": tp_check, **kw}


def test_a_cpu_rank_keeps_its_backend_and_copies_a_given_pair(rig):
    pair, be = _pair(), FakeBackend()
    got_be, group, got = rank_setup.rank_setup(_a(pair, tp_check=3), be)
    assert got_be is be and group == ("G", 2) and rig["selected"] == []
    assert rig["joined"] == [(torch.device("cpu"), 2, True)]
    assert got is not pair and got.target is not pair.target and got.target.cfg == pair.target.cfg
    assert rig["sharded"] == [(got.target, ("G", 2))]


@pytest.mark.parametrize("world, local", [(None, 0), ((3, 4, 1), 1)])
def test_an_accelerator_rank_takes_its_backend_on_its_local_device(rig, world, local):
    rig["world"] = world
    be = FakeBackend("cuda:0", "cuda:0")
    got_be, _, _ = rank_setup.rank_setup(_a(_pair(), backend="cuda:0"), be)
    assert rig["selected"] == [f"cuda:{local}"] and got_be.name == f"cuda:{local}"
    assert rig["joined"] == [(torch.device(f"cuda:{local}"), 2, False)]


@pytest.fixture
def cpu_backend():
    return get_backend("cpu")


def test_an_accelerator_backend_object_given_is_kept(cpu_backend, rig):
    be = FakeBackend("cuda", "cuda:0")
    given = cpu_backend
    got_be, _, _ = rank_setup.rank_setup(_a(_pair(), backend=given), be)
    assert got_be is be and rig["selected"] == []


@pytest.mark.parametrize("env, off", [(None, True), ("1", False), ("0", True)])
def test_graphs_are_turned_off_and_reported_unless_the_variable_keeps_them(rig, monkeypatch,
                                                                         env, off):
    if env is not None:
        monkeypatch.setenv(rank_setup.TP_GRAPHS_ENV, env)
    be = FakeBackend(graphs="adapter")
    got_be, _, _ = rank_setup.rank_setup(_a(_pair()), be)
    if off:
        assert got_be is not be and got_be.graph_adapter is None and be.graph_adapter == "adapter"
        assert got_be.fallbacks == [
            "graphs: off under tensor parallelism (collectives inside captured graphs are "
            "untested; DFLASH2RT_TP_GRAPHS=1 keeps them)"]
    else:
        assert got_be is be and be.graph_adapter == "adapter" and be.fallbacks == []


def test_without_graphs_nothing_is_reported(rig):
    be = FakeBackend()
    got_be, _, _ = rank_setup.rank_setup(_a(_pair()), be)
    assert got_be is be and be.fallbacks == []


@pytest.mark.parametrize("draft, plan", [(True, None), (False, "planned")])
def test_a_named_model_is_loaded_as_this_ranks_shard(rig, monkeypatch, tmp_path, draft, plan):
    loaded = _pair(shard_plan=plan)
    calls = []
    monkeypatch.setattr(hub, "locate_pair", lambda *a, **kw: (
        _loc(tmp_path / "t"), _loc(tmp_path / "d") if draft else None, "NAME"))
    monkeypatch.setattr(rank_setup, "resolve_dtype", lambda dtype, t, dev: ("dtype", dtype, t))
    monkeypatch.setattr(shard, "load_pair_shard", lambda *a: calls.append(a) or loaded)
    _, _, got = rank_setup.rank_setup(_a("m", dtype="bf16"), FakeBackend())
    t = str((tmp_path / "t").resolve())
    d = str((tmp_path / "d").resolve()) if draft else None
    assert calls == [(t, d, ("G", 2), ("dtype", "bf16", t), torch.device("cpu"), "NAME")]
    assert got is loaded
    assert rig["sharded"] == ([] if plan else [(loaded.target, ("G", 2))])


@pytest.mark.parametrize("heads, kv, world, want", [
    (4, 2, 2, "query heads 2+2, KV heads 1+1"),
    (3, 1, 2, "query heads 2+1, KV heads 1+1 (replicated)"),
    (8, 2, 3, "query heads 3+3+2, KV heads 1+3+1 (replicated)"),
    (8, 8, 4, "query heads 2+2+2+2, KV heads 2+2+2+2"),
])
def test_heads_line(heads, kv, world, want):
    pair = _pair(_cfg(heads=heads, kv=kv))
    assert rank_setup.heads_line(pair, types.SimpleNamespace(world=world)) == want
