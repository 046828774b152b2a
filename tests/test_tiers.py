"""The test tiers: ``pytest -m "not slow"`` is the fast tier, and tests/slow_guard.py (watching
every test from tests/conftest.py) fails a test that trains, or starts pytest, the conformance
suite, qualify, train, the compile check or a headless browser, unless it is marked slow."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import slow_guard
from slow_guard import heavy_command, watch

PY = sys.executable


@pytest.mark.parametrize("args,why", [
    ([PY, "-m", "dflash2rt", "conformance", "--backend", "cpu"], "runs dflash2rt conformance"),
    (["/repo/.venv/bin/dflash2rt", "qualify", "--quick"], "runs dflash2rt qualify"),
    ([PY, "-m", "dflash2rt", "train", "--out", "x"], "runs dflash2rt train"),
    ([PY, "-m", "pytest", "-q", "--pyargs", "dflash2rt_conformance"], "runs the conformance suite"),
    ([PY, "-mpytest", "--basetemp=/tmp/x", "-p", "no:cacheprovider"],      # pytester's subprocess
     "runs pytest in a subprocess"),
    ([PY, "-m", "dflash2rt.kernels.compile_check", "--json"], "compiles the kernels"),
    (["/usr/bin/chromium", "--headless", "--dump-dom", "x.html"], "drives a headless browser"),
    ("chromium --headless --screenshot x.html", "drives a headless browser"),
    ([PY, "-m", "dflash2rt", "run", "--prompt", "def f("], None),
    ([PY, "-m", "dflash2rt", "backends", "--json"], None),
    ([PY, "-m", "dflash2rt", "report", "merge", "a", "b"], None),
    ([PY, "-c", "import dflash2rt"], None),
    (["bash", "-n", "scripts/device_check.sh"], None),
    ([b"/usr/bin/chromium", "--headless"], "drives a headless browser"),
    ([], None),
    ([PY, 3], None),                                # not Popen's args: Popen says so
])
def test_heavy_commands_are_named(args, why):
    assert heavy_command(args) == why


def test_the_conftest_watches_this_test():
    assert subprocess.Popen.__init__ is slow_guard.recording_init
    assert len(slow_guard.active_watches()) == 1


def test_an_unmarked_test_that_starts_the_suite_fails_naming_it():
    argv = [PY, "-c", "pass", "--pyargs", "dflash2rt_conformance"]     # cheap, named like the suite
    with pytest.raises(pytest.fail.Exception, match=r"tests/x.py::t needs @pytest.mark.slow .*"
                       r"it runs the conformance suite \(.*-c pass --pyargs"):
        with watch("tests/x.py::t", slow=False):
            subprocess.run(argv, check=True)
    with watch("tests/x.py::t", slow=True):                             # marked: fine
        subprocess.run(argv, check=True)
    with watch("tests/x.py::t", slow=False):                            # not heavy: fine
        subprocess.run([PY, "-c", "pass"], check=True)


def test_an_unmarked_test_that_trains_fails():
    w = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([w], lr=0.1)
    with pytest.raises(pytest.fail.Exception, match=r"it trains \(SGD.step\)"):
        with watch("tests/x.py::t", slow=False):
            (w * w).sum().backward()
            opt.step()
    with watch("tests/x.py::t", slow=True):
        opt.step()
    assert not slow_guard.active_watches()[-1]            # the inner watches kept it from this test's own
