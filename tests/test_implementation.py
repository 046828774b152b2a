"""What ran is declared: every Backend names the implementation of each op, a GPU plugin whose
kernels cannot be built says so as a kernel fallback, the reports read the real graph adapter,
the L4 model never degrades silently, and the level rule counts evidence (verdict.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from dflash2rt.backend import OPS, Probe, TorchOpsBackend
from dflash2rt.kernels.tuning import DEFAULT
from dflash2rt.plugin_kit import gpu_backend
from dflash2rt_conformance import env, models
from dflash2rt_conformance.verdict import level_result


def test_torch_ops_backend_declares_torch_ops_for_every_op():
    be = TorchOpsBackend("cpu", "cpu", (torch.float32,))
    assert be.implementation == {op: "torch ops" for op in OPS}
    assert be.implementation_summary() == "torch ops: " + ", ".join(OPS)
    assert be.kernel_fallbacks == []


def test_the_triton_interpret_backend_says_triton_interpreter():
    pytest.importorskip("triton", reason="triton is not installed (pip install "
                        "'dflash2rt[triton]')")
    code = ("from dflash2rt.registry import Registry; "
            "b = Registry.discover().select('triton-interpret').backend; "
            "print(sorted(b.implementation.items())); print(b.implementation_summary())")
    env_ = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env_, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines()[1] == ("triton interpreter: conv_prepare, conv_finish, "
                                          "select, verify, noise, attention, rms_norm, "
                                          "attention_prologue, watermark")


def test_gpu_backend_whose_kernels_fail_reports_a_kernel_fallback(monkeypatch):
    import types

    class Unbuildable(types.ModuleType):
        def __getattr__(self, name):
            raise RuntimeError("no kernels for this device")

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setitem(sys.modules, "dflash2rt.kernels.backend",
                        Unbuildable("dflash2rt.kernels.backend"))
    probe = Probe(True, device="cpu", details={"torch_device": "cpu"})
    be = gpu_backend("fakegpu", probe, (torch.float32,), DEFAULT)
    assert be.implementation["verify"] == "torch ops"
    assert len(be.kernel_fallbacks) == 1 and "no kernels for this device" in be.kernel_fallbacks[0]
    assert list(be.standing_fallbacks) == be.kernel_fallbacks
    impl, refused = env.implementation(be, "explicit", allow_fallback=False)
    assert refused and "asked for by name" in refused and "REFUSED" in impl["kernels"]
    impl, refused = env.implementation(be, "explicit", allow_fallback=True)
    assert refused is None and impl["kernels"].endswith("(fallback allowed by --allow-fallback)")
    assert env.implementation(be, "auto", allow_fallback=False)[1] is None


def test_graph_mode_reads_the_graph_adapter():
    be = TorchOpsBackend("x", "cpu", (torch.float32,))
    assert env.graph_mode(be) == "none"
    be.graph_adapter = type("A", (), {"name": "fake-graph"})()
    assert env.graph_mode(be) == "fake-graph"


def test_l4_auto_fails_loudly_when_the_installed_bundled_pair_cannot_load(monkeypatch):
    from dflash2rt import api

    def broken(*a, **k):
        raise OSError("truncated safetensors")

    monkeypatch.setattr(api, "resolve_model", broken)
    assert models.describe_l4("auto") == f"bundled {api.DEFAULT_MODEL!r}"
    with pytest.raises(RuntimeError, match="cannot be loaded .OSError: truncated safetensors.*"
                                           "--dflash2rt-model tiny"):
        models.l4_pair("auto", "cpu")


def test_l4_tiny_pair_only_when_asked_or_nothing_is_installed(monkeypatch):
    from dflash2rt import bundled

    pair, desc = models.l4_pair("tiny", "cpu")
    assert desc.startswith("tiny random pair (") and "--dflash2rt-model tiny" in desc
    assert pair.target.cfg.vocab_size == models.VOCAB
    monkeypatch.setattr(bundled, "bundled_models", lambda: [])
    pair, desc = models.l4_pair("auto", "cpu")
    assert desc.startswith("tiny random pair (") and "holds no model pair" in desc


def _counts(**kw):
    return {"passed": 0, "failed": 0, "skipped": 0, "tests": [], **kw}


@pytest.mark.parametrize("counts,selected,typed,na,result,reason", [
    (_counts(), 0, 0, None, "not selected", ""),
    (_counts(skipped=6), 6, 0, "no graphs", "skipped", ""),
    (_counts(passed=12), 12, 0, None, "pass", ""),
    (_counts(skipped=4, dtype_skipped=4), 4, 4, None, "fail", "nothing executed"),
    (_counts(passed=3, skipped=2, dtype_skipped=2, typed_executed=0), 5, 2, None, "fail",
     "none of the 2 dtype-parametrized"),
    (_counts(passed=1, skipped=4), 5, 0, None, "fail", "executed 1 < minimum 5"),
    (_counts(passed=2), 4, 0, None, "fail", "2 selected test(s) never ran"),
    (_counts(passed=2, errors=1), 3, 0, None, "fail", "1 setup error(s)"),
])
def test_level_rule(counts, selected, typed, na, result, reason):
    v = level_result("graphs", counts, selected, typed, 0, na)
    assert v["result"] == result, v
    assert not reason or any(reason in r for r in v["reasons"]), v["reasons"]


def test_level_minimum_discounts_only_undeclared_dtype_skips():
    v = level_result("L1", _counts(passed=10, skipped=190, dtype_skipped=190, typed_executed=4),
                     200, 194, 0, None)
    assert (v["result"], v["minimum"]) == ("pass", 10)
    v = level_result("L1", _counts(passed=10, skipped=190, typed_executed=4), 200, 194, 0, None)
    assert v["result"] == "fail" and v["minimum"] == 114
    v = level_result("L1", _counts(passed=10, skipped=90, typed_executed=4), 100, 94, 0, None)
    assert v["result"] == "fail" and v["minimum"] == 100      # never above what was selected
