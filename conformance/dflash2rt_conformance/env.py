"""What the report says about the machine: device, driver/runtime, library and plugin versions."""

from __future__ import annotations

import importlib.metadata as md
import subprocess
from pathlib import Path


def _version(dist: str) -> str:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return "not installed"


def git_commit() -> str:
    """The commit of the dflash2rt source tree, if it is a git checkout."""
    import dflash2rt

    root = Path(dflash2rt.__file__).resolve().parent.parent
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 else "unknown"


def runtime(device_type: str) -> str:
    import torch

    if device_type == "cuda" and torch.version.cuda:
        return f"CUDA runtime {torch.version.cuda}"
    if device_type == "cuda" and getattr(torch.version, "hip", None):
        return f"HIP runtime {torch.version.hip}"
    if device_type == "xpu" and getattr(torch.version, "xpu", None):
        return f"XPU runtime {torch.version.xpu}"
    return "none (host CPU)" if device_type == "cpu" else "unknown"


def driver(device_type: str) -> str:
    if device_type == "cpu":
        return "none (host CPU)"
    p = Path("/sys/module/nvidia/version") if device_type == "cuda" else \
        Path("/sys/module/amdgpu/version")
    try:
        return p.read_text().strip()
    except OSError:
        return "unknown"


def properties(selection, status) -> dict[str, str]:
    """System properties for the JUnit ``<properties>`` and the JSON report."""
    import numpy
    import torch

    backend = selection.backend
    dev = backend.device.type
    return {
        "dflash2rt.backend": selection.name,
        "dflash2rt.selected_how": selection.how,
        "device": status.device if status else str(backend.device),
        "device.torch": str(backend.device),
        "driver": driver(dev),
        "runtime": runtime(dev),
        "torch": torch.__version__,
        "triton": _version("triton"),
        "numpy": numpy.__version__,
        "dflash2rt": _version("dflash2rt"),
        "dflash2rt-conformance": _version("dflash2rt-conformance"),
        "plugin.distribution": status.distribution if status else "?",
        "plugin.version": status.version if status else "?",
        "git.commit": git_commit(),
        "backend.dtypes": ",".join(str(d).replace("torch.", "") for d in backend.dtypes),
        "backend.graphs": "yes" if getattr(backend, "graphs", None) is not None else "no",
    }
