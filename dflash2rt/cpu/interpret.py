"""The opt-in ``triton-interpret`` backend: the GPU Triton kernels run on CPU tensors through
Triton's interpreter (``TRITON_INTERPRET=1``), so CI exercises the kernels' logic.

Known blind spots of the interpreter (PORTABILITY.md), not tested on this lane: bf16 arithmetic
and bf16 ``tl.dot`` give wrong values silently (so bf16 is refused here), out-of-bounds accesses
are not checked, ``device_assert`` never fires, and autotuning with several configs needs a
driver (the kernels use one config from a tuning table). Checked on real devices only.
"""

from __future__ import annotations

import importlib.util
import os
import sys

import torch

from ..backend import Backend, BackendSpec, Probe
from ..plugin_kit import interpreting

NAME = "triton-interpret"


def probe() -> Probe:
    if importlib.util.find_spec("triton") is None:
        from ..plugin_kit.triton_dist import install_hint

        return Probe(False, f"triton is not installed: {install_hint()}")
    if "triton" in sys.modules and not interpreting():
        return Probe(False, "triton was already imported in this process without "
                     "TRITON_INTERPRET=1; start the process with TRITON_INTERPRET=1")
    from importlib.metadata import version

    return Probe(True, device="cpu (Triton interpreter)",
                 kernels="triton kernels under the interpreter: conv, selector walk, verify, "
                 "attention",
                 dtypes=("float32", "float16"),
                 graphs="none: the interpreter has no graphs (eager launches)",
                 details={"triton": version("triton"), "torch": torch.__version__})


def create(_: Probe) -> Backend:
    if "triton" not in sys.modules:
        os.environ["TRITON_INTERPRET"] = "1"   # must precede the first import of triton
    from ..kernels.backend import KernelBackend

    return KernelBackend(NAME, "cpu", (torch.float32, torch.float16))


SPEC = BackendSpec(name=NAME, priority=1, probe=probe, create=create, opt_in=True,
                   summary="Triton kernels on CPU through the interpreter (CI lane)")
