"""Helpers the vendor plugins share: hardware probes that do not trust the torch build string."""

from __future__ import annotations

import glob
import os
from pathlib import Path

import torch

from .backend import Backend, Probe, TorchOpsBackend

PCI_ROOT = Path("/sys/bus/pci/devices")
# PCI base classes of GPUs and compute accelerators: display controller, processing accelerator.
_GPU_CLASSES = (0x03, 0x12)


def pci_devices(vendor_id: int) -> list[str]:
    """PCI addresses of display/accelerator devices from ``vendor_id`` (read from sysfs)."""
    found = []
    for dev in sorted(PCI_ROOT.glob("*")) if PCI_ROOT.is_dir() else []:
        try:
            vendor = int((dev / "vendor").read_text(), 16)
            cls = int((dev / "class").read_text(), 16) >> 16
        except (OSError, ValueError):
            continue
        if vendor == vendor_id and cls in _GPU_CLASSES:
            found.append(dev.name)
    return found


def device_nodes(*patterns: str) -> list[str]:
    """Existing device nodes matching the glob patterns."""
    return sorted({p for pat in patterns for p in glob.glob(pat)})


def hardware_summary(vendor: str, vendor_id: int, *node_patterns: str) -> str:
    """One line: what the machine itself shows of a vendor's hardware, independent of torch."""
    pci = pci_devices(vendor_id)
    nodes = device_nodes(*node_patterns)
    pci_txt = f"{len(pci)} {vendor} PCI device(s)" + (f" ({', '.join(pci[:4])})" if pci else "")
    node_txt = ", ".join(nodes[:4]) if nodes else "no " + " / ".join(node_patterns) + " node"
    return f"hardware: {pci_txt}; {node_txt}"


def visible_devices_note(*variables: str) -> str:
    """"; VAR='value'" for each of the vendor's device-visibility variables that is set."""
    return "".join(f"; {v}={os.environ[v]!r}" for v in variables if v in os.environ)


def torch_build() -> str:
    parts = [f"torch {torch.__version__}"]
    if torch.version.cuda:
        parts.append(f"CUDA {torch.version.cuda}")
    if getattr(torch.version, "hip", None):
        parts.append(f"HIP {torch.version.hip}")
    if getattr(torch.version, "xpu", None):
        parts.append(f"XPU {torch.version.xpu}")
    return " ".join(parts) + ("" if len(parts) > 1 else " (CPU-only build)")


def try_allocate(device: str) -> str | None:
    """Allocate and read back one element on ``device``; None on success, else the error text."""
    try:
        x = torch.ones(1, device=device) + 1
        if float(x.cpu()) != 2.0:
            return f"a test allocation on {device} read back a wrong value"
    except Exception as exc:  # noqa: BLE001 - turned into a probe reason
        return f"a test allocation on {device} failed: {type(exc).__name__}: {exc}"
    return None


GRAPHS_ENV = "DFLASH2RT_GRAPHS"


def graphs_wanted() -> bool:
    """Graphs are on unless DFLASH2RT_GRAPHS=0 (the probe and the run stats say which)."""
    return os.environ.get(GRAPHS_ENV, "1") != "0"


def cuda_graph_mode(vendor: str) -> str:
    if not graphs_wanted():
        return f"off ({GRAPHS_ENV}=0): eager launches"
    return (f"{vendor} graphs via torch.cuda.CUDAGraph (side-stream capture), buckets 1-32: "
            "draft+conv+selector+walk and verify+accept+commit; target-only forward+sample+commit")


def kernel_mode() -> tuple[bool, str]:
    """(kernels usable, description): Triton kernels when triton imports, else torch eager ops."""
    import importlib.util

    from .kernels.tuning import KERNELS

    if importlib.util.find_spec("triton") is None:
        return False, "torch eager ops (triton not installed: pip install 'dflash2rt[triton]')"
    if interpreting():
        return False, (f"torch eager ops ({INTERPRET_REASON})")
    return True, KERNELS


INTERPRET_REASON = ("TRITON_INTERPRET=1 is set in this process, so Triton would run the kernels "
                    "in its host interpreter; unset it to use the device kernels")


def interpreting() -> bool:
    """True when Triton's interpreter replaces its compiler in this process."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def gpu_backend(name: str, probe: Probe, dtypes: tuple[torch.dtype, ...], tuning,
                graph_adapter=None) -> Backend:
    """The plugin's backend on the probed device: the Triton kernels with the vendor's tuning,
    or, when they cannot be built, the reference torch ops, reported as a kernel fallback
    (``Backend.kernel_fallbacks``: conformance fails a backend asked for by name that has one,
    unless ``--allow-fallback``); with ``graph_adapter`` the engine captures its steps into
    graphs."""
    device = probe.details["torch_device"]
    try:
        if interpreting():                  # never run a GPU backend's kernels interpreted
            raise RuntimeError(INTERPRET_REASON)
        from .kernels.backend import KernelBackend

        backend: Backend = KernelBackend(name, device, dtypes, tuning)
    except Exception as exc:  # noqa: BLE001 - becomes a reported fallback
        backend = TorchOpsBackend(name, device, dtypes)
        backend.report_kernel_fallback(f"triton kernels unavailable ({type(exc).__name__}: "
                                       f"{exc}); DFlash2 ops run as torch eager ops")
    if graph_adapter is not None and graphs_wanted():
        backend.graph_adapter = graph_adapter
    elif graph_adapter is not None:
        backend.report_fallback(f"graphs disabled by {GRAPHS_ENV}=0: eager launches")
    return backend
