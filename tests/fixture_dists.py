"""Install the fixture plugins of tests/fixtures/ as real distributions on a sys.path entry, as
pip would leave them: the module (a copy of the fixture's file), its dist-info and an entry
point. A fixture that is installed more than one way reads its parameters from the
``<module>.json`` written beside it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def copy_module(root: Path, fixture: str, module: str) -> None:
    """tests/fixtures/FIXTURE as the module MODULE on the sys.path entry ROOT."""
    shutil.copyfile(FIXTURES / fixture, root / f"{module}.py")


def install(root: Path, fixture: str, name: str, *, group: str = "dflash2rt.backends",
            module: str | None = None, dist: str | None = None,
            params: dict | None = None) -> str:
    """Install tests/fixtures/FIXTURE under ROOT as MODULE (default ``fixture_`` + NAME), in
    the distribution DIST 1.0 (default MODULE) whose entry point ``NAME = MODULE`` is in GROUP;
    PARAMS, if given, go to ROOT/MODULE.json. Returns MODULE."""
    module = module or "fixture_" + name.replace("-", "_")
    dist = dist or module
    copy_module(root, fixture, module)
    if params is not None:
        (root / f"{module}.json").write_text(json.dumps(params))
    info = root / f"{dist.replace('-', '_')}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[{group}]\n{name} = {module}\n")
    return module


def install_mutant(root: Path, mutant: str, dtypes: str) -> str:
    """Install tests/fixtures/mutants/MUTANT.py as the backend ``mut-MUTANT`` declaring DTYPES
    (a key of mutants/mutant_base.py's DTYPES); returns the backend's name."""
    name = f"mut-{mutant}"
    copy_module(root, "mutants/mutant_base.py", "fixture_mutant_base")
    install(root, f"mutants/{mutant.replace('-', '_')}.py", name,
            params={"name": name, "dtypes": dtypes})
    return name
