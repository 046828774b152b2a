"""``launch.spawn`` over scripted processes and a scripted result queue on a fake clock (no
process is started): the processes it makes, rank 0's value, how each rank's end is named, the
rank blamed first, when the survivors are terminated; and a rank's entry, ``_describe`` and
``_exit_reason``, each written out here by hand."""

from __future__ import annotations

import os
import queue
import socket
import types

import pytest
import torch

from dflash2rt.distributed import launch, rank_setup, shard
from dflash2rt.errors import DistributedError
from dflash2rt.models.config import TargetConfig
from dflash2rt.models.pair import ModelPair
from tiny_models import target_dict


class Clock:
    """Whole milliseconds, so that sums of waits are exact."""

    def __init__(self):
        self.ms = 100_000

    @property
    def t(self):
        return self.ms / 1000

    def wait(self, seconds):
        self.ms += round(seconds * 1000)

    def monotonic(self):
        return self.t


class Queue:
    """``script``: (rank, kind, value) messages, or None for a get that waits out its timeout
    (the clock moves on by it); once the script is spent every get waits."""

    def __init__(self, clock, script):
        self.clock, self.script, self.gets = clock, list(script), []

    def get(self, timeout):
        self.gets.append(timeout)
        if len(self.gets) > 500:
            raise AssertionError("spawn kept polling a finished run")
        item = self.script.pop(0) if self.script else None
        if item is None:
            self.clock.wait(timeout)
            raise queue.Empty
        return item


class Proc:
    """Exits with ``code`` once the clock reaches ``exit_at`` (never: None)."""

    def __init__(self, clock, exit_at=None, code=0, **kw):
        self.clock, self.exit_at, self.code, self.kw = clock, exit_at, code, kw
        self.started = self.terminated = False
        self.joins = []

    @property
    def exitcode(self):
        if self.terminated:
            return -15
        if self.exit_at is not None and self.clock.t >= self.exit_at:
            return self.code
        return None

    def start(self):
        self.started = True

    def is_alive(self):
        return self.exitcode is None

    def terminate(self):
        self.terminated = True

    def join(self, timeout):
        self.joins.append(timeout)


class Rig:
    def __init__(self, monkeypatch, script, exits=None):
        self.clock = Clock()
        self.queue = Queue(self.clock, script)
        self.exits, self.procs = exits or {}, []
        rig = self

        class Ctx:
            def Queue(self):
                return rig.queue

            def Process(self, target, args, name, daemon):
                r = args[0]
                exit_at, code = rig.exits.get(r, (None, 0))
                p = Proc(rig.clock, exit_at, code, target=target, args=args, name=name,
                         daemon=daemon)
                rig.procs.append(p)
                return p

        monkeypatch.setattr(launch, "mp", types.SimpleNamespace(
            get_context=lambda method: Ctx() if method == "spawn" else pytest.fail(method)))
        monkeypatch.setattr(launch, "time", self.clock)
        monkeypatch.setattr(launch, "free_port", lambda: 4242)


def fn(x):
    return x


def test_every_rank_ok_returns_rank_zeros_value(monkeypatch):
    monkeypatch.setenv("DFLASH2RT_TP_TIMEOUT", "33")
    rig = Rig(monkeypatch, [None, (1, "ok", None), (0, "ok", "R")], exits={1: (100.0, 0)})
    assert launch.spawn(fn, 2, (7,)) == "R"
    assert [(p.kw["target"], p.kw["args"], p.kw["name"], p.kw["daemon"]) for p in rig.procs] == [
        (launch._entry, (r, 2, 4242, 33.0, fn, (7,), rig.queue), f"dflash2rt-tp-rank{r}", True)
        for r in (0, 1)]
    # rank 1 has exited by the first poll: its message is waited for (1 s); the live rank 0 is
    # terminated at the end, the exited one is not; both are joined
    assert rig.queue.gets == [0.2, 1.0, 0.2]
    assert [(p.started, p.terminated, p.joins) for p in rig.procs] == [(True, True, [5]),
                                                                       (True, False, [5])]


def test_rank_zero_ending_last_or_first_is_still_the_answer(monkeypatch):
    Rig(monkeypatch, [(0, "ok", "first"), (2, "ok", None), (1, "ok", None)])
    assert launch.spawn(fn, 3, timeout_s=1) == "first"


