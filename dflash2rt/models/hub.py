"""Hugging Face hub ids as model names: ``"Qwen/Qwen3-8B"`` → a snapshot directory in the hub's
cache, through ``huggingface_hub`` (the optional extra ``dflash2rt[hub]``).

Only configs, tokenizers and safetensors are ever fetched (``WEIGHT_PATTERNS``), never pickle
weights (``.bin`` / ``.pt``); ``inspect`` fetches configs only (``CONFIG_PATTERNS``) and reads
the safetensors headers remotely (``file_headers``). The hub's cache, ``revision`` and
``HF_HUB_OFFLINE`` are honoured: offline (or with the repository missing from the cache) a typed
error says how to get it. ``locate`` / ``locate_pair`` turn what a user names (a local
directory, a bundled name, a hub id, a pair of them) into directories; a string naming an
existing local path is never a hub id.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from dflash2rt.errors import (CheckpointError, InvalidInputError, MissingExtraError,
                              ModelNotFoundError)

HUB_EXTRA = "pip install 'dflash2rt[hub]'"
# What a snapshot may hold (fnmatch patterns, as huggingface_hub matches them; '*' also
# crosses '/', so a repository holding target/ and draft/ comes whole).
CONFIG_PATTERNS = ("*config.json", "*tokenizer.json", "*special_tokens_map.json",
                   "*.safetensors.index.json")
WEIGHT_PATTERNS = CONFIG_PATTERNS + ("*.safetensors",)
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".ckpt")
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
_TRUE = {"1", "ON", "YES", "TRUE"}


def is_hub_id(name: object) -> bool:
    """``ORG/NAME`` that is not an existing local path (a ``Path`` is always local)."""
    if not isinstance(name, str) or not _ID.fullmatch(name):
        return False
    if ".." in name or "--" in name or name.endswith(".git"):
        return False
    return not Path(name).expanduser().exists()


def offline() -> bool:
    """HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) as set now, or as huggingface_hub read it."""
    if any(os.environ.get(k, "").upper() in _TRUE for k in ("HF_HUB_OFFLINE",
                                                             "TRANSFORMERS_OFFLINE")):
        return True
    try:
        from huggingface_hub import constants
    except ImportError:
        return False
    return bool(getattr(constants, "HF_HUB_OFFLINE", False))


def cache_dir() -> str:
    """The hub cache in use: $HF_HUB_CACHE as set now, else huggingface_hub's default."""
    env = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if env:
        return os.path.expanduser(os.path.expandvars(env))
    _hub()                                      # MissingExtraError without it
    from huggingface_hub import constants       # a submodule the package imports lazily

    return str(constants.HF_HUB_CACHE)


def _new_cli() -> bool:
    """huggingface_hub 1.0 replaced the ``huggingface-cli`` command with ``hf``."""
    try:
        import huggingface_hub
        from packaging.version import Version

        return Version(huggingface_hub.__version__) >= Version("1.0")
    except Exception:  # noqa: BLE001 - for a hint only
        return True


def download_hint(repo_id: str, revision: str | None = None) -> str:
    """The command that puts ``repo_id`` in the cache, for the installed huggingface_hub."""
    rev = f" --revision {revision}" if revision else ""
    cmd = "hf download" if _new_cli() else "huggingface-cli download"
    return f"`{cmd} {repo_id}{rev}`"


def _login_hint() -> str:
    return "`hf auth login`" if _new_cli() else "`huggingface-cli login`"


def _hub() -> Any:
    try:
        import huggingface_hub
    except ImportError as exc:
        raise MissingExtraError(
            f"hub ids as model names need huggingface_hub: {HUB_EXTRA}") from exc
    return huggingface_hub


def _errors(hf: Any) -> dict[str, type]:
    """huggingface_hub's exception classes (``errors`` since 0.23, ``utils`` before); one this
    version lacks matches nothing."""
    try:
        from huggingface_hub import errors as mod
    except ImportError:
        from huggingface_hub import utils as mod
    names = ("LocalEntryNotFoundError", "RepositoryNotFoundError", "RevisionNotFoundError",
             "GatedRepoError", "HFValidationError", "EntryNotFoundError", "HfHubHTTPError")
    never = type("_Never", (Exception,), {})
    return {n: getattr(mod, n, None) or never for n in names}


