"""Building a GPU backend: triton kernels when the vendor's Triton is active and every kernel
launches, else torch ops, reported as a kernel fallback."""

from __future__ import annotations

import importlib.util
import os
from typing import Callable

import torch

from ..backend import Backend, Probe, TorchOpsBackend
from ..kernels.tuning import INTERPRET_REASON, KERNELS, TritonFacts, Tuning, interpreting

GRAPHS_ENV = "DFLASH2RT_GRAPHS"


def graphs_wanted() -> bool:
    """Graphs are on unless DFLASH2RT_GRAPHS=0 (the probe and the run stats say which)."""
    return os.environ.get(GRAPHS_ENV, "1") != "0"


def kernel_mode(triton: TritonFacts | None = None) -> tuple[bool, str]:
    """(triton kernels usable, description): triton kernels when triton imports, else torch
    ops. Without triton the description says what to install: the Triton the installed torch
    requires, else the vendor's own distribution (``triton.distribution``), never PyPI triton
    over a vendor build (``triton_hints.install_hint``)."""
    if importlib.util.find_spec("triton") is None:
        # Imported on use: only a machine without triton needs the hint (it reads package
        # metadata).
        from .triton_hints import install_hint

        hint = install_hint(triton.distribution if triton is not None else None)
        return False, f"torch eager ops (triton not installed: {hint})"
    if interpreting():
        return False, f"torch eager ops ({INTERPRET_REASON})"
    return True, KERNELS


def _kernel_backend(name: str, probe: Probe, dtypes: tuple[torch.dtype, ...], tuning: Tuning,
                    triton: TritonFacts | None, target_lookup: Callable[[], str] | None,
                    smoke: Callable[[Backend], None] | None) -> Backend:
    """The KernelBackend, or an exception saying why the triton kernels cannot run."""
    if interpreting():                  # never run a GPU backend's kernels interpreted
        raise RuntimeError(INTERPRET_REASON)
    if importlib.util.find_spec("triton") is None:
        from .triton_hints import install_hint

        raise ModuleNotFoundError("triton is not installed: " + install_hint(
            triton.distribution if triton is not None else None))
    from ..kernels import smoke as kernel_smoke

    if triton is not None:
        active = (target_lookup or kernel_smoke.active_target)()
        if active != triton.backend:
            raise RuntimeError(f"Triton's active target is {active!r}, this backend needs "
                               f"{triton.backend!r} (the Triton of {triton.distribution})")
    from ..kernels.backend import KernelBackend

    backend = KernelBackend(name, probe.details["torch_device"], dtypes, tuning,
                            has_fp64=probe.fp64)
    (smoke or kernel_smoke.smoke_launch)(backend)
    return backend


def gpu_backend(name: str, probe: Probe, dtypes: tuple[torch.dtype, ...], tuning: Tuning,
                graph_adapter=None, *, triton: TritonFacts | None = None,
                target_lookup: Callable[[], str] | None = None,
                smoke: Callable[[Backend], None] | None = None) -> Backend:
    """The plugin's backend on the probed device: the triton kernels with the vendor's tuning,
    once Triton's active target is ``triton.backend`` and a smoke launch of every op
    (``kernels.smoke``) succeeded; else torch ops, reported as a kernel fallback (standing:
    every run's stats show it; conformance fails a backend asked for by name that has one,
    unless ``--allow-fallback``). ``target_lookup`` and ``smoke`` replace the real Triton target
    lookup and smoke launch (tests). With ``graph_adapter`` the engine captures its steps into
    graphs."""
    try:
        backend = _kernel_backend(name, probe, dtypes, tuning, triton, target_lookup, smoke)
    except Exception as exc:  # noqa: BLE001 - becomes a reported fallback
        backend = TorchOpsBackend(name, probe.details["torch_device"], dtypes,
                                  has_fp64=probe.fp64)
        backend.report_kernel_fallback(f"triton kernels unavailable ({type(exc).__name__}: "
                                       f"{exc}); DFlash2 ops run as torch ops")
    if graph_adapter is not None and graphs_wanted():
        backend.graph_adapter = graph_adapter
    elif graph_adapter is not None:
        backend.report_fallback(f"graphs disabled by {GRAPHS_ENV}=0: eager launches")
    return backend
