"""What the machine shows of a vendor's hardware, independent of the torch build."""

from __future__ import annotations

import glob
import os
from pathlib import Path

import torch

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
