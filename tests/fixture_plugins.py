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
PLUGINS = {"good": GOOD, "broken": BROKEN_IMPORT, "raising": RAISING_HOOK,
           "misspelled": MISSPELLED, "duplicate": DUPLICATE}


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
