"""Model pairs shipped inside the package, so that everything works offline."""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import InvalidInputError

_ROOT = Path(__file__).resolve().parent


def bundled_models() -> list[str]:
    """Names of the bundled pairs (directories holding ``target/`` and ``draft/``), sorted."""
    return sorted(p.name for p in _ROOT.iterdir()
                  if p.is_dir() and (p / "target").is_dir() and (p / "draft").is_dir())


def bundled_path(name: str) -> Path:
    """The directory of bundled pair ``name`` (with ``target/``, ``draft/``, ``heldout_prompts.json``)."""
    names = bundled_models()
    if name not in names or _looks_like_path(name):
        raise InvalidInputError(f"no such model directory {name!r} (and no bundled model of that "
                                f"name; bundled: {', '.join(names) or 'none'})")
    return _ROOT / name


def model_dir(value: str | Path) -> Path:
    """``value`` as a directory when it is one, else the bundled pair of that name
    (InvalidInputError naming the bundled pairs otherwise)."""
    path = Path(value)
    return path if path.is_dir() else bundled_path(str(value))


def _looks_like_path(name: str) -> bool:
    """A path separator, a leading '.' or '~', or a suffix: meant as a directory, not a name."""
    seps = {"/", os.sep} | ({os.altsep} if os.altsep else set())
    return any(c in name for c in seps) or name.startswith((".", "~")) or bool(Path(name).suffix)
