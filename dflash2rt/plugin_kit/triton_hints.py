"""What to tell the user about installing Triton: the PyTorch wheel index the installed torch
came from (read from its version's local tag), the pip command that installs a requirement (PyPI
for PyPI ``triton``, else that index), why a vendor's Triton is never taken from PyPI, and
``install_hint``, what a backend reports when ``import triton`` finds nothing: torch's exact
requirement when its metadata names one, else the vendor's own distribution, never PyPI triton
over a vendor build.
"""

from __future__ import annotations

import re

from packaging.requirements import Requirement

from .triton_env import PYPI_TRITON, TorchBuild, normalize, torch_build, torch_triton_requirement

PYTORCH_INDEX = "https://download.pytorch.org/whl"
# The Triton each torch build normally brings, named in messages when torch's metadata says
# nothing (a source build, or a platform its wheels bring none for).
USUAL_DISTRIBUTION = {
    "cuda": "triton",
    "rocm": "pytorch-triton-rocm",
    "xpu": "pytorch-triton-xpu",          # triton-xpu in newer torch releases
    "cpu": "triton",
}


def torch_index(torch_version: str) -> str | None:
    """The PyPI-style index of PyTorch's wheels that a torch version's local tag names
    (``2.9.0+rocm6.4`` → ``.../whl/rocm6.4``), or None when the tag names none (then torch came
    from elsewhere, e.g. PyPI or AMD's repo.radeon.com)."""
    base, _, local = torch_version.partition("+")
    if not re.fullmatch(r"cu\d+|rocm\d+(\.\d+)*|xpu", local):
        return None
    return f"{PYTORCH_INDEX}/{'nightly/' if 'dev' in base else ''}{local}"


def index_text(distribution: str, build: TorchBuild) -> str:
    """Where ``distribution`` (a vendor Triton) comes from: the index the installed torch's
    version names, else an example of the PyTorch index for that vendor."""
    index = torch_index(build.version)
    if index:
        return index
    name = normalize(distribution)
    example = ("rocm6.4" if "rocm" in name else "xpu" if "xpu" in name else "nightly/cu128")
    return f"<the PyTorch index your torch came from, e.g. {PYTORCH_INDEX}/{example}>"


def install_command(requirement: str, build: TorchBuild) -> str:
    """The pip command that installs ``requirement``: from PyPI for PyPI ``triton``, else from
    the PyTorch index the installed torch came from."""
    name = normalize(Requirement(requirement).name)
    if name == PYPI_TRITON:
        return f"pip install '{requirement}'"
    return f"pip install '{requirement}' --index-url {index_text(name, build)}"


def vendor_note(requirement: str) -> str:
    """Why a vendor Triton is not installed from PyPI ("" for PyPI triton itself)."""
    name = normalize(Requirement(requirement).name)
    if name == PYPI_TRITON:
        return ""
    wheels = "ROCm" if "rocm" in name else "XPU" if "xpu" in name else "nightly"
    return (f" ({name} comes with torch's {wheels} wheels from the PyTorch index; PyPI "
            f"{PYPI_TRITON!r} or dflash2rt[triton] would be installed over it, and a {name} "
            f"on PyPI, if any, is not the build torch was released with)")


def install_hint(distribution: str | None = None) -> str:
    """What to install when ``import triton`` finds nothing, for the vendor whose Triton is
    ``distribution`` (``TritonFacts.distribution``; None: the interpreter / CPU): the exact
    requirement and index when torch's metadata names them, never PyPI triton for a vendor
    build."""
    b = torch_build()
    _, req = torch_triton_requirement()
    if req is not None:
        return f"{install_command(req, b)}, the Triton {b} requires{vendor_note(req)}"
    dist = distribution or USUAL_DISTRIBUTION[b.kind]
    if normalize(dist) == PYPI_TRITON and b.kind in ("cpu", "cuda"):
        return ("pip install 'dflash2rt[triton]' (PyPI triton)" if b.kind == "cpu" else
                f"pip install triton, the version {b} was released with")
    return (f"install {dist}, the version {b} was released with: pip install '{dist}==<that "
            f"version>' --index-url {index_text(dist, b)}; not PyPI triton or dflash2rt[triton], "
            f"which would be installed over it")