def snapshot(repo_id: str, revision: str | None = None, weights: bool = True) -> Path:
    """The snapshot directory of ``repo_id`` at ``revision`` (a branch, tag or commit; None:
    main), fetched into the cache unless offline: configs, tokenizer and (``weights``) the
    safetensors. With ``weights``, a snapshot without safetensors is refused (pickle weights
    are never loaded). ModelNotFoundError when it cannot be had, saying how to get it."""
    hf = _hub()
    err = _errors(hf)
    off = offline()
    rev = f" (revision {revision})" if revision else ""
    try:
        path = Path(hf.snapshot_download(
            repo_id, revision=revision, cache_dir=cache_dir(), local_files_only=off,
            allow_patterns=list(WEIGHT_PATTERNS if weights else CONFIG_PATTERNS)))
    except err["HFValidationError"] as exc:
        raise ModelNotFoundError(f"{repo_id!r} is not a valid hub id: {exc}") from exc
    except err["RevisionNotFoundError"] as exc:
        raise ModelNotFoundError(f"hub repository {repo_id} has no revision {revision!r}; give "
                                 "a branch, tag or commit it has") from exc
    except err["GatedRepoError"] as exc:
        raise ModelNotFoundError(f"hub repository {repo_id} is gated: accept its terms on the "
                                 f"hub and log in ({_login_hint()}), then retry") from exc
    except err["RepositoryNotFoundError"] as exc:
        raise ModelNotFoundError(f"hub repository {repo_id} does not exist (or is private: log "
                                 f"in with {_login_hint()})") from exc
    except (err["LocalEntryNotFoundError"], FileNotFoundError) as exc:
        raise not_cached(repo_id, revision, off) from exc
    except err["HfHubHTTPError"] as exc:
        raise ModelNotFoundError(f"hub repository {repo_id}{rev} could not be fetched: "
                                 f"{exc}") from exc
    _check_snapshot(repo_id, revision, path, weights, off)
    return path


def not_cached(repo_id: str, revision: str | None, off: bool,
                missing: str | None = None) -> ModelNotFoundError:
    rev = f" at revision {revision}" if revision else ""
    where = f"the Hugging Face cache ({cache_dir()})"
    state = f"is incomplete in {where} ({missing} missing)" if missing else f"is not in {where}"
    if off:
        why, how = f"{state}, and HF_HUB_OFFLINE is set", "or go online (unset HF_HUB_OFFLINE)"
    else:
        why, how = f"{state}, and the hub could not be reached", "or check the network"
    return ModelNotFoundError(f"hub model {repo_id}{rev} {why}: download it with "
                              f"{download_hint(repo_id, revision)} {how}")


def _check_snapshot(repo_id: str, revision: str | None, path: Path, weights: bool,
                    off: bool) -> None:
    """A config.json, and safetensors weights (never pickle); offline, a cached snapshot that
    lacks them (fetched for ``inspect``, or interrupted) is 'incomplete in the cache'."""
    pair = (path / "target").is_dir()            # a repository holding target/ and draft/
    roots = [p for p in (path / "target", path / "draft") if p.is_dir()] if pair else [path]
    for root in roots:
        name = lambda f: f"{root.name}/{f}" if pair else f  # noqa: E731
        if not (root / "config.json").is_file():
            if off:
                raise not_cached(repo_id, revision, off, name("config.json"))
            raise CheckpointError(f"hub model {repo_id} has no {name('config.json')}: it is not a "
                                  "Hugging Face checkpoint")
        if not weights or (root / "model.safetensors").is_file():
            continue
        index = root / "model.safetensors.index.json"
        if index.is_file():
            from dflash2rt.models.tokenizer import read_json_object

            shards = read_json_object(index).get("weight_map", {})
            missing = sorted({s for s in shards.values() if isinstance(s, str)
                              and not (root / s).is_file()}) if isinstance(shards, dict) else []
            if missing:
                raise not_cached(repo_id, revision, off, name(missing[0]))
            continue
        pickles = sorted(p.name for p in root.iterdir() if p.suffix in PICKLE_SUFFIXES)
        if pickles or not off:
            found = f" (it holds {', '.join(pickles)})" if pickles else ""
            raise CheckpointError(
                f"hub model {repo_id}{f' at revision {revision}' if revision else ''} has no "
                f"safetensors weights ({name('model.safetensors')} or its index){found}: "
                "dflash2rt loads safetensors only, never pickle weights (.bin / .pt); use a "
                "revision or repository that has safetensors, or convert it")
        raise not_cached(repo_id, revision, off, name("model.safetensors"))


def file_headers(repo_id: str, filename: str, commit: str | None
                 ) -> dict[str, tuple[tuple[int, ...], str]]:
    """{tensor: (shape, dtype)} of one safetensors file of a hub repository, read remotely:
    its header only (range requests), never its weights."""
    hf = _hub()
    err = _errors(hf)
    try:
        meta = hf.HfApi().parse_safetensors_file_metadata(repo_id, filename, revision=commit)
    except err["EntryNotFoundError"] as exc:
        raise CheckpointError(f"hub model {repo_id} has no {filename}: dflash2rt loads "
                              "safetensors only (model.safetensors or model.safetensors."
                              "index.json), never pickle weights (.bin / .pt)") from exc
    except Exception as exc:  # noqa: BLE001 - network, auth: say what failed
        raise ModelNotFoundError(f"cannot read the header of {filename} in hub model {repo_id}: "
                                 f"{type(exc).__name__}: {exc}") from exc
    return {name: (tuple(info.shape), str(info.dtype)) for name, info in meta.tensors.items()}


