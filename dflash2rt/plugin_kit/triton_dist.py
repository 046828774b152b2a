"""Which Triton distribution this machine should have, and whether pip may install it.

Several distributions install the same import package ``triton``: PyPI ``triton`` (what torch's
CUDA wheels require, and what the CPU build's interpreter lane and compile checks use),
``pytorch-triton-rocm`` (torch's ROCm wheels), ``pytorch-triton-xpu`` or, in newer torch
releases, ``triton-xpu`` (torch's XPU wheels), ``pytorch-triton`` (torch's nightlies). pip does
not know they collide: installing a second one writes its files over the first one's, and
uninstalling either later deletes files the other still needs.

So the decision starts from torch's own requirements (its distribution metadata names the
Triton it was released with, and the version), never from a fixed name:

- torch requires a Triton here: that one, at that version. pip may install it only when it is
  PyPI ``triton`` and no other Triton distribution is installed; the vendor builds come from the
  PyTorch index torch came from, which is for the user to name (``fix``).
- torch requires none (the CPU build): PyPI ``triton`` as dflash2rt's ``triton`` extra pins it,
  unless some Triton distribution is already there (then nothing: never a second one).
- two Triton distributions installed, or one that is not the one torch requires: ``fix``, with
  the commands that repair it (uninstall first, then install, so no shared file is lost).

``python -m dflash2rt.plugin_kit.triton_dist`` prints the decision; ``--pip-args`` prints only
what pip should install (one argument a line, nothing when nothing is to be installed) with one
human line on stderr, and exits 3 when the environment needs a fix by hand (``scripts/setup.sh``
calls it); ``--check`` exits 0 only when nothing is left to install or fix.
"""

from __future__ import annotations

import argparse
import enum
import json
import re
import sys
from dataclasses import asdict, dataclass
from importlib import metadata
from typing import Iterable, Mapping, Sequence

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

IMPORT_PACKAGE = "triton"
PYPI_TRITON = "triton"            # the only Triton distribution pip may install from PyPI here
EXIT_FIX = 3
PYTORCH_INDEX = "https://download.pytorch.org/whl"
# The Triton each torch build normally brings, named in messages when torch's metadata says
# nothing (a source build, or a platform its wheels bring none for).
USUAL_DISTRIBUTION = {
    "cuda": "triton",
    "rocm": "pytorch-triton-rocm",
    "xpu": "pytorch-triton-xpu",          # triton-xpu in newer torch releases
    "cpu": "triton",
}


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


class Action(str, enum.Enum):
    OK = "ok"              # the right Triton is installed
    INSTALL = "install"    # pip installs ``pip_args`` (PyPI triton only, never over another)
    NONE = "none"          # no Triton for this build and platform: kernels run as torch ops
    FIX = "fix"            # by hand: ``reason`` says how (exit status 3)


@dataclass(frozen=True)
class Decision:
    action: Action
    build: TorchBuild
    wanted: str | None                  # the requirement this machine should satisfy
    installed: tuple[Provider, ...]
    reason: str
    pip_args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # The rule this module exists for, checked on every decision it makes.
        if bool(self.pip_args) != (self.action is Action.INSTALL):
            raise ValueError(f"pip arguments {self.pip_args} with action {self.action.value}")
        if self.pip_args:
            req = Requirement(self.pip_args[0])
            if len(self.pip_args) != 1 or normalize(req.name) != PYPI_TRITON:
                raise ValueError(f"only PyPI {PYPI_TRITON!r} is installed by pip here, not "
                                 f"{' '.join(self.pip_args)}")
            others = [p for p in self.installed if p.name != PYPI_TRITON]
            if others:
                raise ValueError(f"refusing to install {PYPI_TRITON!r} over "
                                 f"{', '.join(map(str, others))}")

    def line(self) -> str:
        """One human line: what is done about Triton and why."""
        return f"triton: {self.action.value}: {self.reason}"

    def as_dict(self) -> dict:
        d = asdict(self)
        d["action"] = self.action.value
        d["build"] = {**asdict(self.build), "label": str(self.build)}
        d["installed"] = [str(p) for p in self.installed]
        return d


