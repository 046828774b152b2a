"""The opt-in ``triton-interpret`` backend: the GPU Triton kernels run on CPU tensors through
Triton's interpreter (``TRITON_INTERPRET=1``), so CI exercises the kernels' logic.

Known blind spots of the interpreter (docs/portability.md, "Triton"), not tested on this lane:
bf16 arithmetic and bf16 ``tl.dot`` give wrong values silently (so bf16 is refused here),
out-of-bounds accesses are not checked, ``device_assert`` never fires, and autotuning with
several configs needs a driver (the kernels use one config from a tuning table). Checked on real
devices only.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys

import torch

from ..backend import Backend, BackendSpec, Probe
from ..plugin_kit import interpreting
from .nofp64 import forbid_fp64

NAME = "triton-interpret"
NAME_NOFP64 = "triton-interpret-nofp64"


def probe() -> Probe:
    if importlib.util.find_spec("triton") is None:
        from ..plugin_kit.triton_hints import install_hint

        return Probe(False, f"triton is not installed: {install_hint()}")
    if "triton" in sys.modules and not interpreting():
        return Probe(False, "triton was already imported in this process without "
                     "TRITON_INTERPRET=1; start the process with TRITON_INTERPRET=1")
    from importlib.metadata import version

    return Probe(True, device="cpu (Triton interpreter)",
                 kernels="triton kernels under the interpreter: conv, selector walk, verify, "
                 "attention, noise, RMSNorm, attention prologue",
                 dtypes=("float32", "float16"),
                 graphs="none: the interpreter has no graphs (eager launches)",
                 details={"triton": version("triton"), "torch": torch.__version__})


def create(_: Probe) -> Backend:
    if "triton" not in sys.modules:
        os.environ["TRITON_INTERPRET"] = "1"   # must precede the first import of triton
    from ..kernels.backend import KernelBackend

    return KernelBackend(NAME, "cpu", (torch.float32, torch.float16))


def probe_nofp64() -> Probe:
    p = probe()
    if not p.available:
        return p
    return dataclasses.replace(p, device="cpu (Triton interpreter, float64 forbidden)", fp64=False,
                               kernels="triton kernels under the interpreter, float32 "
                               "formulation of the sampled select / verify (FP64=False)")


def create_nofp64(_: Probe) -> Backend:
    """The kernel backend as a device without float64 gets it (``has_fp64=False``: the select
    and verify kernels compiled with FP64=False), every op and the whole decode under
    ``Float64Forbidden`` (what the kernels compute inside the interpreter is NumPy, which the
    guard does not see: the compile check proves their code holds no float64)."""
    if "triton" not in sys.modules:
        os.environ["TRITON_INTERPRET"] = "1"
    from ..kernels.backend import KernelBackend

    return forbid_fp64(KernelBackend)(NAME_NOFP64, "cpu", (torch.float32, torch.float16),
                                      has_fp64=False)


SPEC = BackendSpec(name=NAME, priority=1, probe=probe, create=create, opt_in=True,
                   summary="Triton kernels on CPU through the interpreter (CI lane)")
SPEC_NOFP64 = BackendSpec(name=NAME_NOFP64, priority=1, probe=probe_nofp64,
                          create=create_nofp64, opt_in=True,
                          summary="the Triton kernels through the interpreter as a device "
                                  "without float64 runs them, float64 forbidden (CI lane)")
