"""Model pairs shipped inside the package, so that everything works offline."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..errors import InvalidInputError

_ROOT = Path(__file__).resolve().parent
HELDOUT = "heldout_prompts.json"


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
    if isinstance(value, str) and not value.strip():
        raise InvalidInputError("the model is an empty string: give a bundled name or a "
                                "directory (the current directory is '.')")
    path = Path(value)
    return path if path.is_dir() else bundled_path(str(value))


def heldout(root: Path) -> list[dict[str, Any]]:
    """The held-out prompts of model directory ``root`` (its ``heldout_prompts.json``), in
    the file's order: each a dict with the prompt's text under ``"prompt"`` (a plain string
    in the file is read as that text) and, where the file has them, its token ids under
    ``"prompt_ids"``. InvalidInputError naming the file when it is missing or not a list of
    such prompts."""
    file = Path(root) / HELDOUT
    if not file.is_file():
        raise InvalidInputError(f"{root} has no {HELDOUT}: the held-out prompts are read "
                                f"from it (a JSON list of prompts)")
    try:
        items = json.loads(file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidInputError(f"{file} is not JSON: {exc}") from None
    if not isinstance(items, list) or not items:
        raise InvalidInputError(f"{file} must hold a non-empty JSON list of prompts")
    out = []
    for i, item in enumerate(items):
        if isinstance(item, str):
            item = {"prompt": item}
        ids = item.get("prompt_ids", []) if isinstance(item, dict) else None
        if not (isinstance(item, dict) and isinstance(item.get("prompt"), str)
                and isinstance(ids, list)
                and all(isinstance(t, int) and not isinstance(t, bool) for t in ids)):
            raise InvalidInputError(f"{file}: prompt {i} must be a string or an object with "
                                    f"a string \"prompt\" (and \"prompt_ids\" a list of "
                                    f"integers, if given)")
        out.append(item)
    return out


def heldout_ids(root: Path) -> list[list[int]]:
    """The held-out prompts' token ids, as the file gives them (``heldout``);
    InvalidInputError when a prompt has none."""
    items = heldout(root)
    missing = [i for i, h in enumerate(items) if "prompt_ids" not in h]
    if missing:
        raise InvalidInputError(f"{Path(root) / HELDOUT}: prompt {missing[0]} has no "
                                f"\"prompt_ids\" (the token ids this command reads)")
    return [list(h["prompt_ids"]) for h in items]


def _looks_like_path(name: str) -> bool:
    """A path separator, a leading '.' or '~', or a suffix: meant as a directory, not a name."""
    seps = {"/", os.sep} | ({os.altsep} if os.altsep else set())
    return any(c in name for c in seps) or name.startswith((".", "~")) or bool(Path(name).suffix)
