"""plugin_kit's generic probe / create (a fake vendor on ``torch.cpu``, as in
test_vendor_plugins.py) and its GPU backend build, checked against hand-written expectations:
the exact refusal each probe step returns, the dtypes kept, which backend the graph self-test is
given (torch ops or the kernels, with the tuning for the probed warp size and the probed
float64), the tuning create picks when the warp size is unknown; ``kernel_mode`` and
``gpu_backend``'s exact fallback reports (no triton, interpreter, wrong target), when the Triton
target is looked up and the smoke launch runs, and when the graph adapter is attached."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from dflash2rt import plugin_kit
from dflash2rt.backend import Probe, TorchOpsBackend
from dflash2rt.plugin_kit import generic, triton_hints

from test_vendor_plugins import fake_cpu_device, fake_vendor  # noqa: F401  (the fixture)

HW = "hardware: 0 Fake PCI device(s); no /dev/fakegpu* node"
WIDE, NARROW, UNKNOWN = (plugin_kit.Tuning(256, 2048, 4), plugin_kit.Tuning(256, 2048, 8),
                         plugin_kit.Tuning(64, 512, 2))
# Warp 64 first (the default of an unknown key), and an explicit tuning for "unknown" (key 0).
FACTS = plugin_kit.TritonFacts(backend="hip", distribution="pytorch-triton-rocm",
                               tuning={64: WIDE, 32: NARROW, 0: UNKNOWN})


@pytest.fixture
def cpu_build(monkeypatch):
    """torch.version without CUDA / HIP / XPU: the build line is "torch <version> (CPU-only
    build)" whatever torch is installed."""
    for attr in ("cuda", "hip", "xpu"):
        monkeypatch.setattr(torch.version, attr, None, raising=False)
    return f"torch {torch.__version__} (CPU-only build)"


@pytest.fixture
def graphs_api(monkeypatch):
    """torch.cpu with a graph class and ``graph``, so the vendor's graph adapter can be made."""
    monkeypatch.setattr(torch.cpu, "FakeGraph", object, raising=False)
    monkeypatch.setattr(torch.cpu, "graph", lambda *a, **k: None, raising=False)
    monkeypatch.delenv(plugin_kit.GRAPHS_ENV, raising=False)


def recording_vendor(seen: list, **kw) -> plugin_kit.GpuVendor:
    """A vendor whose graph self-test records the backend it is given and passes."""
    policy = plugin_kit.GraphPolicy("FakeGraph", "fake graphs",
                                    self_test=lambda adapter, be: seen.append(be))
    return fake_vendor(graphs=policy, **kw)


# -- probe refusals -----------------------------------------------------------------------------

@pytest.mark.usefixtures("fake_cpu_device")
def test_another_vendors_build_is_refused_by_name(cpu_build):
    v = fake_vendor(other_builds=(("no_such_build", "nope"), ("git_version", "cpu")))
    assert plugin_kit.probe(v) == Probe(
        False, f"{cpu_build} is a GIT_VERSION build: use the 'cpu' backend; {HW}")


@pytest.mark.usefixtures("fake_cpu_device")
def test_other_builds_this_torch_is_not_are_no_refusal():
    p = plugin_kit.probe(fake_vendor(other_builds=(("no_such_build", "nope"),)))
    assert p.available and p.reason == ""


@pytest.mark.usefixtures("fake_cpu_device")
def test_an_unavailable_device_module_is_refused_with_the_driver_hint(cpu_build, monkeypatch):
    monkeypatch.setattr(torch.cpu, "is_available", lambda: False)
    monkeypatch.setenv("FAKE_VISIBLE", "3")
    v = fake_vendor(note=lambda: ("EXTRA", "a vendor note"))
    assert plugin_kit.probe(v) == Probe(
        False, f"{cpu_build}, but torch.cpu.is_available() is False (no fake GPU); "
               f"FAKE_VISIBLE='3'; EXTRA a vendor note; {HW}")


@pytest.mark.usefixtures("fake_cpu_device")
def test_a_failed_test_allocation_is_refused(cpu_build, monkeypatch):
    tried = []
    monkeypatch.setattr(generic, "try_allocate",
                        lambda device: tried.append(device) or "it failed (fixture)")
    assert plugin_kit.probe(fake_vendor()) == Probe(False,
                                                    f"{cpu_build}: it failed (fixture); {HW}")
    assert tried == ["cpu:0"]


# -- dtypes and float64 -------------------------------------------------------------------------

