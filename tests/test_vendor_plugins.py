"""Vendor facts as data (plugin_kit.GpuVendor): the generic probe and create they drive, the
Triton target check and kernel smoke launch at creation (injected here: no GPU), and the core
asking the plugins for compile targets and peak bandwidth instead of naming them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from dflash2rt import plugin_kit
from dflash2rt.backend import Probe, TorchOpsBackend
from dflash2rt.kernels.smoke import smoke_launch
from dflash2rt.registry import Registry

from fixture_plugins import write_plugin

ROCM_LIKE = plugin_kit.TritonFacts(
    backend="hip", distribution="pytorch-triton-rocm",
    tuning={64: plugin_kit.Tuning(256, 2048, 4), 32: plugin_kit.Tuning(256, 2048, 8)})
CPU_PROBE = Probe(True, device="cpu", dtypes=("float32",), details={"torch_device": "cpu"})


def fake_vendor(**kw) -> plugin_kit.GpuVendor:
    """A vendor on ``torch.cpu`` (a CPU-only torch has no GPU device module to probe)."""
    base = dict(name="fakegpu", priority=7, summary="fake", vendor="Fake", pci_vendor=0xFFFF,
                device_nodes=("/dev/fakegpu*",), visible_env=("FAKE_VISIBLE",),
                torch_device="cpu", build="git_version", build_label="Fake",
                driver_hint="no fake GPU", describe="{p.name} (warp {p.warp_size}, {gib:.0f} GiB)",
                triton=ROCM_LIKE, graphs=plugin_kit.GraphPolicy("FakeGraph", "fake graphs"),
                peak_gbps={"Fake 9000": 1234.0})
    return plugin_kit.GpuVendor(**{**base, **kw})


@pytest.fixture
def fake_cpu_device(monkeypatch):
    props = SimpleNamespace(name="Fake 9000", total_memory=8 * 2**30, warp_size=32,
                            has_fp64=False)
    monkeypatch.setattr(torch.cpu, "get_device_properties", lambda i: props, raising=False)
    monkeypatch.setattr(torch.cpu, "is_bf16_supported", lambda: False, raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    return props


def test_generic_probe_reads_the_vendor_data(fake_cpu_device, monkeypatch):
    monkeypatch.setenv("FAKE_VISIBLE", "3")
    v = fake_vendor(bf16_if_supported=True, fp64=lambda p: p.has_fp64,
                    note=lambda: ("EXTRA", "a vendor note"))
    p = plugin_kit.probe(v)
    assert p.available and p.device == "cpu:0 Fake 9000 (warp 32, 8 GiB)"
    assert p.dtypes == ("float32", "float16")           # bfloat16 dropped: not supported
    assert p.fp64 is False and p.details["warp_size"] == "32"
    assert p.kernels.endswith("; EXTRA a vendor note") and p.details["extra"] == "a vendor note"
    assert p.graphs.endswith("has no torch.cpu.FakeGraph") and p.details["graph_capture"] == "off"
    missing = plugin_kit.probe(fake_vendor(build="no_such_build"))
    assert not missing.available and "has no Fake support" in missing.reason
    assert "hardware: 0 Fake PCI device(s)" in missing.reason


def test_create_uses_the_tuning_for_the_probed_warp_size(fake_cpu_device):
    v = fake_vendor(fp64=lambda p: p.has_fp64)
    p = plugin_kit.probe(v)
    be = plugin_kit.create(v, p, target_lookup=lambda: "hip", smoke=lambda b: None)
    assert type(be).__name__ == "KernelBackend" and be.tuning == plugin_kit.Tuning(256, 2048, 8)
    assert be.has_fp64 is False and not be.kernel_fallbacks
    assert ROCM_LIKE.tuning_for(64).num_warps == 4 and ROCM_LIKE.tuning_for(None).num_warps == 4
    assert any(f.startswith("fake graphs not used") for f in be.standing_fallbacks)


def test_opt_in_graphs_stay_off_unless_asked_and_a_failing_self_test_turns_them_off(
        fake_cpu_device, monkeypatch):
    policy = plugin_kit.GraphPolicy("FakeGraph", "fake graphs", opt_in_env="FAKE_GRAPHS",
                             self_test=lambda adapter: "replay differed (fixture)")
    monkeypatch.setattr(torch.cpu, "FakeGraph", object, raising=False)
    monkeypatch.setattr(torch.cpu, "graph", lambda *a, **k: None, raising=False)
    v = fake_vendor(graphs=policy)
    assert plugin_kit.graph_mode(v, "cpu") == (
        "off by default: set FAKE_GRAPHS=1 to opt in (gated by replay == eager)", False)
    monkeypatch.setenv("FAKE_GRAPHS", "1")
    assert plugin_kit.graph_mode(v, "cpu") == (
        "off: self-test failed: replay differed (fixture)", False)
    ok = fake_vendor(graphs=plugin_kit.GraphPolicy("FakeGraph", "fake graphs",
                                                   opt_in_env="FAKE_GRAPHS",
                                                   self_test=lambda adapter: None))
    text, on = plugin_kit.graph_mode(ok, "cpu")
    assert on and text.startswith("fake graphs via torch.cpu.FakeGraph") and "self-test passed" \
        in text
    monkeypatch.setenv(plugin_kit.GRAPHS_ENV, "0")
    assert plugin_kit.graph_mode(ok, "cpu")[1] is False


def test_target_mismatch_and_smoke_failure_are_kernel_fallbacks(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    be = plugin_kit.gpu_backend("g", CPU_PROBE, (torch.float32,), plugin_kit.Tuning(),
                                triton=ROCM_LIKE, target_lookup=lambda: "cuda")
    assert type(be) is TorchOpsBackend and len(be.kernel_fallbacks) == 1
    assert "Triton's active target is 'cuda', this backend needs 'hip'" in be.kernel_fallbacks[0]
    assert "pytorch-triton-rocm" in be.kernel_fallbacks[0]

    def boom(backend):
        raise RuntimeError("smoke launch of verify-sampled failed (fixture)")
    pytest.importorskip("triton")
    be = plugin_kit.gpu_backend("g", CPU_PROBE, (torch.float32,), plugin_kit.Tuning(),
                                triton=ROCM_LIKE, target_lookup=lambda: "hip", smoke=boom)
    assert type(be) is TorchOpsBackend and "verify-sampled" in be.kernel_fallbacks[0]
    assert list(be.standing_fallbacks) == be.kernel_fallbacks


def test_smoke_cases_launch_every_op_on_tiny_inputs():
    smoke_launch(TorchOpsBackend("ref", "cpu", (torch.float32,)))     # the reference ops
    pytest.importorskip("triton")
    code = ("import torch; from dflash2rt.kernels.backend import KernelBackend; "
            "from dflash2rt.kernels.smoke import smoke_launch; "
            "smoke_launch(KernelBackend('interp', 'cpu', (torch.float32,)))")
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}   # the kernels
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]

    class Broken(TorchOpsBackend):
        def verify(self, *a, **k):
            raise ValueError("bad launch")
    with pytest.raises(RuntimeError, match="smoke launch of verify-greedy on cpu failed: "
                                           "ValueError: bad launch"):
        smoke_launch(Broken("b", "cpu", (torch.float32,)))


def test_core_asks_the_plugins_for_compile_targets_and_peak_bandwidth():
    from dflash2rt.kernels import compile_check
    from dflash2rt.qualify.microbench import peak_bandwidth

    reg = Registry.discover()
    names = {v.name for v in reg.vendors}
    if not {"cuda", "rocm"} <= names:
        pytest.skip("the dflash2rt-cuda / dflash2rt-rocm plugins are not installed")
    targets = compile_check.targets()
    assert targets["sm90"][:3] == ("cuda", 90, 32)
    assert targets["gfx942"][:3] == ("hip", "gfx942", 64)
    assert targets["gfx1100"][3].num_warps == 8 and targets["gfx942"][3].num_warps == 4
    assert peak_bandwidth("NVIDIA H200") == 4800.0 and peak_bandwidth("Nothing") is None
    assert peak_bandwidth("Fake 9000 rev B", [fake_vendor()]) == 1234.0
    from dflash2rt.qualify import microbench

    assert not hasattr(microbench, "PEAK_GBPS")


@pytest.fixture
def gpu_style_plugins(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    for kind in ("mismatch", "smokefail"):
        write_plugin(tmp_path, kind)
    return tmp_path


WHY = {"fx-mismatch": "Triton's active target is 'cuda', this backend needs 'hip'",
       "fx-smokefail": "fixture: the verify kernel faulted on its smoke launch"}


def test_fallbacks_show_in_dflash2rt_backends(gpu_style_plugins):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(PYTHONPATH=os.pathsep.join([str(gpu_style_plugins), env.get("PYTHONPATH", "")]),
               OMP_NUM_THREADS="1")
    cli = [sys.executable, "-m", "dflash2rt", "backends"]
    rows = {r["name"]: r for r in json.loads(subprocess.run(
        cli + ["--json"], capture_output=True, text=True, env=env, check=True).stdout)}
    text = subprocess.run(cli, capture_output=True, text=True, env=env, check=True).stdout
    for name, why in WHY.items():
        if name == "fx-smokefail" and "triton kernels unavailable (ModuleNotFoundError" in \
                rows[name]["fallbacks"][0]:
            pytest.skip("triton is not installed: the smoke launch is never reached")
        assert rows[name]["implementation"].startswith("torch ops: ")
        assert any(why in f for f in rows[name]["fallbacks"]), rows[name]
        assert f"fallback: triton kernels unavailable (RuntimeError: {why}" in text
    assert rows["cpu"]["fallbacks"] == [] and rows["cpu"]["fp64"] is True


def test_fallbacks_show_in_a_run_of_the_bundled_pair(gpu_style_plugins):
    import dflash2rt

    reg = Registry.discover()
    for name, why in WHY.items():
        backend = reg.select(name).backend
        if name == "fx-smokefail" and "ModuleNotFoundError" in backend.kernel_fallbacks[0]:
            continue                              # no triton: the smoke launch is never reached
        res = dflash2rt.run(backend=backend, prompts=["def f(x):"], max_new_tokens=3)
        assert len(res.tokens[0]) == 3
        assert any(why in f for f in res.stats.fallbacks), res.stats.fallbacks

