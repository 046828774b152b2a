"""plugin_kit's graph self-test, every vendor's gate for graphs: select, verify, attention and a
KV commit captured for two buckets in one pool, replayed on fresh inputs, compared with eager.
Run here with stand-in adapters: one that really re-runs what it captured (passes), ones that
bake inputs in, replay nothing, or share memory wrongly (each caught)."""

from __future__ import annotations

import contextlib

import pytest
import torch

from dflash2rt.backend import TorchOpsBackend
from dflash2rt.plugin_kit import graph_self_test


class Adapter:
    """Replays by re-running the captured function (what a correct graph does)."""

    name = "fake-graph"

    def __init__(self, device="cpu"):
        self.device = torch.device(device)
        self.pools, self.captures = [], 0

    def new_pool(self):
        self.pools.append(object())
        return self.pools[-1]

    @contextlib.contextmanager
    def capture_stream(self):
        yield

    def capture(self, fn, pool):
        assert pool is self.pools[-1]
        self.captures += 1
        fn()
        return type("G", (), {"replay": staticmethod(fn)})()


class Baking(Adapter):
    """A capture that read its inputs once: replay writes back what the capture computed."""

    def capture(self, fn, pool):
        fn()
        frame = fn.__defaults__[2]                      # the step's output dict
        baked = {k: v.clone() for k, v in frame.items()}

        def replay():
            for k, v in baked.items():
                frame[k] = v.clone()
        return type("G", (), {"replay": staticmethod(replay)})()


class Lossy(Adapter):
    """Replays everything but the KV commit's writes (a lost kernel in the graph)."""

    def capture(self, fn, pool):
        fn()
        cache = fn.__defaults__[1]

        def replay():
            saved = [t.clone() for t in (*cache.k, *cache.v)]
            fn()
            for t, s in zip((*cache.k, *cache.v), saved):
                t.copy_(s)
        return type("G", (), {"replay": staticmethod(replay)})()


@pytest.fixture(scope="module")
def ops():
    return TorchOpsBackend("self-test", "cpu", (torch.float32,))


def test_a_correct_replay_passes_with_one_pool(ops):
    a = Adapter()
    assert graph_self_test(a, ops) is None
    assert a.captures == 2 and len(a.pools) == 1


def test_a_capture_that_baked_its_inputs_fails(ops):
    why = graph_self_test(Baking(), ops)
    assert why and why.startswith("graph replay != eager on fresh inputs: ")


def test_a_replay_that_loses_the_kv_commit_fails(ops):
    assert graph_self_test(Lossy(), ops) == \
        "graph replay != eager on fresh inputs: the KV commit (bucket 1)"


@pytest.mark.slow                       # a long run (over 10 s on 2 cores)
def test_the_kernels_pass_it_too():
    """The self-test with the Triton kernels (the interpreter on the CPU), with and without
    float64 — what a vendor's probe runs with its own kernels."""
    pytest.importorskip("triton")
    from dflash2rt.kernels.backend import KernelBackend
    from dflash2rt.plugin_kit import interpreting

    if not interpreting():
        pytest.skip("TRITON_INTERPRET is off (a GPU is present): the device probe runs it")
    for fp64 in (True, False):
        be = KernelBackend("self-test", "cpu", (torch.float32,), has_fp64=fp64)
        assert graph_self_test(Adapter(), be) is None
