"""Out-of-tree fixtures for the verdict tests (installed with ``test_conformance_suite.install``
as real distributions): a pytest plugin that makes one suite module raise at import, a plugin
that makes the bundled pair fail to load, a backend that declares only float16 (no L1 op case
uses it), and a GPU-style backend whose Triton kernels fail to build inside
``plugin_kit.gpu_backend``."""

from __future__ import annotations

# pytest11 plugin: importing dflash2rt_conformance.suites.test_l3_joint_law raises, through the
# import system itself (a meta-path finder whose loader raises), as a broken module would.
BROKEN_SUITE = '''
import importlib.machinery
import sys

TARGET = "dflash2rt_conformance.suites.test_l3_joint_law"


class _Raising:
    def find_spec(self, name, path=None, target=None):
        if name != TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        spec.loader = self
        return spec

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        raise RuntimeError("planted: this suite module raises at import")


def pytest_configure(config):
    sys.meta_path.insert(0, _Raising())      # ahead of pytest's assertion rewriter
'''

# pytest11 plugin: the bundled pair is installed but loading it raises.
BROKEN_BUNDLED = '''
def pytest_configure(config):
    from dflash2rt import api

    def resolve_model(*args, **kwargs):
        raise OSError("planted: the bundled safetensors are truncated")

    api.resolve_model = resolve_model
'''

FLOAT16_ONLY = '''
import torch
from dflash2rt.backend import BackendSpec, Probe, TorchOpsBackend
from dflash2rt.hookspecs import hookimpl


@hookimpl
def dflash2rt_backends():
    probe = lambda: Probe(True, device="cpu (float16-only fixture)", dtypes=("float16",))
    return [BackendSpec("f16-only", 1, probe,
                        lambda p: TorchOpsBackend("f16-only", "cpu", (torch.float16,)),
                        opt_in=True)]
'''

# A GPU-style plugin: its create() goes through plugin_kit.gpu_backend like the cuda / rocm /
# xpu plugins, while the kernel module raises when its KernelBackend is looked up (as when
# Triton cannot build the kernels for the device).
NO_KERNELS = '''
import sys
import types

import torch
from dflash2rt import plugin_kit
from dflash2rt.backend import BackendSpec, Probe
from dflash2rt.hookspecs import hookimpl
from dflash2rt.kernels.tuning import Tuning

NAME = "nokernels"
KERNELS = "dflash2rt.kernels.backend"


class _Unbuildable(types.ModuleType):
    def __getattr__(self, name):
        raise RuntimeError("fixture: the Triton kernels failed to build for this device")


def probe():
    return Probe(True, device="cpu (GPU-style fixture whose kernels cannot be built)",
                 kernels="triton kernels", dtypes=("float32",), details={"torch_device": "cpu"})


def create(p):
    saved = sys.modules.get(KERNELS)
    sys.modules[KERNELS] = _Unbuildable(KERNELS)
    try:
        return plugin_kit.gpu_backend(NAME, p, (torch.float32,), Tuning(block_h=64, block_v=512))
    finally:
        if saved is None:
            del sys.modules[KERNELS]
        else:
            sys.modules[KERNELS] = saved


@hookimpl
def dflash2rt_backends():
    return [BackendSpec(NAME, 50, probe, create, summary="GPU-style fixture, kernels fail")]
'''
