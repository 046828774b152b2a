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


class _Guard:
    """``torch.<device>.device(d)`` of a fake GPU: records the device index made current."""
    active: list[int] = []

    def __init__(self, d) -> None:
        self.index = d if isinstance(d, int) else torch.device(d).index

    def __enter__(self) -> None:
        _Guard.active.append(self.index)

    def __exit__(self, *exc) -> None:
        _Guard.active.pop()


@pytest.fixture
def fake_cpu_device(monkeypatch):
    props = SimpleNamespace(name="Fake 9000", total_memory=8 * 2**30, warp_size=32,
                            has_fp64=False)
    monkeypatch.setattr(torch.cpu, "get_device_properties", lambda i: props, raising=False)
    monkeypatch.setattr(torch.cpu, "is_bf16_supported", lambda: False, raising=False)
    monkeypatch.setattr(torch.cpu, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cpu, "device", _Guard, raising=False)
    monkeypatch.setattr(_Guard, "active", [])
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
                             self_test=lambda adapter, be: "replay differed (fixture)")
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
                                                   self_test=lambda adapter, be: None))
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

@pytest.fixture
def two_fake_devices(fake_cpu_device, monkeypatch):
    """The fake vendor's torch.cpu with two devices, current device 0, and a device guard."""
    read = []

    def props(i):
        read.append(i)
        return fake_cpu_device
    monkeypatch.setattr(torch.cpu, "get_device_properties", props, raising=False)
    monkeypatch.setattr(torch.cpu, "device_count", lambda: 2)
    return read


def test_the_chosen_device_is_probed_and_current_around_every_launch(two_fake_devices,
                                                                     monkeypatch):
    """"name:1" probes device 1 (not 0); its kernels launch, and its runs decode, with device 1
    current (Triton launches on the current device)."""
    pytest.importorskip("triton")
    from dflash2rt.engine.engine import Engine
    from dflash2rt.engine.request import Request, SamplingParams
    from dflash2rt.kernels import conv, verify

    from tiny_models import tiny_pair

    v = fake_vendor()
    p = plugin_kit.probe(v, 1)
    assert p.details["torch_device"] == "cpu:1" and p.device.startswith("cpu:1 ")
    assert two_fake_devices == [1]
    gone = plugin_kit.probe(v, 2)
    assert not gone.available and "there is no cpu:2, 2 device(s) visible" in gone.reason
    assert plugin_kit.probe(v).details["torch_device"] == "cpu:0"          # the current one
    launches = []
    for module, name in ((verify, "_verify_kernel"), (conv, "_conv_kernel")):
        real = getattr(module, name)

        class Spy:
            def __getitem__(self, grid, real=real, name=name):
                def launch(*a, **k):
                    launches.append((name, list(_Guard.active)))
                    return real[grid](*a, **k)
                return launch
        monkeypatch.setattr(module, name, Spy())
    be = plugin_kit.create(v, p, target_lookup=lambda: "hip")   # the real smoke, device 1
    assert type(be).__name__ == "KernelBackend" and str(be.device) == "cpu:1", be.kernel_fallbacks
    assert launches and all(active and active[-1] == 1 for _, active in launches)
    launches.clear()
    reqs = [Request((1, 2, 3), SamplingParams(max_new_tokens=5, temperature=t, seed=1))
            for t in (0.0, 1.0)]
    Engine(tiny_pair("dflash2", block=4, dtype=torch.float32), be).generate(reqs, block_size=4)
    assert {n for n, _ in launches} == {"_verify_kernel", "_conv_kernel"}
    assert all(active and active[-1] == 1 for _, active in launches)


def test_a_device_without_fp64_runs_every_kernel_with_the_real_smoke(fake_cpu_device):
    """Without float64 the real smoke launch passes (the watermarked cases must refuse, and do)
    and every op but the watermark runs its kernel: no kernel fallback."""
    pytest.importorskip("triton")
    v = fake_vendor(fp64=lambda p: p.has_fp64)
    be = plugin_kit.create(v, plugin_kit.probe(v), target_lookup=lambda: "hip")  # real smoke
    assert type(be).__name__ == "KernelBackend" and be.has_fp64 is False
    assert not be.kernel_fallbacks, be.kernel_fallbacks
    assert not any("float64" in f for f in be.standing_fallbacks), be.standing_fallbacks
    impl = be.implementation
    assert impl["watermark"] == "unsupported"
    assert all(impl[op] != "torch ops" for op in ("select", "verify", "conv_prepare",
                                                   "attention"))
    ran = smoke_launch(be)
    assert "select-sampled" in ran and "verify-sampled" in ran
    assert not any("watermarked" in c for c in ran)


def test_fp64_env_turns_float64_off_in_the_probe(fake_cpu_device, monkeypatch):
    v = fake_vendor()
    assert plugin_kit.probe(v).fp64 is True
    monkeypatch.setenv("DFLASH2RT_FP64", "0")
    p = plugin_kit.probe(v)
    assert p.fp64 is False and "float64 off (DFLASH2RT_FP64=0)" in p.kernels