# -- looking at the machine ------------------------------------------------------------------

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


# -- what to say ------------------------------------------------------------------------------

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


def _vendor_note(requirement: str) -> str:
    """Why a vendor Triton is not installed from PyPI ("" for PyPI triton itself)."""
    name = normalize(Requirement(requirement).name)
    if name == PYPI_TRITON:
        return ""
    wheels = "ROCm" if "rocm" in name else "XPU" if "xpu" in name else "nightly"
    return (f" ({name} comes with torch's {wheels} wheels from the PyTorch index; PyPI "
            f"{PYPI_TRITON!r} or dflash2rt[triton] would be installed over it, and a {name} "
            f"on PyPI, if any, is not the build torch was released with)")


# -- the decision -----------------------------------------------------------------------------

def _satisfies(provider: Provider, requirement: str) -> bool:
    spec = SpecifierSet(str(Requirement(requirement).specifier))
    try:
        return spec.contains(Version(provider.version), prereleases=True)
    except InvalidVersion:
        return False


def decide(env: Environment) -> Decision:
    """What this machine should do about Triton (see the module's docstring)."""
    wanted, source = _wanted(env)
    if len(env.providers) > 1:
        return _several_providers(env, wanted, source)
    if wanted is None:
        return _nothing_wanted(env, source)
    return _against_wanted(env, wanted, source)


def _out(env: Environment, action: Action, wanted: str | None, reason: str,
         *args: str) -> Decision:
    return Decision(action, env.build, wanted, env.providers, reason, tuple(args))


def _wanted(env: Environment) -> tuple[str | None, str]:
    """The requirement this build wants (None: unknown) and where that comes from, in words."""
    b = env.build
    if env.torch_triton is not None:
        return env.torch_triton, f"{b} requires {env.torch_triton}"
    if b.kind == "cpu":
        return env.cpu_requirement, (
            f"{b} brings no Triton; the interpreter lane and the compile checks use PyPI "
            f"{PYPI_TRITON!r} as dflash2rt's triton extra pins it ({env.cpu_requirement})")
    return None, (
        f"{b}: torch's metadata names no Triton for this platform"
        if env.torch_metadata else
        f"{b}: torch's distribution metadata was not found (a source build?), so the "
        f"Triton it was built with is unknown")


def _several_providers(env: Environment, wanted: str | None, source: str) -> Decision:
    """More than one distribution installs the import package: uninstall them all first."""
    have = env.providers
    repair = f"pip uninstall -y {' '.join(p.name for p in have)}"
    if wanted is not None:
        repair += f" && {install_command(wanted, env.build)}"
    return _out(env, Action.FIX, wanted, (
        f"{len(have)} distributions install the import package {IMPORT_PACKAGE!r}: "
        f"{', '.join(map(str, have))}; its files on disk are a mix of whichever was "
        f"installed last. {source}. Fix: {repair}"))


def _nothing_wanted(env: Environment, source: str) -> Decision:
    """No known requirement: whatever is installed is used unchecked."""
    b, have = env.build, env.providers
    if have:
        return _out(env, Action.OK, None, (
            f"{source}; {have[0]} provides triton (not checked against torch: install the "
            f"{USUAL_DISTRIBUTION[b.kind]} your torch was built with if its kernels fail)"))
    return _out(env, Action.NONE, None, (
        f"{source}; nothing is installed (the usual one for this build is "
        f"{USUAL_DISTRIBUTION[b.kind]}, matching torch): the {b.kind} backend runs torch ops, "
        f"reported as a kernel fallback"))


