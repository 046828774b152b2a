"""What the report says about the machine (device, driver/runtime, library and plugin versions)
and about the implementation that ran (per op, fallbacks, graph mode)."""

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
        "backend.graphs": graph_mode(backend),
        "dflash2rt.implementation": backend.implementation_summary(),
    }


def graph_mode(backend) -> str:
    """The graph adapter the engine captures with (its name), or "none" (eager launches)."""
    adapter = getattr(backend, "graph_adapter", None)
    return "none" if adapter is None else str(getattr(adapter, "name", type(adapter).__name__))


def implementation(backend, how: str, allow_fallback: bool) -> tuple[dict, str | None]:
    """(the report's "implementation" block, the reason the run fails or None). A backend asked
    for by name (``how`` is not "auto") whose plugin kernels fell back fails unless
    ``allow_fallback``; the block says which either way."""
    kernel_fb = list(getattr(backend, "kernel_fallbacks", []))
    by_impl: dict[str, list[str]] = {}
    for op, impl in backend.implementation.items():
        by_impl.setdefault(impl, []).append(op)
    kernels, reason = "; ".join(f"{i}: {', '.join(ops)}" for i, ops in by_impl.items()), None
    if kernel_fb and allow_fallback:
        kernels += " (fallback allowed by --allow-fallback)"
    elif kernel_fb and how != "auto":
        kernels += " (fallback REFUSED: the backend was asked for by name)"
        reason = (f"implementation: backend {backend.name!r} was asked for by name but its "
                  f"kernels fell back: {'; '.join(kernel_fb)}. Pass --allow-fallback "
                  "(pytest: --dflash2rt-allow-fallback) to certify what ran instead")
    elif kernel_fb:
        kernels += " (fallback accepted: the backend was chosen automatically)"
    return {"backend": backend.name, "ops": dict(backend.implementation), "kernels": kernels,
            "graphs": graph_mode(backend), "fallbacks": list(backend.standing_fallbacks),
            "standing_fallbacks": list(backend.standing_fallbacks),
            "kernel_fallbacks": kernel_fb, "allow_fallback": allow_fallback}, reason
