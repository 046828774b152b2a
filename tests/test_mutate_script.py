"""``scripts/mutate.py``: on a tree of its own, a test that pins a module's bounds kills every
mutant of it, a weaker one leaves the bound's mutants alive and says which; the module is
restored after the sweep."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "mutate.py"
MODULE = '''"""A bound."""


def inside(x: int | None) -> bool:
    return x is not None and 0 < x <= 3
'''
STRONG = '''from bound import inside


def test_edges():
    assert [inside(x) for x in (None, 0, 1, 3, 4)] == [False, False, True, True, False]
'''
WEAK = '''from bound import inside


def test_middle():
    assert inside(2) and not inside(None)
'''


@pytest.mark.slow                      # a pytest subprocess per mutant
@pytest.mark.parametrize("test,alive", [(STRONG, 0), (WEAK, None)], ids=["strong", "weak"])
def test_a_sweep_reports_exactly_the_mutants_the_tests_let_live(tmp_path, test, alive):
    (tmp_path / "bound.py").write_text(MODULE)
    (tmp_path / "test_bound.py").write_text(test)
    out = subprocess.run([sys.executable, str(SCRIPT), "--tree", str(tmp_path), "bound.py",
                          "test_bound.py"], capture_output=True, text=True, timeout=600)
    lines = out.stdout.splitlines()
    assert lines[0] == "6 mutants of bound.py", out.stdout + out.stderr
    survived = [x for x in lines if x.startswith("SURVIVED")]
    if alive == 0:
        assert out.returncode == 0 and not survived and lines[-1] == "0 of 6 survived"
    else:                              # the bounds 0 < x and x <= 3, and the constants
        assert out.returncode == 1 and len(survived) == 4, out.stdout
        assert any(x.startswith("SURVIVED line 5 cmp LtE->Lt") and
                   x.endswith(": return x is not None and 0 < x < 3") for x in survived), \
            out.stdout                 # each survivor names the statement it changed
        (tmp_path / "sweep.log").write_text(out.stdout)
        again = subprocess.run([sys.executable, str(SCRIPT), "--tree", str(tmp_path),
                                "bound.py", "test_bound.py", "--recheck",
                                str(tmp_path / "sweep.log")],
                               capture_output=True, text=True, timeout=600)
        assert again.stdout.splitlines()[0] == "4 mutants of bound.py", again.stdout
    assert (tmp_path / "bound.py").read_text() == MODULE
