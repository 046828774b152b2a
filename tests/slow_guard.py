"""The slow tier's rule, enforced where a test runs: a test that trains (an optimizer step), or
starts a process that runs pytest, the conformance suite, ``dflash2rt conformance | qualify |
train``, the kernels' compile check or a headless browser, must carry ``@pytest.mark.slow``
(so that ``pytest -m "not slow"`` stays the fast tier). tests/conftest.py watches every phase of
every test under tests/ with ``watch``; tests/test_tiers.py tests this module."""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
from collections.abc import Iterator

import pytest

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
HEAVY_COMMANDS = ("conformance", "qualify", "train")      # dflash2rt's subcommands


def heavy_command(args) -> str | None:
    """Why starting the process ``args`` (as subprocess.Popen takes them) needs the slow
    marker, or None."""
    try:
        if isinstance(args, os.PathLike):
            argv = [os.fsdecode(args)]
        elif isinstance(args, (str, bytes)):
            argv = shlex.split(os.fsdecode(args))
        else:
            argv = [os.fsdecode(a) for a in args]
    except (TypeError, ValueError):          # let Popen say what is wrong with them
        return None
    if not argv:
        return None
    if os.path.basename(argv[0]) in BROWSERS or "--headless" in argv:
        return "drives a headless browser"
    if any(a.startswith("dflash2rt_conformance") for a in argv):
        return "runs the conformance suite"
    if "-mpytest" in argv or any(a == "-m" and b == "pytest" for a, b in zip(argv, argv[1:])):
        return "runs pytest in a subprocess"
    if "dflash2rt.kernels.compile_check" in argv:
        return "compiles the kernels"
    for a, b in zip(argv, argv[1:]):               # .venv/bin/dflash2rt CMD, python -m dflash2rt CMD
        if os.path.basename(a) == "dflash2rt" and b in HEAVY_COMMANDS:
            return f"runs dflash2rt {b}"
    return None


_watches: list[list[str]] = []      # the innermost watch records what its test did
_popen_init = subprocess.Popen.__init__


def active_watches() -> list[list[str]]:
    """What each active watch recorded so far, outermost first (the innermost records)."""
    return _watches


def recording_init(self, args, *rest, **kwargs):
    """``subprocess.Popen.__init__`` while a watch is active: records a heavy command."""
    why = heavy_command(args)
    if why and _watches:
        cmd = os.fsdecode(args) if isinstance(args, (str, bytes, os.PathLike)) else \
            shlex.join(map(os.fsdecode, args))
        _watches[-1].append(f"{why} ({cmd[:200]})")
    _popen_init(self, args, *rest, **kwargs)


def _optimizer_step(optimizer, args, kwargs) -> None:
    if _watches:
        _watches[-1].append(f"trains ({type(optimizer).__name__}.step)")


@contextlib.contextmanager
def watch(nodeid: str, slow: bool) -> Iterator[None]:
    """Fail (pytest.fail, at the end of the block) if the test ``nodeid``, not marked ``slow``,
    trained or started a process that needs the marker inside the block."""
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    seen: list[str] = []
    outermost = not _watches
    if outermost:
        hook = register_optimizer_step_pre_hook(_optimizer_step)
        subprocess.Popen.__init__ = recording_init
    _watches.append(seen)
    try:
        yield
    finally:
        _watches.pop()
        if outermost:
            subprocess.Popen.__init__ = _popen_init
            hook.remove()
    if seen and not slow:
        pytest.fail(f"{nodeid} needs @pytest.mark.slow (pytest -m 'not slow' is the fast "
                    f"tier): it " + "; ".join(dict.fromkeys(seen)), pytrace=False)
