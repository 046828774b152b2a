"""Joining a tensor-parallel group, against distributed/group.py's docstrings: the backend of
each device type written out, the timeout variable and torchrun's variables each alone (set,
unset, not a number), and ``join`` over a fake ``torch.distributed`` that records every call."""

from __future__ import annotations

import datetime
from types import SimpleNamespace

import pytest
import torch

from dflash2rt.distributed import group as G
from dflash2rt.distributed.group import TPGroup, default_timeout, env_world, join, pg_backend
from dflash2rt.errors import DistributedError


def test_backends_of_each_device_type():
    assert [pg_backend(t) for t in ("cpu", "cuda", "xpu")] == ["gloo", "nccl", "xccl"]
    for t in ("mps", "meta", "hpu", ""):
        with pytest.raises(DistributedError) as e:
            pg_backend(t)
        assert str(e.value) == (f"no torch.distributed backend for device type {t!r} "
                                "(tensor parallelism runs on cpu, cuda, xpu)")


def test_default_timeout_from_the_environment(monkeypatch):
    monkeypatch.delenv("DFLASH2RT_TP_TIMEOUT", raising=False)
    assert default_timeout() == 300.0
    for raw, want in (("12.5", 12.5), ("7", 7.0), ("0", 0.0), (" 3 ", 3.0)):
        monkeypatch.setenv("DFLASH2RT_TP_TIMEOUT", raw)
        assert default_timeout() == want
    for raw in ("", "ten", "5s"):
        monkeypatch.setenv("DFLASH2RT_TP_TIMEOUT", raw)
        with pytest.raises(DistributedError, match=r"\$DFLASH2RT_TP_TIMEOUT must be a number "
                           f"of seconds, got {raw!r}"):
            default_timeout()


@pytest.fixture
def no_env(monkeypatch):
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "DFLASH2RT_TP_TIMEOUT"):
        monkeypatch.delenv(k, raising=False)
    return monkeypatch


def test_env_world_each_variable_alone(no_env):
    assert env_world() is None
    no_env.setenv("WORLD_SIZE", "4")
    assert env_world() is None                             # no RANK
    no_env.delenv("WORLD_SIZE")
    no_env.setenv("RANK", "2")
    assert env_world() is None                             # no WORLD_SIZE
    no_env.setenv("WORLD_SIZE", "4")
    assert env_world() == (2, 4, 2)                        # LOCAL_RANK defaults to RANK
    no_env.setenv("LOCAL_RANK", "0")
    assert env_world() == (2, 4, 0)
    for bad in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        no_env.setenv(bad, "x")
        with pytest.raises(DistributedError, match="RANK, WORLD_SIZE and LOCAL_RANK must be "
                           "integers"):
            env_world()
        no_env.setenv(bad, {"RANK": "2", "WORLD_SIZE": "4", "LOCAL_RANK": "0"}[bad])
        assert env_world() == (2, 4, 0)


def test_tp_group_is_main_only_on_rank_zero():
    g = [TPGroup(r, 3, None, None, "gloo", 1.0) for r in range(3)]
    assert [x.is_main for x in g] == [True, False, False]
    assert g[0].check is False
    with pytest.raises(AttributeError):                      # a frozen value
        g[0].rank = 1


class _FakeDist:
    """torch.distributed as ``join`` sees it: a default group that is up or not, its size,
    backend and rank; every call recorded."""

    def __init__(self, monkeypatch, up: bool, size: int, backend: str, rank: int = 1) -> None:
        self.up, self.size, self.backend, self.rank, self.calls = up, size, backend, rank, []
        self.group = SimpleNamespace(WORLD="world")
        for name in ("is_initialized", "init_process_group", "get_world_size", "get_backend",
                     "new_group", "get_rank"):
            monkeypatch.setattr(G.dist, name, getattr(self, name))
        monkeypatch.setattr(G.dist, "group", self.group)

    def is_initialized(self):
        return self.up

    def init_process_group(self, backend, **kw):
        self.calls.append(("init", backend, kw))
        self.up = True

    def get_world_size(self):
        return self.size

    def get_backend(self, group):
        assert group == "world"
        return self.backend

    def new_group(self, **kw):
        self.calls.append(("new_group", kw))
        return "host"

    def get_rank(self):
        return self.rank


def test_join_without_a_group_or_torchrun_is_refused(no_env):
    fake = _FakeDist(no_env, up=False, size=2, backend="gloo")
    with pytest.raises(DistributedError, match="tp=2 needs a process group"):
        join(torch.device("cpu"), 2)
    assert fake.calls == []


def test_join_refuses_a_world_size_other_than_tp(no_env):
    no_env.setenv("RANK", "0")
    no_env.setenv("WORLD_SIZE", "3")
    fake = _FakeDist(no_env, up=False, size=3, backend="gloo")
    with pytest.raises(DistributedError, match="tp=2 but WORLD_SIZE=3"):
        join(torch.device("cpu"), 2)
    assert fake.calls == []
    up = _FakeDist(no_env, up=True, size=3, backend="gloo")      # a group already up
    with pytest.raises(DistributedError, match="tp=2 but the process group has 3 ranks"):
        join(torch.device("cpu"), 2)
    assert up.calls == []


def test_join_initialises_gloo_from_the_environment(no_env):
    no_env.setenv("RANK", "1")
    no_env.setenv("WORLD_SIZE", "2")
    no_env.setenv("DFLASH2RT_TP_TIMEOUT", "42")
    fake = _FakeDist(no_env, up=False, size=2, backend="gloo")
    g = join(torch.device("cpu"), 2)
    assert fake.calls == [("init", "gloo", {"init_method": "env://", "rank": 1,
                                            "world_size": 2,
                                            "timeout": datetime.timedelta(seconds=42)})]
    assert g == TPGroup(1, 2, "world", "world", "gloo", 42.0, False)   # gloo: host = device


def test_join_on_nccl_adds_a_gloo_host_group_and_binds_the_device(no_env):
    no_env.setenv("RANK", "0")
    no_env.setenv("WORLD_SIZE", "4")
    fake = _FakeDist(no_env, up=False, size=4, backend="nccl", rank=0)
    dev = torch.device("cuda", 2)
    g = join(dev, 4, timeout_s=5, check=True)
    span = datetime.timedelta(seconds=5)
    assert fake.calls == [
        ("init", "nccl", {"init_method": "env://", "rank": 0, "world_size": 4,
                          "timeout": span, "device_id": dev}),
        ("new_group", {"backend": "gloo", "timeout": span})]
    assert g == TPGroup(0, 4, "world", "host", "nccl", 5.0, True)
    assert isinstance(g.timeout_s, float)


def test_join_an_existing_group_uses_it(no_env):
    no_env.setenv("DFLASH2RT_TP_TIMEOUT", "9")
    fake = _FakeDist(no_env, up=True, size=3, backend="gloo", rank=2)
    assert join(torch.device("cpu"), 3) == TPGroup(2, 3, "world", "world", "gloo", 9.0)
    assert fake.calls == []
    with pytest.raises(DistributedError, match="no torch.distributed backend"):
        join(torch.device("meta"), 3)
