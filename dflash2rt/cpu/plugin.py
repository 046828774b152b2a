"""CPU backend plugin: the device-generic torch ops, eager, on the host CPU."""

from __future__ import annotations

import dataclasses
import os
import platform

import torch

from ..backend import Backend, BackendSpec, Probe, TorchOpsBackend
from ..hookspecs import hookimpl
from . import interpret, nofp64, packed

DTYPES = ("float32", "float64", "bfloat16")


def probe() -> Probe:
    threads = torch.get_num_threads()
    return Probe(
        available=True,
        device=f"cpu ({platform.machine()}, {os.cpu_count()} cores, {threads} torch threads)",
        kernels="torch eager ops (reference semantics)",
        dtypes=DTYPES,
        graphs="none: eager on CPU (no graph API for CPU tensors)",
        details={"torch": torch.__version__, "device_count": "1"},
    )


def probe_device(index: int) -> Probe:
    """"cpu:N": the host CPU (the CPU backend has one device, so ``qualify --devices all``
    gives cpu:0); N only names a run, so that several runs on one host, e.g. ``qualify
    --devices cpu:0,cpu:1``, report under their own names."""
    if index < 0:
        return Probe(False, f"cpu:{index}: a device index is >= 0")
    p = probe()
    return dataclasses.replace(p, device=f"cpu:{index} = the host {p.device}")


def create(_: Probe) -> Backend:
    backend = TorchOpsBackend("cpu", "cpu", (torch.float32, torch.float64, torch.bfloat16))
    backend.model_pass = packed.pack_linears      # float32 linears on oneDNN (cpu/packed.py)
    return backend


@hookimpl
def dflash2rt_backends() -> list[BackendSpec]:
    return [BackendSpec(name="cpu", priority=0, probe=probe, create=create,
                        probe_device=probe_device,
                        summary="built-in CPU backend (embedded default)"), interpret.SPEC,
            interpret.SPEC_NOFP64, nofp64.SPEC]
