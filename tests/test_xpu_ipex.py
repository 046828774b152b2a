"""The XPU plugin's vendor code: the optional IPEX (ipex.optimize on target and draft when
installed and matching torch's major.minor; a mismatch is reported in the run stats and IPEX is
left alone; a stand-in module records the calls, IPEX cannot be installed here), float64 support
read from the device, and opt-in graphs."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from dflash2rt import get_backend
from dflash2rt import plugin_kit
from dflash2rt.backend import Probe
from dflash2rt.engine.engine import Engine
from dflash2rt.engine.request import Request, SamplingParams

from tiny_models import tiny_pair

xpu = pytest.importorskip("dflash2rt_xpu.plugin", reason="the dflash2rt-xpu plugin is not "
                          "installed (pip install -e backends/xpu)")


@pytest.fixture
def fake_ipex(monkeypatch):
    calls = []
    mod = types.ModuleType("intel_extension_for_pytorch")
    mod.optimize = lambda m, dtype=None, inplace=False: calls.append((m, dtype, inplace)) or m
    monkeypatch.setitem(sys.modules, "intel_extension_for_pytorch", mod)
    return calls


def _installed(monkeypatch, version):
    real = xpu.metadata.version
    monkeypatch.setattr(xpu.metadata, "version",
                        lambda name: version if name == xpu.IPEX else real(name))


def _backend():
    probe = Probe(True, device="xpu:0 (stand-in on cpu)", dtypes=("float32", "float64"),
                  graphs="off by default", details={"torch_device": "cpu"})
    return plugin_kit.create(xpu.VENDOR, probe)


def _run(backend, pair=None):
    reqs = [Request((1, 2, 3), SamplingParams(max_new_tokens=6))]
    return Engine(pair or tiny_pair("dflash2", block=4), backend).generate(reqs)


def test_compatible_ipex_optimizes_target_and_draft_once(monkeypatch, fake_ipex):
    torch_xy = ".".join(torch.__version__.split(".")[:2])
    _installed(monkeypatch, f"{torch_xy}.10+xpu")
    usable, text = xpu.ipex_state()
    assert usable and "compatible" in text
    backend, pair = _backend(), tiny_pair("dflash2", block=4)
    outs, stats = _run(backend, pair)
    assert [type(m).__name__ for m, _, _ in fake_ipex] == ["TargetModel", "DraftModel"]
    assert all(inplace and dtype == torch.float64 for _, dtype, inplace in fake_ipex)
    want, _ = _run(get_backend("cpu"))
    assert outs[0].token_ids == want[0].token_ids
    _run(backend, pair)                                  # the same models: not optimized twice
    assert len(fake_ipex) == 2
    assert not any("IPEX" in f for f in stats.fallbacks)


def test_mismatched_ipex_is_reported_and_not_used(monkeypatch, fake_ipex):
    _installed(monkeypatch, "1.13.0+xpu")
    usable, text = xpu.ipex_state()
    assert usable is False and "needs torch 1.13.x" in text
    _, stats = _run(_backend())
    assert not fake_ipex
    assert any("IPEX 1.13.0+xpu installed but not used" in f for f in stats.fallbacks)


def test_absent_ipex_is_reported_by_the_probe_only(monkeypatch):
    monkeypatch.delitem(sys.modules, "intel_extension_for_pytorch", raising=False)
    usable, text = xpu.ipex_state()
    if usable is not None:
        pytest.skip(f"IPEX is installed here: {text}")
    assert "not installed" in text
    backend = _backend()
    assert backend.model_pass is None and not any("IPEX" in f for f in backend.standing_fallbacks)


def test_a_failing_model_pass_is_reported_and_leaves_models_alone(monkeypatch, fake_ipex):
    torch_xy = ".".join(torch.__version__.split(".")[:2])
    _installed(monkeypatch, f"{torch_xy}.0")
    sys.modules["intel_extension_for_pytorch"].optimize = lambda *a, **k: 1 / 0
    _, stats = _run(_backend())
    assert any("model pass skipped (ZeroDivisionError" in f for f in stats.fallbacks)


def test_fp64_comes_from_the_device_and_reaches_the_backend():
    assert xpu.has_fp64(types.SimpleNamespace(has_fp64=False)) is False
    assert xpu.has_fp64(types.SimpleNamespace(has_fp64=True)) is True
    assert xpu.VENDOR.fp64 is xpu.has_fp64
    probe = Probe(True, device="xpu:0 (stand-in on cpu)", dtypes=("float32",), fp64=False,
                  details={"torch_device": "cpu"})
    assert plugin_kit.create(xpu.VENDOR, probe).has_fp64 is False


def test_xpu_graphs_are_opt_in_and_the_vendor_declares_its_facts(monkeypatch):
    monkeypatch.delenv(xpu.GRAPHS_OPT_IN, raising=False)
    text, on = plugin_kit.graph_mode(xpu.VENDOR, "xpu:0")
    assert not on and f"set {xpu.GRAPHS_OPT_IN}=1" in text
    v = xpu.VENDOR
    assert (v.torch_device, v.triton.backend, v.graphs.graph_class) == ("xpu", "xpu", "XPUGraph")
    assert set(v.triton.compile_targets) == {"pvc", "dg2"}   # SPIR-V: test_kernels_compile_xpu
    assert v.peak_bandwidth("Intel Data Center GPU Max 1550")