def test_a_failed_rank_then_the_others_are_terminated_after_timeout_and_grace(monkeypatch):
    rig = Rig(monkeypatch, [(1, "error", "ValueError: x")], exits={1: (100.0, 1)})
    with pytest.raises(DistributedError) as exc:
        launch.spawn(fn, 2, timeout_s=3, grace_s=2.5)
    assert str(exc.value) == ("tensor-parallel run failed (tp=2; rank 1 first):\n"
                              "rank 0: still running 6s after another rank failed: terminated\n"
                              "rank 1: ValueError: x")
    # the error arrived at t = 100; gets of 0.2 s until more than 5.5 s had passed
    assert rig.queue.gets == [0.2] * 29 and rig.clock.t == 105.6
    assert rig.procs[0].terminated and not rig.procs[1].terminated
    assert [p.joins for p in rig.procs] == [[5], [5]]


def test_the_default_grace(monkeypatch):
    Rig(monkeypatch, [(1, "error", "E: y")], exits={1: (100.0, 1)})
    with pytest.raises(DistributedError, match="rank 0: still running 13s after another rank"):
        launch.spawn(fn, 2, timeout_s=3)


def test_terminated_when_more_than_timeout_plus_grace_has_passed(monkeypatch):
    """On a clock that lands on timeout + grace exactly, the survivors are terminated one
    poll later (more than that must have passed)."""
    rig = Rig(monkeypatch, [(1, "error", "E: y")], exits={1: (100.0, 1)})
    rig.queue.get = _quarter_gets(rig.queue)
    with pytest.raises(DistributedError):
        launch.spawn(fn, 2, timeout_s=1, grace_s=1)
    assert rig.clock.t == 102.25


def _quarter_gets(q):
    def get(timeout):
        q.gets.append(timeout)
        if q.script:
            return q.script.pop(0)
        q.clock.wait(0.25)
        raise queue.Empty
    return get


def test_the_first_error_starts_the_countdown(monkeypatch):
    rig = Rig(monkeypatch, [(1, "error", "E: one"), None, None, None, None, None,
                            (2, "error", "E: two")], exits={1: (100.0, 1), 2: (101.0, 1)})
    with pytest.raises(DistributedError) as exc:
        launch.spawn(fn, 3, timeout_s=1, grace_s=1)
    assert str(exc.value) == ("tensor-parallel run failed (tp=3; rank 1 first):\n"
                              "rank 0: still running 2s after another rank failed: terminated\n"
                              "rank 1: E: one\nrank 2: E: two")
    assert rig.clock.t == 102.2


def test_a_rank_that_dies_silently_is_blamed_before_those_that_report(monkeypatch):
    rig = Rig(monkeypatch, [None, None, None, None, (0, "error", "DistributedError: peer gone")],
              exits={1: (100.4, -9)})
    with pytest.raises(DistributedError) as exc:
        launch.spawn(fn, 3, timeout_s=2, grace_s=1)
    assert str(exc.value) == ("tensor-parallel run failed (tp=3; rank 1 first):\n"
                              "rank 0: DistributedError: peer gone\n"
                              "rank 1: died, killed by SIGKILL\n"
                              "rank 2: still running 3s after another rank failed: terminated")
    # two polls, rank 1 found dead at t = 100.4 and its message waited for (1 s): none came,
    # so it failed at 101.4 (rank 0's later error does not restart the countdown) and rank 2
    # is terminated once more than 3 s have passed since
    assert rig.queue.gets[:5] == [0.2, 0.2, 1.0, 0.2, 0.2]
    assert rig.clock.t == 104.6
    assert [p.terminated for p in rig.procs] == [True, False, True]


def test_a_slow_rank_after_an_ok_one_is_waited_for(monkeypatch):
    """Only a failure starts the countdown: a rank ending well after rank 0's result is not
    terminated."""
    rig = Rig(monkeypatch, [(0, "ok", "R")] + [None] * 40 + [(1, "ok", None)],
              exits={0: (100.0, 0)})
    assert launch.spawn(fn, 2, timeout_s=1, grace_s=1) == "R"
    assert rig.clock.t == 108.0


def test_a_dead_ranks_message_still_in_flight_is_read(monkeypatch):
    rig = Rig(monkeypatch, [None, (1, "error", "RuntimeError: boom")],
              exits={1: (100.2, 1), 0: (100.2, 0)})
    rig.queue.script.append((0, "ok", "zero"))
    with pytest.raises(DistributedError) as exc:
        launch.spawn(fn, 2, timeout_s=1, grace_s=1)
    assert str(exc.value) == ("tensor-parallel run failed (tp=2; rank 1 first):\n"
                              "rank 1: RuntimeError: boom")
    assert rig.queue.gets == [0.2, 1.0, 0.2]


