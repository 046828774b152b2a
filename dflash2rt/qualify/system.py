"""The system description of a qualification report: device, runtimes, versions, commit."""

from __future__ import annotations

import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from ..registry import Registry, split_device


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def git_commit() -> str | None:
    """The commit of the dflash2rt checkout, when it runs from one."""
    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        return None
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "-uno"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() + ("+dirty" if dirty else "") if out.returncode == 0 else None


def describe(registry: Registry, backend_name: str) -> dict[str, Any]:
    base = split_device(backend_name)[0]          # "cuda:1": the backend cuda, device 1
    status = next(s for s in registry.statuses() if s.name == base)
    probe = registry.probe(backend_name)
    return {
        "backend": backend_name, "device": probe.device or status.device,
        "kernels": probe.kernels or status.kernels, "graphs": probe.graphs or status.graphs,
        "dtypes": list(probe.dtypes or status.dtypes),
        "plugin_distribution": status.distribution, "plugin_version": status.version,
        "runtime": {k: v for k, v in probe.details.items() if k != "torch_device"},
        "torch": torch.__version__, "cuda": torch.version.cuda,
        "hip": getattr(torch.version, "hip", None), "xpu": getattr(torch.version, "xpu", None),
        "triton": _version("triton") or _version("pytorch-triton-xpu"),
        "numpy": _version("numpy"), "dflash2rt": _version("dflash2rt"),
        "conformance": _version("dflash2rt-conformance"),
        "python": platform.python_version(), "platform": platform.platform(),
        "cpu": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(),
        "commit": git_commit(),
        "all_backends": [{"name": s.name, "available": s.available, "reason": s.reason}
                         for s in registry.statuses()],
    }
