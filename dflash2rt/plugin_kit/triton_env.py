"""What the Triton decision (``triton_dist.py``) looks at on this machine: the installed torch's
build (``torch.version``: CUDA, ROCm, XPU or CPU, and its runtime version), every installed
distribution that provides the import package ``triton`` (several can, and pip does not know
they collide), the Triton requirement torch's own distribution metadata names for this platform,
and dflash2rt's ``triton`` extra (what the CPU build gets). Only package metadata is read;
``inspect`` takes another path, a fake torch module and marker values, so tests can stage any
machine.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from importlib import metadata
from typing import Iterable, Mapping, Sequence

from packaging.requirements import InvalidRequirement, Requirement

IMPORT_PACKAGE = "triton"
PYPI_TRITON = "triton"            # the only Triton distribution pip may install from PyPI here


class TritonDistError(RuntimeError):
    """The Triton installation cannot be decided or needs a fix by hand; the message says what
    to do."""


def normalize(name: str) -> str:
    """A distribution name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class TorchBuild:
    """The installed torch: ``kind`` is "cuda", "rocm", "xpu" or "cpu" (from ``torch.version``);
    ``runtime`` the CUDA / HIP / XPU version it was built with ("" on the CPU build)."""

    kind: str
    version: str
    runtime: str = ""

    def __str__(self) -> str:
        what = {"cuda": "CUDA", "rocm": "ROCm", "xpu": "XPU", "cpu": "CPU"}[self.kind]
        return f"torch {self.version} ({what} build{' ' + self.runtime if self.runtime else ''})"


@dataclass(frozen=True)
class Provider:
    """An installed distribution that provides the import package ``triton``."""

    name: str
    version: str

    def __str__(self) -> str:
        return f"{self.name} {self.version}"


@dataclass(frozen=True)
class Environment:
    """What the decision looks at. ``torch_triton``: the Triton requirement torch's metadata
    names for this platform (None: it names none); ``torch_metadata``: whether torch's
    distribution metadata was found at all; ``cpu_requirement``: dflash2rt's ``triton`` extra,
    what the CPU build gets; ``platform``: ``sys.platform``."""

    build: TorchBuild
    providers: tuple[Provider, ...]
    torch_triton: str | None
    torch_metadata: bool
    cpu_requirement: str
    platform: str = "linux"


def torch_build(torch_module=None) -> TorchBuild:
    """The installed torch's build, from ``torch.version`` (ROCm builds also set ``cuda`` on
    some releases, so ``hip`` is read first)."""
    if torch_module is None:
        import torch as torch_module
    v = torch_module.version
    for attr, kind in (("hip", "rocm"), ("xpu", "xpu"), ("cuda", "cuda")):
        value = getattr(v, attr, None)
        if value:
            return TorchBuild(kind, torch_module.__version__, str(value))
    return TorchBuild("cpu", torch_module.__version__)


def _distributions(path: Sequence[str] | None) -> Iterable[metadata.Distribution]:
    return metadata.distributions(path=list(path)) if path is not None \
        else metadata.distributions()


def _provides_triton(dist: metadata.Distribution) -> bool:
    top = dist.read_text("top_level.txt")
    if top is not None and IMPORT_PACKAGE in top.split():
        return True
    # No top_level.txt (not every build backend writes one): the installed files say.
    return any(f.parts[:1] == (IMPORT_PACKAGE,) for f in (dist.files or ()))


def triton_providers(path: Sequence[str] | None = None) -> tuple[Provider, ...]:
    """Every installed distribution that provides the import package ``triton`` (the first of
    each name on the path, as Python would import it)."""
    found: dict[str, Provider] = {}
    for dist in _distributions(path):
        name = normalize(dist.metadata["Name"] or "")
        if name and name not in found and _provides_triton(dist):
            found[name] = Provider(name, dist.version)
    return tuple(sorted(found.values(), key=lambda p: p.name))


def _applies(req: Requirement, marker_env: Mapping[str, str] | None) -> bool:
    if req.marker is None:
        return True
    return req.marker.evaluate({**(marker_env or {}), "extra": ""})


def torch_triton_requirement(path: Sequence[str] | None = None,
                             marker_env: Mapping[str, str] | None = None
                             ) -> tuple[bool, str | None]:
    """(torch's metadata found, the Triton requirement it names for this platform, without its
    marker): a requirement of torch's whose name contains "triton"."""
    dist = next((d for d in _distributions(path) if normalize(d.metadata["Name"] or "") == "torch"),
                None)
    if dist is None:
        return False, None
    for text in dist.requires or ():
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        if "triton" in normalize(req.name) and _applies(req, marker_env):
            return True, f"{normalize(req.name)}{req.specifier}"
    return True, None


def cpu_requirement() -> str:
    """dflash2rt's ``triton`` extra (pyproject.toml), read from the installed metadata."""
    try:
        requires = metadata.requires("dflash2rt") or []
    except metadata.PackageNotFoundError:
        raise TritonDistError("dflash2rt is not installed in this environment, so its triton "
                              "extra cannot be read: run pip install -e . first") from None
    for text in requires:
        req = Requirement(text)
        if normalize(req.name) == PYPI_TRITON and req.marker is not None \
                and req.marker.evaluate({"extra": "triton"}) \
                and not req.marker.evaluate({"extra": ""}):
            return f"{PYPI_TRITON}{req.specifier}"
    raise TritonDistError("dflash2rt's metadata has no 'triton' extra naming PyPI triton: "
                          "reinstall dflash2rt (pip install -e .)")


def inspect(path: Sequence[str] | None = None, torch_module=None,
            marker_env: Mapping[str, str] | None = None,
            cpu_req: str | None = None) -> Environment:
    """The environment as the decision sees it. ``path``: look for torch's and Triton's
    distributions there instead of ``sys.path``; ``torch_module``, ``marker_env`` and
    ``cpu_req`` replace the imported torch, the platform's marker values and dflash2rt's extra
    (tests)."""
    found, req = torch_triton_requirement(path, marker_env)
    return Environment(build=torch_build(torch_module), providers=triton_providers(path),
                       torch_triton=req, torch_metadata=found,
                       cpu_requirement=cpu_req if cpu_req is not None else cpu_requirement(),
                       platform=sys.platform)
