"""A model pair from what a caller names (``resolve_model``): a bundled name, a directory, a hub
id, a (target, draft) pair of those, or a loaded ModelPair; loads are cached per process while
the files on disk stay the same."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Union

import torch

from ..errors import InvalidInputError
from . import hub
from .pair import ModelPair, check_dtype, load_pair, resolve_dtype

ModelSpec = Union[str, Path, tuple, ModelPair]


def _files_identity(*dirs: str | None) -> tuple[tuple[str, int, int], ...]:
    """(resolved path, size, mtime_ns) of every file in ``dirs`` (not below them: the loaders
    read a checkpoint's top level only): a checkpoint replaced on disk gets a new identity, so
    the cache below never hands back stale weights."""
    out = []
    for d in dirs:
        if d is not None:
            for f in sorted(Path(d).iterdir()):
                if f.is_file():
                    st = f.stat()
                    out.append((str(f.resolve()), st.st_size, st.st_mtime_ns))
    return tuple(out)


@functools.lru_cache(maxsize=4)
def _load_cached(target: str, draft: str | None, dtype: torch.dtype, device: str,
                 name: str, files: tuple[tuple[str, int, int], ...]) -> ModelPair:
    """``files`` (``_files_identity``) is part of the key only."""
    return load_pair(target, draft, dtype, device, name)


def _load(target: Path, draft: Path | None, dtype: torch.dtype | str, device: torch.device | str,
          name: str) -> ModelPair:
    t, d = str(target.resolve()), None if draft is None else str(draft.resolve())
    dtype = resolve_dtype(dtype, t, device)
    return _load_cached(t, d, dtype, str(device), name, _files_identity(t, d))


def resolve_model(model: ModelSpec, device: torch.device | str = "cpu",
                  dtype: torch.dtype | str = "auto", *, draft: str | Path | None = None,
                  revision: str | None = None, draft_revision: str | None = None) -> ModelPair:
    """A bundled name; a directory holding target/ and draft/, or one checkpoint (the target);
    a Hugging Face hub id ``"ORG/NAME"`` (fetched into the hub's cache, safetensors only:
    ``dflash2rt.models.hub``); a (target, draft) pair of directories or hub ids; or an already
    loaded ModelPair. A string naming an existing local path is always that path.

    ``draft``: a directory or hub id for the draft (it replaces a draft/ beside the target;
    without one a lone checkpoint runs target-only). ``revision`` / ``draft_revision``: the
    branch, tag or commit of the target's / the draft's hub id (None: main). ``dtype="auto"``:
    float32 on the CPU, the checkpoint's dtype (bfloat16) on accelerators; else a
    floating-point torch dtype or vLLM's names for one ("bfloat16", "float16" / "half",
    "float32" / "float", "float64"); a loaded ModelPair runs in its own dtype (another one
    is refused)."""
    dtype = check_dtype(dtype)                       # before anything is read or fetched
    if isinstance(model, ModelPair):
        if draft is not None or revision is not None or draft_revision is not None:
            raise InvalidInputError("a loaded ModelPair takes no draft, revision or "
                                    "draft_revision")
        if dtype != "auto" and dtype != model.dtype:
            raise InvalidInputError(f"dtype={dtype} for a ModelPair loaded in {model.dtype}: "
                                    f"a loaded pair runs in its own dtype (load it in {dtype}, "
                                    f"or leave dtype 'auto')")
        return model
    target, draft_loc, name = hub.locate_pair(model, draft, revision, draft_revision)
    return _load(target.path, None if draft_loc is None else draft_loc.path, dtype, device,
                 name)
