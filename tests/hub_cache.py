"""A Hugging Face hub cache written by hand, in exactly the layout huggingface_hub's client
writes (``models--ORG--NAME/{blobs,refs,snapshots}``), so that hub ids resolve with no network.

    models--ORG--NAME/
      blobs/<sha256 of an LFS file | git blob sha1 of a small one>
      refs/main                      the commit, no newline (refs/<tag> likewise)
      snapshots/<commit>/<file>      → ../../blobs/<hash> (relative symlinks)
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

LFS_SUFFIXES = (".safetensors", ".bin", ".pt")


def files_of(directory: Path, prefix: str = "") -> dict[str, bytes]:
    """Every file under ``directory`` as {repository path: content}."""
    directory = Path(directory)
    return {prefix + p.relative_to(directory).as_posix(): p.read_bytes()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def add_repo(cache: Path, repo_id: str, files: dict[str, bytes], refs: tuple[str, ...] = ("main",),
             commit: str | None = None) -> str:
    """Cache ``files`` as one commit of model repository ``repo_id``; ``refs`` (branches or
    tags) point at it. Returns the commit hash."""
    repo = Path(cache) / ("models--" + repo_id.replace("/", "--"))
    if commit is None:
        h = hashlib.sha1(repo_id.encode())
        for name, data in sorted(files.items()):
            h.update(name.encode() + hashlib.sha256(data).digest())
        commit = h.hexdigest()
    snap = repo / "snapshots" / commit
    for name, data in files.items():
        if name.endswith(LFS_SUFFIXES):        # LFS pointers: the blob is named by its sha256
            blob = hashlib.sha256(data).hexdigest()
        else:                                   # regular git files: the git blob sha1
            blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        (repo / "blobs").mkdir(parents=True, exist_ok=True)
        (repo / "blobs" / blob).write_bytes(data)
        link = snap / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(repo / "blobs" / blob, link.parent))
    for ref in refs:
        (repo / "refs" / ref).parent.mkdir(parents=True, exist_ok=True)
        (repo / "refs" / ref).write_text(commit)
    return commit
