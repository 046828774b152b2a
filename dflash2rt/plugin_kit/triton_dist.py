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

What the decision looks at is read by ``triton_env.py``; the commands and hints it words are
``triton_hints.py``'s (``install_hint`` too, for a backend that finds no triton).

``python -m dflash2rt.plugin_kit.triton_dist`` prints the decision; ``--pip-args`` prints only
what pip should install (one argument a line, nothing when nothing is to be installed) with one
human line on stderr, and exits 3 when the environment needs a fix by hand (``scripts/setup.sh``
calls it); ``--check`` exits 0 only when nothing is left to install or fix.
"""

from __future__ import annotations

import argparse
import enum
import json
import sys
from dataclasses import asdict, dataclass
from typing import Sequence

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from .triton_env import (IMPORT_PACKAGE, PYPI_TRITON, Environment, Provider, TorchBuild,
                         TritonDistError, inspect, normalize)
from .triton_hints import USUAL_DISTRIBUTION, vendor_note, install_command

EXIT_FIX = 3


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
            f"{source}; none installed{vendor_note(wanted)}. Fix: "
            f"{install_command(wanted, b)}"))
    p = have[0]
    if p.name != want_name:
        if b.kind == "cpu" and env.torch_triton is None:
            return _out(env, Action.OK, wanted, (
                f"{b} brings no Triton; {p} provides triton, so PyPI {PYPI_TRITON!r} is not "
                f"installed over it (the interpreter lane uses it as it is)"))
        return _out(env, Action.FIX, wanted, (
            f"{source}, but triton comes from {p}{vendor_note(wanted)}. Fix (uninstall first, "
            f"so no shared file is lost): pip uninstall -y {p.name} && "
            f"{install_command(wanted, b)}"))
    if _satisfies(p, wanted):
        return _out(env, Action.OK, wanted, f"{source}; {p} is installed")
    if want_name == PYPI_TRITON:
        return _out(env, Action.INSTALL, wanted, (
            f"{source}; {p} does not match: installing {wanted} from PyPI (the same "
            f"distribution, replaced)"), wanted)
    return _out(env, Action.FIX, wanted, (
        f"{source}, but {p} is installed{vendor_note(wanted)}. Fix: pip uninstall -y {p.name} "
        f"&& {install_command(wanted, b)}"))


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