def test_the_in_flight_error_starts_the_countdown(monkeypatch):
    rig = Rig(monkeypatch, [None, (1, "error", "E: boom")], exits={1: (100.2, 1)})
    with pytest.raises(DistributedError, match="rank 0: still running 2s after"):
        launch.spawn(fn, 2, timeout_s=1, grace_s=1)
    assert rig.clock.t == 102.4


@pytest.mark.parametrize("code, want", [
    (None, "still running"), (0, "exited with code 0"), (3, "exited with code 3"),
    (-9, "killed by SIGKILL"), (-15, "killed by SIGTERM"), (-1, "killed by SIGHUP"),
    (-200, "killed by signal 200"),
])
def test_exit_reasons(code, want):
    assert launch._exit_reason(code) == want


def _cfg():
    return TargetConfig.from_dict({**target_dict("qwen3"), "num_attention_heads": 4})


def _raise_line() -> int:
    lines = open(shard.__file__, encoding="utf-8").read().splitlines()
    at = next(i for i, s in enumerate(lines) if "if cfg.num_attention_heads < tp:" in s)
    return at + 2                      # 1-based: the raise on the line after the test


class Results:
    def __init__(self):
        self.items = []

    def put(self, item):
        self.items.append(item)


@pytest.fixture
def rank_env(monkeypatch):
    """_entry's variables restored afterwards, and torch's thread count."""
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
              "MASTER_PORT", "DFLASH2RT_TP_TIMEOUT"):
        monkeypatch.setenv(k, "unset")
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_a_ranks_error_is_one_line_at_its_innermost_dflash2rt_frame(rank_env):
    """Three dflash2rt frames: _entry (launch.py), check_model_shardable (rank_setup.py) and
    check_shardable (shard.py), which raised."""
    results = Results()
    pair = ModelPair(types.SimpleNamespace(cfg=_cfg()), None)
    launch._entry(3, 5, 1234, 9.5, rank_setup.check_model_shardable,
                  ({"model": pair, "tp": 5},), results)
    [(rank, kind, text)] = results.items
    assert (rank, kind) == (3, "error")
    assert text == ("DistributedError: num_attention_heads=4 is less than tp=5: every rank needs "
                    "at least one query head; use a smaller tp "
                    f"(at {shard.__file__}:{_raise_line()} in check_shardable)")


def test_describe_outside_dflash2rt_names_no_frame():
    try:
        raise KeyError("  spaced  ")
    except KeyError as exc:
        assert launch._describe(exc) == "KeyError: '  spaced  '"
    try:
        raise ValueError("  padded \n")
    except ValueError as exc:
        assert launch._describe(exc) == "ValueError: padded"


@pytest.mark.parametrize("rank, cpus, world, threads, value", [
    (0, 8, 2, 4, "R"), (1, 8, 2, 4, None), (0, 8, 3, 2, "R"), (2, 8, 16, 1, None),
    (0, None, 1, 1, "R"),
])
def test_a_rank_sets_its_environment_threads_and_reports(rank_env, monkeypatch, rank, cpus,
                                                         world, threads, value):
    monkeypatch.setattr(os, "cpu_count", lambda: cpus)
    results = Results()
    launch._entry(rank, world, 5555, 7.5, lambda a, b: a + b, ("R", ""), results)
    assert results.items == [(rank, "ok", value)]
    assert {k: os.environ[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                                       "MASTER_ADDR", "MASTER_PORT", "DFLASH2RT_TP_TIMEOUT")} \
        == {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "5555",
            "DFLASH2RT_TP_TIMEOUT": "7.5"}
    assert torch.get_num_threads() == threads


def test_a_ranks_process_group_is_torn_down(rank_env, tmp_path):
    import torch.distributed as dist

    def run():
        store = dist.FileStore(str(tmp_path / "store"), 1)
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
        return dist.is_initialized()

    results = Results()
    try:
        launch._entry(0, 1, 5555, 7.5, run, (), results)
        assert results.items == [(0, "ok", True)] and not dist.is_initialized()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_a_free_port_is_an_unprivileged_port_free_now():
    port = launch.free_port()
    assert 1024 < port < 65536
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", port))
