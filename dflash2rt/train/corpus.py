"""The training corpus: the Python standard library's own source, split into train / held-out by file."""

from __future__ import annotations

import hashlib
import os
import random
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from ..errors import InvalidInputError

# Directory names whose files are never used: test suites, third-party code, generated data tables.
SKIP_DIRS = frozenset({"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__",
                       "pydoc_data", "encodings"})
HELDOUT_FRACTION = 0.08


def stdlib_root() -> Path:
    """The directory of this interpreter's standard library (present on every machine)."""
    return Path(sysconfig.get_paths()["stdlib"])


def list_files(root: Path, max_bytes: int = 250_000) -> list[str]:
    """Sorted POSIX paths (relative to ``root``) of the *.py files the corpus uses."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = Path(dirpath).relative_to(root)
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS
                       and not (rel_dir == Path(".") and d.startswith("config-"))]
        for name in filenames:
            path = Path(dirpath) / name
            if not name.endswith(".py") or name.startswith("test_") or not path.is_file():
                continue
            if path.stat().st_size <= max_bytes:
                out.append((rel_dir / name).as_posix())
    return sorted(out)


def is_heldout(rel_path: str, fraction: float = HELDOUT_FRACTION) -> bool:
    """Deterministic split by file: a hash of the relative path, independent of any seed."""
    digest = hashlib.sha256(rel_path.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction


@dataclass(frozen=True)
class Corpus:
    """Texts of the training and held-out files, in sorted path order."""

    root: Path
    train: tuple[tuple[str, str], ...]     # (relative path, text)
    heldout: tuple[tuple[str, str], ...]

    @property
    def train_chars(self) -> int:
        return sum(len(t) for _, t in self.train)


def load_corpus(root: Path | None = None, max_files: int | None = None) -> Corpus:
    """Read the corpus; ``max_files`` keeps the first files of each split (for tiny test runs)."""
    root = stdlib_root() if root is None else Path(root)
    files = list_files(root)
    if not files:
        raise InvalidInputError(f"no usable *.py files under {root}")
    train, heldout = [], []
    for rel in files:
        text = (root / rel).read_text(encoding="utf-8", errors="replace")
        if text.strip():
            (heldout if is_heldout(rel) else train).append((rel, text))
    if max_files is not None:
        train, heldout = train[:max_files], heldout[:max(1, max_files // 4)]
    if not train or not heldout:
        raise InvalidInputError(f"{root}: the split left no training or no held-out files")
    return Corpus(root, tuple(train), tuple(heldout))


def cut_prompts(files: tuple[tuple[str, str], ...], encode, count: int, min_tokens: int,
                max_tokens: int, seed: int) -> list[dict]:
    """``count`` prompts of whole lines, min..max tokens, each from a random file (seeded).

    A prompt starts at a line start and ends after a newline, so a continuation starts a line.
    Returns dicts with ``file``, ``line`` (1-based first line), ``prompt`` (text) and ``prompt_ids``.
    """
    rng = random.Random(seed)
    out: list[dict] = []
    tries = 0
    while len(out) < count:
        tries += 1
        if tries > 50 * count + 100:
            raise InvalidInputError(f"could not cut {count} prompts of {min_tokens}..{max_tokens} "
                                    "tokens from the given files")
        rel, text = files[rng.randrange(len(files))]
        lines = text.splitlines(keepends=True)
        start = rng.randrange(len(lines))
        want = rng.randint(min_tokens, max_tokens)
        if not lines[start].strip():
            continue
        ids: list[int] = []
        end = start
        while end < len(lines) and len(ids) < want:
            end += 1
            ids = encode("".join(lines[start:end]))
        if min_tokens <= len(ids) <= max_tokens:
            out.append({"file": rel, "line": start + 1, "prompt": "".join(lines[start:end]),
                        "prompt_ids": ids})
    return out
