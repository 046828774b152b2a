"""The generic probe and create of a GPU backend, driven by its vendor's ``GpuVendor``."""

from __future__ import annotations

import os
from typing import Callable

import torch

from ..backend import Backend, BackendSpec, Probe
from ..hookspecs import hookimpl
from ..graphs.adapter import GraphCaptureError, TorchGraphAdapter
from .build import GRAPHS_ENV, gpu_backend, graphs_wanted, kernel_mode
from .hardware import hardware_summary, torch_build, try_allocate, visible_devices_note
from .vendor import GpuVendor

STEPS = ("buckets 1-32: draft+conv+selector+walk and verify+accept+commit; target-only "
         "forward+sample+commit")


def graph_mode(v: GpuVendor, device: str) -> tuple[str, bool]:
    """(what the probe says of graphs, whether create captures them), per the vendor's policy;
    a self-test runs here, once per probe."""
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
        why = g.self_test(graphs) if g.self_test else None
    except Exception as exc:  # noqa: BLE001 - the reason is the result
        why = f"{type(exc).__name__}: {exc}"
    if why:
        return f"off: self-test failed: {why}", False
    gate = ", self-test passed" if g.self_test else ""
    return (f"{g.label} via torch.{v.torch_device}.{g.graph_class} (one capture stream, one "
            f"shared pool{gate}), {STEPS}"), True


def adapter(v: GpuVendor, device: str) -> TorchGraphAdapter:
    """The vendor's graph adapter: ``torch.<torch_device>`` with its policy's graph class."""
    return TorchGraphAdapter(getattr(torch, v.torch_device), device, v.graphs.graph_class,
                             f"{v.torch_device}-graph")


def probe(v: GpuVendor) -> Probe:
    """Available when torch is a ``v.build`` build, ``torch.<device>`` sees a device and a test
    allocation reads back; every refusal names the build, the visibility variables and what the
    hardware shows."""
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
    device = f"{v.torch_device}:0"
    error = try_allocate(device)
    if error:
        return Probe(False, f"{build}: {error}; {hw}")
    props = module.get_device_properties(0)
    bf16 = not v.bf16_if_supported or module.is_bf16_supported()
    graphs, capture = graph_mode(v, device)
    return Probe(
        available=True,
        device=f"{device} " + v.describe.format(p=props, gib=props.total_memory / 2**30),
        kernels=kernel_mode()[1] + note,
        dtypes=tuple(d for d in v.dtypes if d != "bfloat16" or bf16),
        graphs=graphs, fp64=v.fp64(props) if v.fp64 else True,
        details={"torch": torch.__version__, v.build: str(getattr(torch.version, v.build)),
                 "torch_device": device, "warp_size": str(getattr(props, "warp_size", "")),
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
