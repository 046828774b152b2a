"""Write out-of-tree fixture plugins as real distributions (dist-info + entry point) on a path."""

from __future__ import annotations

import textwrap
from pathlib import Path

GOOD = '''
from dflash2rt.backend import BackendSpec, Probe, TorchOpsBackend
from dflash2rt.hookspecs import hookimpl
import torch

def _probe():
    return Probe(True, device="cpu (fixture)", kernels="reference", dtypes=("float64",))

@hookimpl
def dflash2rt_backends():
    return [BackendSpec("oot", 5, _probe,
                        lambda p: TorchOpsBackend("oot", "cpu", (torch.float64,)),
                        summary="out-of-tree fixture"),
            BackendSpec("oot-optin", 500, _probe,
                        lambda p: TorchOpsBackend("oot-optin", "cpu", (torch.float64,)),
                        opt_in=True)]
'''
BROKEN_IMPORT = "raise RuntimeError('fixture plugin exploded at import')\n"
RAISING_HOOK = '''
from dflash2rt.hookspecs import hookimpl

@hookimpl
def dflash2rt_backends():
    raise ValueError("fixture hook failure")
'''
MISSPELLED = '''
from dflash2rt.hookspecs import hookimpl

@hookimpl
def dflash2rt_backend():
    return []
'''
DUPLICATE = '''
from dflash2rt.backend import BackendSpec, Probe
from dflash2rt.hookspecs import hookimpl

@hookimpl
def dflash2rt_backends():
    return [BackendSpec("cpu", 1000, lambda: Probe(True), lambda p: None)]
'''
# GPU-style plugins on the CPU: their create goes through plugin_kit.gpu_backend with a vendor's
# Triton facts, and with the Triton target lookup / the kernel smoke launch injected.
_GPU_STYLE = '''
import torch
from dflash2rt import plugin_kit
from dflash2rt.backend import BackendSpec, Probe
from dflash2rt.hookspecs import hookimpl

NAME = "{name}"
TRITON = plugin_kit.TritonFacts(backend="hip", distribution="pytorch-triton-rocm",
                         tuning={{64: plugin_kit.Tuning(block_h=64, block_v=512)}})


def probe():
    return Probe(True, device="cpu (GPU-style fixture)", kernels="triton kernels",
                 dtypes=("float32",), details={{"torch_device": "cpu"}})


def smoke_fails(backend):
    raise RuntimeError("fixture: the verify kernel faulted on its smoke launch")


def create(p):
    return plugin_kit.gpu_backend(NAME, p, (torch.float32,), TRITON.tuning_for(None), triton=TRITON,
                           target_lookup=lambda: "{target}", smoke={smoke})


@hookimpl
def dflash2rt_backends():
    return [BackendSpec(NAME, 60, probe, create, summary="GPU-style fixture")]
'''
# Triton's active target is "cuda" where the vendor needs "hip" (the wrong Triton installed).
MISMATCH = _GPU_STYLE.format(name="fx-mismatch", target="cuda", smoke="None")
# The right target, but a kernel's smoke launch fails on the device.
SMOKE_FAILS = _GPU_STYLE.format(name="fx-smokefail", target="hip", smoke="smoke_fails")
PLUGINS = {"good": GOOD, "broken": BROKEN_IMPORT, "raising": RAISING_HOOK,
           "misspelled": MISSPELLED, "duplicate": DUPLICATE, "mismatch": MISMATCH,
           "smokefail": SMOKE_FAILS}


def write_plugin(root: Path, kind: str) -> str:
    """Install fixture plugin ``kind`` under ``root`` (a sys.path entry); return its ep name."""
    module = f"fixture_{kind}_plugin"
    (root / f"{module}.py").write_text(PLUGINS[kind])
    dist = root / f"fixture_{kind}-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(textwrap.dedent(f"""\
        Metadata-Version: 2.1
        Name: fixture-{kind}
        Version: 1.0
        """))
    (dist / "entry_points.txt").write_text(f"[dflash2rt.backends]\nfixture-{kind} = {module}\n")
    return f"fixture-{kind}"
