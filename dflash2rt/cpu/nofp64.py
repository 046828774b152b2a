"""The opt-in ``cpu-nofp64`` backend: the CPU torch ops with float64 forbidden, as on Intel GPUs
without float64 (Arc A-series), so CI proves that a decode never touches a float64 tensor.

``Float64Forbidden`` is a TorchDispatchMode that raises ``Float64Error`` on any aten op with a
float64 tensor among its inputs or outputs (Python scalars are not tensors and pass). The
backend's ``run_context()`` (the whole decode of ``Engine.generate``) and every op method run
under it; ``has_fp64 = False`` makes the ops take their float32 formulation (``ops.exact32``).
NumPy work outside torch (the CPU Philox path) is not seen by the mode and is not device work.
"""

from __future__ import annotations

import contextlib
import functools

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..backend import Backend, BackendSpec, Probe, TorchOpsBackend

NAME = "cpu-nofp64"


class Float64Error(RuntimeError):
    """A float64 tensor appeared where the device has no float64."""


def _has_f64(tree) -> bool:
    """A float64 tensor anywhere in an aten op's arguments or result (tensors, or tuples,
    lists and dicts of them: the containers aten's schemas have), without building the
    flattened list on every op."""
    if isinstance(tree, torch.Tensor):
        return tree.dtype is torch.float64
    if isinstance(tree, (tuple, list)):
        return any(_has_f64(x) for x in tree)
    if isinstance(tree, dict):
        return any(_has_f64(x) for x in tree.values())
    return False


class Float64Forbidden(TorchDispatchMode):
    """Raise ``Float64Error`` on any op with a float64 tensor input or output."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _has_f64((args, kwargs)):
            raise Float64Error(f"{func}: float64 tensor input on a device without float64")
        if kwargs.get("dtype") == torch.float64:
            raise Float64Error(f"{func}: dtype=float64 on a device without float64")
        out = func(*args, **kwargs)
        if _has_f64(out):
            raise Float64Error(f"{func}: float64 tensor output on a device without float64")
        return out


def _forbidding(method):
    @functools.wraps(method)
    def wrapped(self, *args, **kwargs):
        with Float64Forbidden():
            return method(self, *args, **kwargs)
    return wrapped


OPS = ("conv_prepare", "conv_finish", "select", "verify", "noise", "token_uniforms",
       "attention", "rms_norm", "attention_prologue")


def forbid_fp64(cls: type[Backend]) -> type[Backend]:
    """A subclass of backend class ``cls`` whose ops (``OPS``) and ``run_context()`` (the whole
    decode) run under ``Float64Forbidden``; construct it with ``has_fp64=False``."""
    def run_context(self) -> contextlib.AbstractContextManager:
        stack = contextlib.ExitStack()
        stack.enter_context(cls.run_context(self))
        stack.enter_context(Float64Forbidden())
        return stack

    body = {op: _forbidding(getattr(cls, op)) for op in OPS}
    return type(f"{cls.__name__}NoFp64", (cls,), {**body, "run_context": run_context,
                                                   "__doc__": forbid_fp64.__doc__})


class NoFp64Backend(forbid_fp64(TorchOpsBackend)):
    """``TorchOpsBackend`` with ``has_fp64=False``, every op under ``Float64Forbidden``."""

    def __init__(self) -> None:
        super().__init__(NAME, "cpu", (torch.float32, torch.bfloat16), has_fp64=False)


def probe() -> Probe:
    return Probe(available=True, device="cpu (float64 forbidden)",
                 kernels="torch eager ops, float32 formulation of the sampled path",
                 dtypes=("float32", "bfloat16"), fp64=False,
                 graphs="none: eager on CPU (no graph API for CPU tensors)",
                 details={"torch": torch.__version__})


def create(_: Probe) -> Backend:
    return NoFp64Backend()


SPEC = BackendSpec(name=NAME, priority=0, probe=probe, create=create, opt_in=True,
                   summary="CPU torch ops with float64 forbidden, as on Intel GPUs without fp64 "
                           "(CI lane for the float32 formulation of the sampled path)")
