"""Compiling kernels ahead: Triton's keys, the warm-up pool, once per engine, failures reported."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dflash2rt import get_backend
from dflash2rt.engine import precompile
from dflash2rt.engine.engine import Engine
from dflash2rt.engine.request import Request, SamplingParams
from dflash2rt.kernels import launch as L
from dflash2rt.plugin_kit import interpreting
from dflash2rt.watermark import WatermarkKey

from tiny_models import fixed_policy, tiny_pair

KEY = WatermarkKey(bytes(range(32)))


def _reqs(temps=(1.0, 0.7, 0.0), new=6):
    return [Request((1 + i, 5, 9), SamplingParams(max_new_tokens=new, temperature=t, seed=i))
            for i, t in enumerate(temps)]


def test_compile_keys_are_tritons_specialization():
    """Ints (1 becomes a constant, multiples of 16 divisible), floats, bools, pointers (16-byte
    alignment), with and without specialization or alignment: as Triton's own."""
    lib = pytest.importorskip("triton._C.libtriton")
    native = getattr(lib, "native_specialize_impl", None)
    if native is None:
        pytest.skip("this Triton has no native_specialize_impl")
    from triton.backends.compiler import BaseBackend

    base = torch.zeros(64)
    values = [True, 1, 0, 16, 3, 48, 2**31, 2**31 + 5, 2**63 + 16, -1, -32, 1.5, None, base,
              base[1:], base[4:], base[3:], base.to(torch.bfloat16)[8:], base.long()[2:],
              base.to(torch.int8)[16:], base.bool(), L.Pointer(torch.float16, 8),
              L.Pointer(torch.int64, 0)]
    for v in values:
        for spec, align in ((True, True), (False, True), (True, False)):
            theirs = native(BaseBackend, v, False, spec, align)
            ours = L.arg_class(v, spec, align)
            assert ours[0] == theirs[0] and (ours[1] == "D") == (theirs[1] == "D"), \
                (v, spec, align, ours, theirs)


class constexpr:                                                  # noqa: N801
    """Stands in for ``tl.constexpr`` in an annotation."""


def _fake_kernel_fn(x_ptr, y_ptr, n, m, BLOCK: constexpr):          # noqa: N803
    """A kernel's signature (``compile_key`` reads its parameters)."""


class FakeKernel:
    """Stands in for a JITFunction: ``warmup`` records, or raises for BLOCK = 0."""

    fn = staticmethod(_fake_kernel_fn)
    do_not_specialize = ("m",)

    def __init__(self) -> None:
        self.warmed: list = []

    def warmup(self, *args, grid, **kw):
        if kw["BLOCK"] == 0:
            raise RuntimeError("no such tile")
        self.warmed.append((args, grid, kw))


def test_warm_up_compiles_every_variant_and_reports_each_failure():
    k, got, guards = FakeKernel(), L.Launches(), []
    x = torch.zeros(8)
    for block, n, m in ((16, 5, 7), (16, 5, 9), (32, 16, 1), (0, 5, 7)):
        got.add(k, (x, x[1:], n, m), {"BLOCK": block, "num_warps": 4})
    assert len(got.by_key) == 3 and got.count == 4          # m is not specialized

    @contextlib.contextmanager
    def guard():
        guards.append(1)
        yield

    failed = L.warm_up(list(got.by_key.values()), guard, threads=2)
    assert len(k.warmed) == 2 and len(guards) == 3
    assert [x.constexprs()["BLOCK"] for x in got.by_key.values() if x.key in failed] == [0]
    assert all("no such tile" in why for why in failed.values())
    args, grid, kw = k.warmed[0]
    assert args[0] == L.Pointer(torch.float32, 0, 32) and args[1].ptr == 4   # x[1:]: unaligned
    assert grid == (1,) and kw["num_warps"] == 4


def test_nothing_compiles_ahead_where_kernels_do_not_compile_for_a_device():
    pair = tiny_pair("dflash2", block=4, dtype=torch.float32)
    backend = get_backend("cpu")
    assert not backend.compiles_ahead and backend.compile_ahead([object()]) == {}
    _, stats = Engine(pair, backend).generate(_reqs(), watermark=KEY)
    assert stats.compile_s == 0.0 and stats.compile_variants == {}
    assert "compile_s" in stats.as_dict() and "compile_variants" in stats.as_dict()


