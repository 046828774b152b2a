"""The generic probe and create of a GPU backend, driven by its vendor's ``GpuVendor``."""

from __future__ import annotations

import os
from typing import Callable

import torch

from ..backend import Backend, BackendSpec, Probe, TorchOpsBackend
from ..hookspecs import hookimpl
from ..graphs.adapter import GraphCaptureError, TorchGraphAdapter
from .build import GRAPHS_ENV, gpu_backend, graphs_wanted, kernel_mode
from .hardware import hardware_summary, torch_build, try_allocate, visible_devices_note
from .selftest import graph_self_test
from ..vendor import GpuVendor

STEPS = ("buckets 1-32: draft+conv+selector+walk and verify+accept+commit; target-only "
         "forward+sample+commit")


def graph_mode(v: GpuVendor, device: str, fp64: bool = True, warp: int = 0
               ) -> tuple[str, bool]:
    """(what the probe says of graphs, whether create captures them), per the vendor's policy;
    the graph self-test runs here, once per probe, with the ops the backend will run (its
    kernels for this warp size and float64 support, or torch ops where kernels cannot run)."""
    g = v.graphs
    if not graphs_wanted():
        return f"off ({GRAPHS_ENV}=0): eager launches", False
    if g.opt_in_env and os.environ.get(g.opt_in_env) != "1":
        return (f"off by default: set {g.opt_in_env}=1 to opt in (gated by replay == eager)",
                False)
    try:
        graphs = adapter(v, device)          # touches no device: checks the graph API exists
    except GraphCaptureError as exc:
        return f"off: {exc}", False
    try:
        why = (g.self_test or graph_self_test)(graphs, _self_test_backend(v, device, fp64, warp))
    except Exception as exc:  # noqa: BLE001 - the reason is the result
        why = f"{type(exc).__name__}: {exc}"
    if why:
        return f"off: self-test failed: {why}", False
    return (f"{g.label} via torch.{v.torch_device}.{g.graph_class} (one capture stream, one "
            f"pool per engine, self-test passed), {STEPS}"), True


def _self_test_backend(v: GpuVendor, device: str, fp64: bool, warp: int) -> Backend:
    if kernel_mode()[0]:
        from ..kernels.backend import KernelBackend

        return KernelBackend(f"{v.name}-self-test", device, (torch.float32,),
                             v.triton.tuning_for(warp), has_fp64=fp64)
    return TorchOpsBackend(f"{v.name}-self-test", device, (torch.float32,), has_fp64=fp64)


def adapter(v: GpuVendor, device: str) -> TorchGraphAdapter:
    """The vendor's graph adapter: ``torch.<torch_device>`` with its policy's graph class."""
    return TorchGraphAdapter(getattr(torch, v.torch_device), device, v.graphs.graph_class,
                             f"{v.torch_device}-graph")


FP64_ENV = "DFLASH2RT_FP64"


def probe(v: GpuVendor, index: int | None = None) -> Probe:
    """Available when torch is a ``v.build`` build, ``torch.<device>`` sees device ``index``
    (None: the current device) and a test allocation reads back; every refusal names the build,
    the visibility variables and what the hardware shows. The device's float64 support comes
    from the vendor, and ``DFLASH2RT_FP64=0`` turns it off (a device without float64, as its
    path runs on Intel Arc, checked on any GPU)."""
    hw = hardware_summary(v.vendor, v.pci_vendor, *v.device_nodes)
    build = torch_build()
    label, text = v.note() if v.note else ("", "")
    note = f"; {label} {text}" if label else ""
    for attr, other in v.other_builds:
        if getattr(torch.version, attr, None):
            return Probe(False, f"{build} is a {attr.upper()} build: use the {other!r} backend; "
                         f"{hw}")
    module = getattr(torch, v.torch_device, None)
    if module is None or not getattr(torch.version, v.build, None):
        return Probe(False, f"{build} has no {v.build_label} support: install a torch build "
                     f"with {v.build_label} support{note}; {hw}")
    if not module.is_available():
        return Probe(False, f"{build}, but torch.{v.torch_device}.is_available() is False "
                     f"({v.driver_hint}){visible_devices_note(*v.visible_env)}{note}; {hw}")
    count = int(module.device_count())
    index = int(module.current_device()) if index is None else index
    if not 0 <= index < count:
        return Probe(False, f"{build}: there is no {v.torch_device}:{index}, {count} device(s) "
                     f"visible{visible_devices_note(*v.visible_env)}; {hw}")
    device = f"{v.torch_device}:{index}"
    error = try_allocate(device)
    if error:
        return Probe(False, f"{build}: {error}; {hw}")
    props = module.get_device_properties(index)
    with module.device(index):             # per-device queries read the current device
        bf16 = not v.bf16_if_supported or module.is_bf16_supported()
    fp64 = v.fp64(props) if v.fp64 else True
    if fp64 and os.environ.get(FP64_ENV, "1") == "0":
        fp64, note = False, note + f"; float64 off ({FP64_ENV}=0)"
    warp = int(getattr(props, "warp_size", 0) or 0)
    with module.device(index):
        graphs, capture = graph_mode(v, device, fp64, warp)
    return Probe(
        available=True,
        device=f"{device} " + v.describe.format(p=props, gib=props.total_memory / 2**30),
        kernels=kernel_mode(v.triton)[1] + note,
        dtypes=tuple(d for d in v.dtypes if d != "bfloat16" or bf16),
        graphs=graphs, fp64=fp64,
        details={"torch": torch.__version__, v.build: str(getattr(torch.version, v.build)),
                 "torch_device": device, "warp_size": str(warp) if warp else "",
                 "device_count": str(count),
                 "graph_capture": "on" if capture else "off",
                 **({label.lower(): text} if label else {})},
    )


def create(v: GpuVendor, p: Probe, *, target_lookup: Callable[[], str] | None = None,
           smoke: Callable[[Backend], None] | None = None) -> Backend:
    """The backend on the probed device (``gpu_backend``) with the tuning for its warp size,
    the graph adapter when the probe turned capture on (else that is reported), then the
    vendor's ``finish``."""
    device = p.details["torch_device"]
    graphs = adapter(v, device) if p.details.get("graph_capture") == "on" else None
    tuning = v.triton.tuning_for(int(p.details.get("warp_size") or 0))
    backend = gpu_backend(v.name, p, tuple(getattr(torch, d) for d in p.dtypes), tuning, graphs,
                          triton=v.triton, target_lookup=target_lookup, smoke=smoke)
    if graphs is None:
        backend.report_fallback(f"{v.graphs.label} not used: {p.graphs}")
    if v.finish is not None:
        v.finish(backend)
    return backend


def backend_spec(v: GpuVendor) -> BackendSpec:
    """The ``BackendSpec`` a plugin returns from ``dflash2rt_backends`` for ``v``."""
    return BackendSpec(name=v.name, priority=v.priority, probe=lambda: probe(v),
                       probe_device=lambda index: probe(v, index),
                       create=lambda p: create(v, p), summary=v.summary)


def vendor_hooks(v: GpuVendor):
    """The two hook implementations of a plugin that declares ``v``: bind them in the plugin
    module as ``dflash2rt_backends, dflash2rt_gpu_vendors = vendor_hooks(VENDOR)`` (pluggy
    registers a module's hookimpl-marked attributes under their attribute names)."""
    @hookimpl
    def dflash2rt_backends() -> list[BackendSpec]:
        return [backend_spec(v)]

    @hookimpl
    def dflash2rt_gpu_vendors() -> list[GpuVendor]:
        return [v]

    return dflash2rt_backends, dflash2rt_gpu_vendors