def _against_wanted(env: Environment, wanted: str, source: str) -> Decision:
    """At most one provider, checked against the requirement ``wanted``."""
    b, have = env.build, env.providers
    want_name = normalize(Requirement(wanted).name)
    if b.kind == "cpu" and env.torch_triton is None and not env.platform.startswith("linux"):
        if have:
            return _out(env, Action.OK, None, f"{b}; {have[0]} provides triton")
        return _out(env, Action.NONE, None, (
            f"{b}: PyPI {PYPI_TRITON!r} publishes Linux wheels only, this is {env.platform}: "
            f"no triton-interpret lane or compile checks here"))
    if not have:
        if want_name == PYPI_TRITON:
            return _out(env, Action.INSTALL, wanted, f"{source}; none installed: installing "
                        f"{wanted} from PyPI", wanted)
        return _out(env, Action.FIX, wanted, (
            f"{source}; none installed{_vendor_note(wanted)}. Fix: "
            f"{install_command(wanted, b)}"))
    p = have[0]
    if p.name != want_name:
        if b.kind == "cpu" and env.torch_triton is None:
            return _out(env, Action.OK, wanted, (
                f"{b} brings no Triton; {p} provides triton, so PyPI {PYPI_TRITON!r} is not "
                f"installed over it (the interpreter lane uses it as it is)"))
        return _out(env, Action.FIX, wanted, (
            f"{source}, but triton comes from {p}{_vendor_note(wanted)}. Fix (uninstall first, "
            f"so no shared file is lost): pip uninstall -y {p.name} && "
            f"{install_command(wanted, b)}"))
    if _satisfies(p, wanted):
        return _out(env, Action.OK, wanted, f"{source}; {p} is installed")
    if want_name == PYPI_TRITON:
        return _out(env, Action.INSTALL, wanted, (
            f"{source}; {p} does not match: installing {wanted} from PyPI (the same "
            f"distribution, replaced)"), wanted)
    return _out(env, Action.FIX, wanted, (
        f"{source}, but {p} is installed{_vendor_note(wanted)}. Fix: pip uninstall -y {p.name} "
        f"&& {install_command(wanted, b)}"))


def install_hint(distribution: str | None = None) -> str:
    """What to install when ``import triton`` finds nothing, for the vendor whose Triton is
    ``distribution`` (``TritonFacts.distribution``; None: the interpreter / CPU): the exact
    requirement and index when torch's metadata names them, never PyPI triton for a vendor
    build."""
    b = torch_build()
    _, req = torch_triton_requirement()
    if req is not None:
        return f"{install_command(req, b)}, the Triton {b} requires{_vendor_note(req)}"
    dist = distribution or USUAL_DISTRIBUTION[b.kind]
    if normalize(dist) == PYPI_TRITON and b.kind in ("cpu", "cuda"):
        return ("pip install 'dflash2rt[triton]' (PyPI triton)" if b.kind == "cpu" else
                f"pip install triton, the version {b} was released with")
    return (f"install {dist}, the version {b} was released with: pip install '{dist}==<that "
            f"version>' --index-url {index_text(dist, b)}; not PyPI triton or dflash2rt[triton], "
            f"which would be installed over it")


# -- CLI ----------------------------------------------------------------------------------------

def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m dflash2rt.plugin_kit.triton_dist",
        description="Which Triton distribution matches the installed torch, and what pip should "
                    "install (never a second Triton distribution over another).")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--pip-args", action="store_true",
                      help="print only what pip should install, one argument a line (nothing "
                           "when nothing is to be installed); the reason goes to stderr")
    mode.add_argument("--check", action="store_true",
                      help="exit 0 only when nothing is left to install or fix")
    mode.add_argument("--json", action="store_true", help="print the decision as JSON")
    ap.add_argument("--path", action="append", metavar="DIR",
                    help="look for torch's and Triton's distributions in DIR (repeatable) "
                         "instead of sys.path, e.g. another environment's site-packages")
    args = ap.parse_args(argv)
    try:
        d = decide(inspect(args.path))
    except TritonDistError as exc:
        print(f"triton: cannot decide: {exc}", file=sys.stderr)
        return EXIT_FIX
    if args.pip_args:
        print(d.line(), file=sys.stderr)
        for a in d.pip_args:
            print(a)
    elif args.json:
        print(json.dumps(d.as_dict(), indent=2))
    else:
        print(d.line())
    if d.action is Action.FIX:
        return EXIT_FIX
    if args.check and d.action is Action.INSTALL:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