def _pretend_backend(fail: str = ""):
    """The interpreter's KernelBackend as if its kernels compiled for a device: a trace
    collects its launches, ``compile_ahead`` records them (failing kernel ``fail``), and the
    steps compute with the torch ops (the interpreter would be slow; nothing is compared to
    it here)."""
    pytest.importorskip("triton")
    if not interpreting():
        pytest.skip("TRITON_INTERPRET is off in this process: the kernels compile for the GPU")
    from dflash2rt.backend import TorchOpsBackend
    from dflash2rt.kernels.backend import KernelBackend

    class Pretend(KernelBackend):
        compiles_ahead = True

        def __init__(self):
            super().__init__("pretend", "cpu", (torch.float32,))
            self.compiled: list[list] = []

        def compile_ahead(self, launches):
            self.compiled.append(list(launches))
            return {x.key: "pretended failure" for x in launches if x.name == fail}

        def _op(self, name, *a, **k):
            impl = KernelBackend if L.is_collecting() else TorchOpsBackend
            return getattr(impl, name)(self, *a, **k)

        def conv_prepare(self, *a, **k):
            return self._op("conv_prepare", *a, **k)

        def conv_finish(self, *a, **k):
            return self._op("conv_finish", *a, **k)

        def select(self, *a, **k):
            return self._op("select", *a, **k)

        def verify(self, *a, **k):
            return self._op("verify", *a, **k)

        def attention(self, q, k, v, lo, hi, scale):
            if L.is_collecting():
                return KernelBackend.attention(self, q, k, v, lo, hi, scale)
            return TorchOpsBackend.attention(self, q, k, v, lo, hi, scale)

    return Pretend()


def test_compile_ahead_runs_once_per_engine_reports_failures_and_changes_no_result(
        monkeypatch):
    monkeypatch.setattr(precompile, "_COMPILED", set())        # this process's compiled keys
    pair = tiny_pair("dflash2", block=4, dtype=torch.float32)
    backend = _pretend_backend(fail="conv._conv_kernel")
    with Engine(pair, backend) as engine:
        engine.policy = fixed_policy(4)
        outs, first = engine.generate(_reqs(), watermark=KEY)
        plan = backend.compiled[0]
        assert len(backend.compiled) == 1 and len({x.key for x in plan}) == len(plan)
        want: dict[str, int] = {}
        for x in plan:
            want[x.name] = want.get(x.name, 0) + 1
        assert first.compile_variants == {n: c for n, c in want.items()
                                          if n != "conv._conv_kernel"}
        assert first.compile_variants["selector._walk_kernel"] == 3      # greedy, sampled, keyed
        assert first.compile_variants["verify._verify_kernel"] == 3
        failed = [f for f in first.fallbacks if f.startswith("compile-ahead of conv._conv_kernel")]
        assert len(failed) == want["conv._conv_kernel"] == 2
        assert all("pretended failure" in f for f in failed)
        _, again = engine.generate(_reqs(), watermark=KEY)               # planned: nothing
        assert again.compile_s == 0.0 and again.compile_variants == {}
        assert len(backend.compiled) == 1 and again.fallbacks == []
        _, other = engine.generate(_reqs(), block_size=3)                # a new block: traced
        assert other.compile_variants == {} and backend.compiled[1] == []
    with Engine(pair, backend) as engine:             # another engine: nothing left to compile
        _, later = engine.generate(_reqs(), block_size=4, watermark=KEY)
        assert later.compile_variants == {} and backend.compiled[2] == []
    with Engine(pair, get_backend("cpu")) as engine:  # the same choices and tokens as the CPU's
        engine.policy = fixed_policy(4)
        ref, _ = engine.generate(_reqs(), watermark=KEY)
    assert [o.token_ids for o in outs] == [o.token_ids for o in ref]


def test_a_failed_trace_is_reported_not_fatal(monkeypatch):
    monkeypatch.setattr(precompile, "_COMPILED", set())
    pair = tiny_pair("dflash2", block=4, dtype=torch.float32)
    backend = _pretend_backend()

    def broken(*a, **k):
        raise RuntimeError("trace broke")
    monkeypatch.setattr(precompile, "kernel_plan", broken)
    _, stats = Engine(pair, backend).generate(_reqs(), block_size=4)
    assert stats.compile_variants == {} and backend.compiled == []
    assert any(f.startswith("compile-ahead skipped") and "trace broke" in f
               for f in stats.fallbacks)


@pytest.mark.slow                   # compiles every variant for sm90 (tens of seconds on 2 cores)
def test_every_launch_finds_its_binary_on_a_simulated_device():
    """tests/sim_sm90.py, in a process whose kernels compile (TRITON_INTERPRET=0) for a stand-in
    sm90 driver: an engine with a re-running graph adapter compiles ahead, then every kernel
    launch of watermarked, greedy and sampled calls at adaptive and fixed blocks computes its
    key with Triton's own binder and must find it compiled."""
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    script = Path(__file__).with_name("sim_sm90.py")
    res = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                         timeout=3000)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "misses 0" in res.stdout and "compile_variants {'attention" in res.stdout