@pytest.mark.usefixtures("fake_cpu_device")
def test_bfloat16_is_kept_unless_the_vendor_asks_the_device(monkeypatch):
    assert plugin_kit.probe(fake_vendor()).dtypes == ("float32", "float16", "bfloat16")
    monkeypatch.setattr(torch.cpu, "is_bf16_supported", lambda: True, raising=False)
    assert plugin_kit.probe(fake_vendor(bf16_if_supported=True)).dtypes == (
        "float32", "float16", "bfloat16")


@pytest.mark.usefixtures("fake_cpu_device")
def test_fp64_env_adds_no_note_when_the_device_has_no_float64(monkeypatch):
    monkeypatch.setenv("DFLASH2RT_FP64", "0")
    p = plugin_kit.probe(fake_vendor(fp64=lambda props: props.has_fp64))
    assert p.fp64 is False and "float64" not in p.kernels


# -- the backend the graph self-test runs -------------------------------------------------------

def test_the_self_test_runs_torch_ops_while_triton_interprets(graphs_api, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    seen = []
    text, on = plugin_kit.graph_mode(recording_vendor(seen), "cpu")
    assert on and "self-test passed" in text
    [be] = seen
    assert type(be) is TorchOpsBackend and be.name == "fakegpu-self-test"
    assert be.has_fp64 is True                          # the default: float64 supported


def test_the_self_test_runs_the_kernels_with_the_probed_tuning(graphs_api, monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    seen = []
    v = recording_vendor(seen, triton=FACTS)
    assert plugin_kit.graph_mode(v, "cpu")[1] and plugin_kit.graph_mode(v, "cpu", False, 32)[1]
    default, narrow = seen
    assert type(default).__name__ == "KernelBackend" and default.name == "fakegpu-self-test"
    assert default.has_fp64 is True and default.tuning == UNKNOWN      # no warp size: key 0
    assert narrow.has_fp64 is False and narrow.tuning == NARROW


@pytest.mark.usefixtures("fake_cpu_device")
def test_the_probe_gives_the_self_test_the_devices_warp_size(graphs_api):
    pytest.importorskip("triton")
    seen = []
    v = recording_vendor(seen, triton=FACTS, describe="{p.name}")
    props = torch.cpu.get_device_properties(0)          # fake_cpu_device's: warp_size=32
    p = plugin_kit.probe(v)
    assert p.details["graph_capture"] == "on" and seen[-1].tuning == NARROW
    props.warp_size = 0                                 # reported as unknown
    plugin_kit.probe(v)
    assert seen[-1].tuning == UNKNOWN
    del props.warp_size                                 # not reported at all
    plugin_kit.probe(v)
    assert seen[-1].tuning == UNKNOWN


@pytest.mark.usefixtures("fake_cpu_device")
@pytest.mark.parametrize("value, detail, tuning", [(32, "32", NARROW), (0, "", UNKNOWN),
                                                   (None, "", UNKNOWN)])
def test_the_probes_warp_size_is_one_create_reads(graphs_api, monkeypatch, value, detail,
                                                   tuning):
    """A device reporting warp_size None probes as one with no warp size (not "None", which
    create could not read)."""
    pytest.importorskip("triton")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    v = fake_vendor(triton=FACTS, describe="{p.name}")
    torch.cpu.get_device_properties(0).warp_size = value
    p = plugin_kit.probe(v)
    assert p.details["warp_size"] == detail
    be = plugin_kit.create(v, p, target_lookup=lambda: "hip", smoke=lambda b: None)
    assert be.tuning == tuning


def test_create_without_a_warp_size_uses_the_tuning_for_unknown(monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    p = Probe(True, device="cpu", dtypes=("float32",), graphs="off: fixture",
              details={"torch_device": "cpu"})
    be = plugin_kit.create(fake_vendor(triton=FACTS), p, target_lookup=lambda: "hip",
                           smoke=lambda b: None)
    assert type(be).__name__ == "KernelBackend" and be.tuning == UNKNOWN
    assert list(be.standing_fallbacks) == ["fake graphs not used: off: fixture"]


# -- build: kernel_mode, gpu_backend ------------------------------------------------------------

CPU_PROBE = Probe(True, device="cpu", dtypes=("float32",), fp64=False,
                  details={"torch_device": "cpu"})
FALLBACK = "triton kernels unavailable ({}); DFlash2 ops run as torch ops"


@pytest.fixture
def no_triton(monkeypatch):
    """No triton to import; install_hint records the distribution it is asked about."""
    real, asked = importlib.util.find_spec, []
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "triton" else real(name, *a))
    monkeypatch.setattr(triton_hints, "install_hint",
                        lambda dist: asked.append(dist) or f"HINT({dist})")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    return asked


def test_graphs_are_wanted_unless_the_env_says_0(monkeypatch):
    for value, wanted in ((None, True), ("0", False), ("1", True), ("", True), ("no", True)):
        if value is None:
            monkeypatch.delenv(plugin_kit.GRAPHS_ENV, raising=False)
        else:
            monkeypatch.setenv(plugin_kit.GRAPHS_ENV, value)
        assert plugin_kit.graphs_wanted() is wanted, value


def test_kernel_mode_without_triton_gives_the_vendors_hint(no_triton):
    assert plugin_kit.kernel_mode(FACTS) == (
        False, "torch eager ops (triton not installed: HINT(pytorch-triton-rocm))")
    assert plugin_kit.kernel_mode() == (False, "torch eager ops (triton not installed: HINT(None))")
    assert no_triton == ["pytorch-triton-rocm", None]


def test_kernel_mode_with_triton(monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert plugin_kit.kernel_mode(FACTS) == (
        False, "torch eager ops (TRITON_INTERPRET=1 is set in this process, so Triton would run "
               "the kernels in its host interpreter; unset it to use the device kernels)")
    monkeypatch.delenv("TRITON_INTERPRET")
    usable, what = plugin_kit.kernel_mode(FACTS)
    assert usable and what.startswith("triton kernels: conv (fused taps + block mask), ")


def test_gpu_backend_without_triton_says_what_to_install(no_triton):
    looked = []
    be = plugin_kit.gpu_backend("g", CPU_PROBE, (torch.float32,), NARROW, triton=FACTS,
                                target_lookup=lambda: looked.append(1) or "hip")
    assert type(be) is TorchOpsBackend and be.has_fp64 is False and looked == []
    assert be.kernel_fallbacks == [FALLBACK.format(
        "ModuleNotFoundError: triton is not installed: HINT(pytorch-triton-rocm)")]
    be = plugin_kit.gpu_backend("g", CPU_PROBE, (torch.float32,), NARROW)
    assert be.kernel_fallbacks == [FALLBACK.format(
        "ModuleNotFoundError: triton is not installed: HINT(None)")]


def test_gpu_backend_checks_the_target_only_for_a_vendor_triton(monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    looked, smoked = [], []
    be = plugin_kit.gpu_backend("g", CPU_PROBE, (torch.float32,), NARROW,
                                target_lookup=lambda: looked.append(1) or "cuda",
                                smoke=smoked.append)
    assert type(be).__name__ == "KernelBackend" and looked == [] and smoked == [be]
    assert be.tuning == NARROW and be.has_fp64 is False and be.standing_fallbacks == ()
    be = plugin_kit.gpu_backend("g", CPU_PROBE, (torch.float32,), NARROW, triton=FACTS,
                                target_lookup=lambda: looked.append(1) or "hip",
                                smoke=smoked.append)
    assert type(be).__name__ == "KernelBackend" and looked == [1] and smoked[-1] is be
    be = plugin_kit.gpu_backend("g", CPU_PROBE, (torch.float32,), NARROW, triton=FACTS,
                                target_lookup=lambda: "cuda", smoke=smoked.append)
    assert type(be) is TorchOpsBackend and len(smoked) == 2
    assert be.kernel_fallbacks == [FALLBACK.format(
        "RuntimeError: Triton's active target is 'cuda', this backend needs 'hip' (the Triton "
        "of pytorch-triton-rocm)")]


def test_gpu_backend_attaches_the_graph_adapter_unless_graphs_are_off(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.delenv(plugin_kit.GRAPHS_ENV, raising=False)
    adapter = object()
    be = plugin_kit.gpu_backend("g", CPU_PROBE, (torch.float32,), NARROW, adapter)
    assert be.graph_adapter is adapter
    assert be.standing_fallbacks == (FALLBACK.format(
        "RuntimeError: TRITON_INTERPRET=1 is set in this process, so Triton would run the "
        "kernels in its host interpreter; unset it to use the device kernels"),)
    be = plugin_kit.gpu_backend("g", CPU_PROBE, (torch.float32,), NARROW)
    assert be.graph_adapter is None and len(be.standing_fallbacks) == 1
    monkeypatch.setenv(plugin_kit.GRAPHS_ENV, "0")
    be = plugin_kit.gpu_backend("g", CPU_PROBE, (torch.float32,), NARROW, adapter)
    assert be.graph_adapter is None
    assert be.standing_fallbacks[1:] == ("graphs disabled by DFLASH2RT_GRAPHS=0: eager launches",)
    be = plugin_kit.gpu_backend("g", CPU_PROBE, (torch.float32,), NARROW)
    assert be.graph_adapter is None and len(be.standing_fallbacks) == 1