@dataclass(frozen=True)
class Located:
    """A checkpoint directory and what it was named by."""

    path: Path                       # the checkpoint directory (config.json, safetensors)
    source: str                      # as named: a path, a bundled name or a hub id
    repo_id: str | None = None       # a hub id's repository ...
    snapshot: Path | None = None     # ... its snapshot directory (path is it or inside it)
    revision: str | None = None      # ... and the revision asked for (None: main)

    @property
    def commit(self) -> str | None:
        """The snapshot's commit (the cache names snapshot directories by commit)."""
        return self.snapshot.name if self.snapshot is not None else None

    def repo_path(self, name: str) -> str:
        """``name`` inside this checkpoint as a path in its hub repository."""
        assert self.snapshot is not None
        return (self.path / name).relative_to(self.snapshot).as_posix()

    def sub(self, name: str) -> "Located":
        return replace(self, path=self.path / name)


def check_revision(revision: object, what: str) -> None:
    """A revision is None (main) or a non-blank string (a branch, tag or commit)."""
    if revision is not None and (not isinstance(revision, str) or not revision.strip()):
        raise InvalidInputError(f"the {what}'s revision must be a branch, tag or commit name "
                                f"(None: main), got {revision!r}")


def locate(spec: object, revision: str | None = None, what: str = "model",
           weights: bool = True) -> Located:
    """The directory ``spec`` names: an existing local path; else a hub id's snapshot (fetched
    unless offline; configs only when not ``weights``); else, for ``what == "model"``, a
    bundled pair. Errors name ``what`` (model, target or draft)."""
    if not isinstance(spec, (str, Path)):
        raise InvalidInputError(f"model directories must be paths or hub ids, got {spec!r}")
    if isinstance(spec, str) and not spec.strip():
        raise InvalidInputError(f"the {what} is an empty string: give a bundled name, a "
                                f"directory or a hub id (the current directory is '.')")
    check_revision(revision, what)
    path = Path(spec).expanduser()
    if is_hub_id(spec):
        try:
            snap = snapshot(str(spec), revision, weights)
        except (ModelNotFoundError, MissingExtraError) as exc:
            note = ""
            if what == "model":
                from dflash2rt.bundled import bundled_models

                note = (f" (and no bundled model of that name; bundled: "
                        f"{', '.join(bundled_models()) or 'none'})")
            raise type(exc)(f"no such {what} directory {str(spec)!r}{note}; as a hub id: "
                            f"{exc}") from exc
        return Located(snap, str(spec), str(spec), snap, revision)
    if revision is not None:
        raise InvalidInputError(f"revision {revision!r} applies to hub ids; {str(spec)!r} is "
                                "not one (a local path or a bundled name)")
    if path.exists() and not path.is_dir():
        raise InvalidInputError(f"{what} {str(spec)!r} is a file; give a directory" + (
            " with target/ and draft/" if what == "model" else ""))
    if path.is_dir():
        return Located(path, str(spec))
    if what != "model":
        raise InvalidInputError(f"no such {what} directory {str(path)!r}")
    from dflash2rt.bundled import bundled_path  # "no such model directory", with the names

    return Located(bundled_path(str(spec)), str(spec))


def locate_pair(model: object, draft: object = None, revision: str | None = None,
                draft_revision: str | None = None, weights: bool = True
                ) -> tuple[Located, Located | None, str]:
    """(target, draft or None, the pair's name) for ``model``: a directory holding target/
    (and draft/), one checkpoint (the target), a hub id of either, a bundled name, or a
    (target, draft) tuple of directories or hub ids. ``draft`` replaces a draft/ beside the
    target. The name: a hub id, else the directory's name."""
    check_revision(revision, "model")
    check_revision(draft_revision, "draft")
    if isinstance(model, tuple):                   # its draft_revision is the tuple's draft's
        if len(model) != 2:
            raise InvalidInputError("model as a tuple must be (target_dir, draft_dir)")
        if model[0] is None:
            raise InvalidInputError("model tuple (target_dir, draft_dir) needs a target_dir")
        if draft is not None:
            raise InvalidInputError("give the draft in the (target, draft) tuple or as draft, "
                                    "not both")
        if model[1] is None and draft_revision is not None:
            raise InvalidInputError("draft_revision applies to a draft hub id; the (target, "
                                    "draft) tuple has no draft")
        target = locate(model[0], revision, "target", weights)
        d = None if model[1] is None else locate(model[1], draft_revision, "draft", weights)
        return target, d, _name(target)
    if draft is None and draft_revision is not None:
        raise InvalidInputError("draft_revision applies to a draft hub id; give draft too")
    if not isinstance(model, (str, Path)):
        raise InvalidInputError(f"model must be a bundled name, a directory, a hub id, a "
                                f"(target, draft) tuple or a ModelPair, got {model!r}")
    root = locate(model, revision, "model", weights)
    if (root.path / "target").is_dir():
        target, d = root.sub("target"), root.sub("draft")
        d = d if d.path.is_dir() else None
    elif (root.path / "config.json").is_file():
        target, d = root, None                          # one checkpoint: the target
    else:
        raise InvalidInputError(f"{root.path} has no target/ directory (expected target/ and "
                                "draft/, or a checkpoint's config.json)")
    if draft is not None:
        d = locate(draft, draft_revision, "draft", weights)
    return target, d, root.repo_id or root.path.name


def _name(loc: Located) -> str:
    return loc.repo_id or loc.path.name
