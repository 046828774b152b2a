"""Model pairs shipped inside the package, so that everything works offline."""

from __future__ import annotations

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
    if name not in names:
        raise InvalidInputError(f"unknown bundled model {name!r}; available: {', '.join(names) or 'none'}")
    return _ROOT / name
