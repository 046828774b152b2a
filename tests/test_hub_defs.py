"""Hub names against the documented rules written out: ids, env, errors, snapshot layouts."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from dflash2rt.errors import (CheckpointError, InvalidInputError, MissingExtraError,
                              ModelNotFoundError)
from dflash2rt.models import hub

huggingface_hub = pytest.importorskip("huggingface_hub")


@pytest.fixture
def env(monkeypatch, tmp_path):
    """No hub variables set, an empty cache at a known place, the CLI hint pinned to ``hf``."""
    for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        monkeypatch.delenv(k, raising=False)
    from huggingface_hub import constants
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub, "__version__", "1.2.3")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    return monkeypatch


# ---------------------------------------------------------------- hub ids

@pytest.mark.parametrize("name, want", [
    ("a/b", True), ("Qwen/Qwen3-8B", True), ("A1-b.c_d/X9_y.z-w", True), ("a/b-", True),
    ("a/b.gitx", True), ("a.git/b", True), ("a-b/c-d", True), ("a./b", True),
    ("a", False), ("a/b/c", False), ("/a/b", False), ("a/", False), ("/b", False),
    ("-a/b", False), ("a/-b", False), ("_a/b", False), ("a/.b", False), ("a/b c", False),
    ("a..b/c", False), ("a/b..c", False), ("a--b/c", False), ("a/b--c", False),
    ("a/b.git", False), ("a/b\n", False), ("~/b", False), ("", False),
])
def test_is_hub_id_table(name, want, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert hub.is_hub_id(name) is want


@pytest.mark.parametrize("value", [None, 5, b"a/b", Path("a/b"), ("a", "b")])
def test_is_hub_id_only_for_strings(value, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert hub.is_hub_id(value) is False


def test_an_existing_path_of_either_kind_is_no_hub_id(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "org").mkdir()
    (tmp_path / "org" / "file").write_text("x")
    (tmp_path / "org" / "dir").mkdir()
    assert hub.is_hub_id("org/file") is False
    assert hub.is_hub_id("org/dir") is False
    assert hub.is_hub_id("org/other") is True


# ---------------------------------------------------------------- offline and the cache

@pytest.mark.parametrize("key", ["HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"])
@pytest.mark.parametrize("value, want", [
    ("1", True), ("ON", True), ("on", True), ("Yes", True), ("TRUE", True), ("true", True),
    ("0", False), ("", False), ("false", False), ("2", False), ("off", False), (" 1", False),
])
def test_offline_from_each_variable(env, key, value, want):
    env.setenv(key, value)
    assert hub.offline() is want


def test_offline_from_huggingface_hub_constants(env):
    from huggingface_hub import constants
    assert hub.offline() is False
    env.setattr(constants, "HF_HUB_OFFLINE", True)
    assert hub.offline() is True
    env.setenv("HF_HUB_OFFLINE", "0")                # the variable as set now cannot undo it
    assert hub.offline() is True
    env.delattr(constants, "HF_HUB_OFFLINE")               # a version without the constant
    env.delenv("HF_HUB_OFFLINE")
    assert hub.offline() is False
    env.setitem(sys.modules, "huggingface_hub", None)
    assert hub.offline() is False
    env.setenv("TRANSFORMERS_OFFLINE", "yes")
    assert hub.offline() is True


def test_cache_dir_variables_in_order(env, tmp_path):
    env.setenv("HOME", str(tmp_path / "home"))
    env.setenv("SUB", "sub")
    env.setenv("HF_HUB_CACHE", "~/c/$SUB")
    env.setenv("HUGGINGFACE_HUB_CACHE", "/other")
    assert hub.cache_dir() == str(tmp_path / "home" / "c" / "sub")
    env.setenv("HF_HUB_CACHE", "")
    assert hub.cache_dir() == "/other"
    env.delenv("HF_HUB_CACHE")
    assert hub.cache_dir() == "/other"


def test_cache_dir_default_is_huggingface_hubs(env):
    from huggingface_hub import constants
    env.delenv("HF_HUB_CACHE")
    env.setattr(constants, "HF_HUB_CACHE", "/the/default")
    # as in a fresh process: the package has not yet imported its constants submodule
    env.delattr(huggingface_hub, "constants", raising=False)
    assert hub.cache_dir() == "/the/default"


def test_cache_dir_without_huggingface_hub_names_the_extra(env):
    env.delenv("HF_HUB_CACHE")
    env.setitem(sys.modules, "huggingface_hub", None)
    with pytest.raises(MissingExtraError, match=r"pip install 'dflash2rt\[hub\]'"):
        hub.cache_dir()


# ---------------------------------------------------------------- hints

@pytest.mark.parametrize("version, new", [
    ("0.23.0", False), ("0.99.9", False), ("1.0.0rc1", False), ("1.0", True), ("1.0.0", True),
    ("2.4.0", True), ("not a version", True),
])
def test_download_and_login_hints_by_version(env, version, new):
    env.setattr(huggingface_hub, "__version__", version)
    cmd = "hf download" if new else "huggingface-cli download"
    assert hub.download_hint("o/n") == f"`{cmd} o/n`"
    assert hub.download_hint("o/n", "v2") == f"`{cmd} o/n --revision v2`"
    assert hub.download_hint("o/n", "") == f"`{cmd} o/n`"
    assert hub._login_hint() == ("`hf auth login`" if new else "`huggingface-cli login`")


@pytest.mark.parametrize("off", [False, True])
@pytest.mark.parametrize("revision", [None, "v1"])
@pytest.mark.parametrize("missing", [None, "target/config.json"])
def test_not_cached_message(env, tmp_path, off, revision, missing):
    cache = str(tmp_path / "cache")
    rev = " at revision v1" if revision else ""
    where = f"the Hugging Face cache ({cache})"
    state = (f"is incomplete in {where} ({missing} missing)" if missing
             else f"is not in {where}")
    tail = ("and HF_HUB_OFFLINE is set: download it with `hf download o/n"
            + (" --revision v1" if revision else "") + "` or go online (unset HF_HUB_OFFLINE)"
            if off else
            "and the hub could not be reached: download it with `hf download o/n"
            + (" --revision v1" if revision else "") + "` or check the network")
    err = hub.not_cached("o/n", revision, off, missing)
    assert type(err) is ModelNotFoundError
    assert str(err) == f"hub model o/n{rev} {state}, {tail}"


# ---------------------------------------------------------------- snapshot: errors and arguments

def _hub_error(name: str, msg: str = "boom") -> Exception:
    from huggingface_hub import errors
    cls = getattr(errors, name)
    exc = cls.__new__(cls)
    Exception.__init__(exc, msg)
    return exc


@pytest.fixture
def download(env, tmp_path):
    """snapshot_download replaced: records its calls and returns a directory or raises."""
    box = {"calls": [], "raise": None, "dir": tmp_path / "snap"}
    box["dir"].mkdir()

    def fake(repo_id, **kw):
        box["calls"].append((repo_id, kw))
        if box["raise"] is not None:
            raise box["raise"]
        return str(box["dir"])
    env.setattr(huggingface_hub, "snapshot_download", fake)
    return box


def _checkpoint(root: Path, weights: bool = True) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text("{}")
    if weights:
        (root / "model.safetensors").write_bytes(b"")
    return root


@pytest.mark.parametrize("off", [False, True])
@pytest.mark.parametrize("weights", [False, True])
def test_snapshot_asks_for_the_documented_files(env, download, tmp_path, off, weights):
    _checkpoint(download["dir"], weights)
    if off:
        env.setenv("HF_HUB_OFFLINE", "1")
    assert hub.snapshot("o/n", "rev", weights) == download["dir"]
    [(repo, kw)] = download["calls"]
    assert repo == "o/n"
    assert kw == {"revision": "rev", "cache_dir": str(tmp_path / "cache"),
                  "local_files_only": off,
                  "allow_patterns": ["*config.json", "*tokenizer.json",
                                     "*special_tokens_map.json", "*.safetensors.index.json"]
                  + (["*.safetensors"] if weights else [])}


def test_snapshot_fetches_weights_by_default(download):
    _checkpoint(download["dir"])
    hub.snapshot("o/n")
    [(_, kw)] = download["calls"]
    assert kw["revision"] is None and kw["allow_patterns"][-1] == "*.safetensors"


@pytest.mark.parametrize("error, kind, message", [
    ("HFValidationError", ModelNotFoundError, "'o/n' is not a valid hub id: boom"),
    ("RevisionNotFoundError", ModelNotFoundError,
     "hub repository o/n has no revision 'r1'; give a branch, tag or commit it has"),
    ("GatedRepoError", ModelNotFoundError,
     "hub repository o/n is gated: accept its terms on the hub and log in (`hf auth login`), "
     "then retry"),
    ("RepositoryNotFoundError", ModelNotFoundError,
     "hub repository o/n does not exist (or is private: log in with `hf auth login`)"),
    ("HfHubHTTPError", ModelNotFoundError,
     "hub repository o/n (revision r1) could not be fetched: boom"),
])
def test_snapshot_maps_each_hub_error(download, error, kind, message):
    download["raise"] = _hub_error(error)
    with pytest.raises(kind) as info:
        hub.snapshot("o/n", "r1")
    assert str(info.value) == message
    assert info.value.__cause__ is download["raise"]


def test_snapshot_http_error_without_a_revision(download):
    download["raise"] = _hub_error("HfHubHTTPError")
    with pytest.raises(ModelNotFoundError) as info:
        hub.snapshot("o/n")
    assert str(info.value) == "hub repository o/n could not be fetched: boom"


@pytest.mark.parametrize("exc", [FileNotFoundError("gone"), "LocalEntryNotFoundError"])
def test_snapshot_not_in_the_cache(download, tmp_path, exc):
    download["raise"] = _hub_error(exc) if isinstance(exc, str) else exc
    with pytest.raises(ModelNotFoundError) as info:
        hub.snapshot("o/n", "r1")
    assert str(info.value) == str(hub.not_cached("o/n", "r1", False))
    assert "the hub could not be reached" in str(info.value)


def test_snapshot_other_errors_pass_through(download):
    download["raise"] = RuntimeError("bug")
    with pytest.raises(RuntimeError, match="bug"):
        hub.snapshot("o/n")


# ---------------------------------------------------------------- snapshot layouts

def _check(path, weights=True, off=False, revision=None):
    hub._check_snapshot("o/n", revision, path, weights, off)


def test_layout_single_checkpoint_each_way_to_hold_weights(tmp_path):
    _check(_checkpoint(tmp_path / "a"))
    _check(_checkpoint(tmp_path / "b", weights=False), weights=False)
    root = _checkpoint(tmp_path / "c", weights=False)
    (root / "model.safetensors.index.json").write_text(
        '{"weight_map": {"x": "s2.safetensors", "y": "s1.safetensors"}}')
    (root / "s1.safetensors").write_bytes(b"")
    (root / "s2.safetensors").write_bytes(b"")
    for off in (False, True):
        _check(root, off=off)


@pytest.mark.parametrize("off", [False, True])
def test_layout_missing_config(tmp_path, off):
    root = tmp_path / "s"
    root.mkdir()
    (root / "model.safetensors").write_bytes(b"")
    (root / "config.json").mkdir()                      # not a file
    if off:
        with pytest.raises(ModelNotFoundError) as info:
            _check(root, off=True)
        assert str(info.value) == str(hub.not_cached("o/n", None, True, "config.json"))
    else:
        with pytest.raises(CheckpointError) as info:
            _check(root, weights=False)
        assert str(info.value) == ("hub model o/n has no config.json: it is not a Hugging Face "
                                   "checkpoint")


@pytest.mark.parametrize("off", [False, True])
def test_layout_index_names_the_first_missing_shard(tmp_path, off):
    root = _checkpoint(tmp_path / "s", weights=False)
    (root / "model.safetensors.index.json").write_text(
        '{"weight_map": {"a": "s3.safetensors", "b": "s2.safetensors", "c": "s1.safetensors",'
        ' "d": "s3.safetensors"}}')
    (root / "s1.safetensors").write_bytes(b"")
    with pytest.raises(ModelNotFoundError) as info:
        _check(root, off=off, revision="r")
    assert str(info.value) == str(hub.not_cached("o/n", "r", off, "s2.safetensors"))


def test_layout_index_without_a_map_is_left_to_the_loader(tmp_path):
    root = _checkpoint(tmp_path / "s", weights=False)
    (root / "model.safetensors.index.json").write_text('{"weight_map": ["s9.safetensors"]}')
    _check(root)
    (root / "model.safetensors.index.json").write_text('{"metadata": {}}')
    _check(root)
    (root / "model.safetensors.index.json").write_text(
        '{"weight_map": {"a": 5, "b": ["s9.safetensors"], "c": null, "d": {}}}')
    _check(root, off=True)
    (root / "model.safetensors.index.json").write_text(
        '{"weight_map": {"a": 5, "b": "s8.safetensors"}}')
    with pytest.raises(ModelNotFoundError, match=r"s8\.safetensors missing"):
        _check(root, off=True)


@pytest.mark.parametrize("suffix", hub.PICKLE_SUFFIXES)
@pytest.mark.parametrize("off", [False, True])
def test_layout_pickle_weights_are_refused_on_or_offline(tmp_path, suffix, off):
    root = _checkpoint(tmp_path / "s", weights=False)
    (root / f"z{suffix}").write_bytes(b"")
    (root / "a.bin").write_bytes(b"")
    (root / "notes.txt").write_bytes(b"")
    names = ", ".join(sorted({"a.bin", f"z{suffix}"}))
    with pytest.raises(CheckpointError) as info:
        _check(root, off=off, revision="r2")
    assert str(info.value) == (
        f"hub model o/n at revision r2 has no safetensors weights (model.safetensors or its "
        f"index) (it holds {names}): dflash2rt loads safetensors only, never pickle weights "
        "(.bin / .pt); use a revision or repository that has safetensors, or convert it")


def test_layout_no_weights_at_all(tmp_path):
    root = _checkpoint(tmp_path / "s", weights=False)
    (root / "x.safetensors").write_bytes(b"")             # not model.safetensors, no index
    (root / "bin").mkdir()
    with pytest.raises(CheckpointError) as info:
        _check(root)
    assert str(info.value) == (
        "hub model o/n has no safetensors weights (model.safetensors or its index): dflash2rt "
        "loads safetensors only, never pickle weights (.bin / .pt); use a revision or "
        "repository that has safetensors, or convert it")
    with pytest.raises(ModelNotFoundError) as info:
        _check(root, off=True)
    assert str(info.value) == str(hub.not_cached("o/n", None, True, "model.safetensors"))


def test_layout_pair_checks_target_and_draft_each(tmp_path):
    root = tmp_path / "s"
    _checkpoint(root / "target")
    _checkpoint(root / "draft")
    _check(root)                                           # no config.json at the top needed
    (root / "draft" / "model.safetensors").unlink()
    with pytest.raises(ModelNotFoundError) as info:
        _check(root, off=True)
    assert str(info.value) == str(hub.not_cached("o/n", None, True, "draft/model.safetensors"))
    _check(root, weights=False)
    (root / "target" / "config.json").unlink()
    with pytest.raises(CheckpointError, match="has no target/config.json: it is not"):
        _check(root, weights=False)
    only = tmp_path / "t"
    _checkpoint(only / "target")                           # a pair without a draft
    _check(only)
    lone = tmp_path / "d"                                  # draft/ alone is no pair
    _checkpoint(lone / "draft")
    with pytest.raises(CheckpointError, match=r"has no config\.json: it is not"):
        _check(lone)


# ---------------------------------------------------------------- remote headers

class _Info:
    def __init__(self, shape, dtype):
        self.shape, self.dtype = shape, dtype


def test_file_headers_reads_shapes_and_dtypes(env):
    calls = []

    class Api:
        def parse_safetensors_file_metadata(self, repo_id, filename, revision=None):
            calls.append((repo_id, filename, revision))
            return type("M", (), {"tensors": {"a": _Info([2, 3], "F32"), "b": _Info([], "BF16")}})
    env.setattr(huggingface_hub, "HfApi", Api)
    assert hub.file_headers("o/n", "x.safetensors", "c0") == {"a": ((2, 3), "F32"),
                                                                "b": ((), "BF16")}
    assert calls == [("o/n", "x.safetensors", "c0")]


@pytest.mark.parametrize("exc, kind, message", [
    ("EntryNotFoundError", CheckpointError,
     "hub model o/n has no x.safetensors: dflash2rt loads safetensors only (model.safetensors "
     "or model.safetensors.index.json), never pickle weights (.bin / .pt)"),
    (OSError("down"), ModelNotFoundError,
     "cannot read the header of x.safetensors in hub model o/n: OSError: down"),
    ("HfHubHTTPError", ModelNotFoundError,
     "cannot read the header of x.safetensors in hub model o/n: HfHubHTTPError: boom"),
])
def test_file_headers_errors(env, exc, kind, message):
    error = _hub_error(exc) if isinstance(exc, str) else exc

    class Api:
        def parse_safetensors_file_metadata(self, *a, **k):
            raise error
    env.setattr(huggingface_hub, "HfApi", Api)
    with pytest.raises(kind) as info:
        hub.file_headers("o/n", "x.safetensors", None)
    assert str(info.value) == message


# ---------------------------------------------------------------- Located, revisions

def test_located_fields(tmp_path):
    snap = tmp_path / "snapshots" / "abc123"
    loc = hub.Located(snap / "target", "o/n", "o/n", snap, "v1")
    assert loc.commit == "abc123"
    assert loc.repo_path("model.safetensors") == "target/model.safetensors"
    sub = loc.sub("x")
    assert sub == hub.Located(snap / "target" / "x", "o/n", "o/n", snap, "v1")
    assert hub.Located(tmp_path, "d").commit is None
    import dataclasses
    with pytest.raises(dataclasses.FrozenInstanceError):
        loc.path = tmp_path                                  # frozen: sub() makes a new one
    assert {loc, sub, hub.Located(snap / "target", "o/n", "o/n", snap, "v1")} == {loc, sub}


@pytest.mark.parametrize("revision, ok", [
    (None, True), ("main", True), (" v1 ", True), ("a" * 40, True), ("", False), (" ", False),
    ("\t\n", False), (5, False), (b"main", False), (["main"], False), (False, False),
])
def test_check_revision_table(revision, ok):
    if ok:
        hub.check_revision(revision, "draft")
        return
    with pytest.raises(InvalidInputError) as info:
        hub.check_revision(revision, "draft")
    assert str(info.value) == ("the draft's revision must be a branch, tag or commit name "
                               f"(None: main), got {revision!r}")


# ---------------------------------------------------------------- locate

@pytest.fixture
def fake_snapshot(env, tmp_path, monkeypatch):
    """hub.snapshot replaced: ids in ``box`` map to directories; others raise not-found."""
    box = {"calls": []}

    def fake(repo_id, revision=None, weights=True):
        box["calls"].append((repo_id, revision, weights))
        if repo_id in box:
            return box[repo_id]
        raise ModelNotFoundError(f"nothing for {repo_id}")
    monkeypatch.setattr(hub, "snapshot", fake)
    monkeypatch.chdir(tmp_path)
    return box


@pytest.mark.parametrize("spec", [None, 5, b"x", ["a"], ("a", "b")])
def test_locate_refuses_non_names(fake_snapshot, spec):
    with pytest.raises(InvalidInputError, match="must be paths or hub ids"):
        hub.locate(spec)


@pytest.mark.parametrize("spec", ["", "  ", "\n"])
def test_locate_refuses_blank_names(fake_snapshot, spec):
    with pytest.raises(InvalidInputError, match="the target is an empty string"):
        hub.locate(spec, what="target")


def test_locate_a_hub_id(fake_snapshot, tmp_path):
    fake_snapshot["o/n"] = tmp_path / "snap"
    loc = hub.locate("o/n", "v1", "draft", weights=False)
    assert loc == hub.Located(tmp_path / "snap", "o/n", "o/n", tmp_path / "snap", "v1")
    assert fake_snapshot["calls"] == [("o/n", "v1", False)]
    hub.locate("o/n")
    assert fake_snapshot["calls"][-1] == ("o/n", None, True)


def test_locate_a_missing_hub_id_for_model_and_for_draft(fake_snapshot):
    from dflash2rt.bundled import bundled_models
    names = ", ".join(bundled_models()) or "none"
    with pytest.raises(ModelNotFoundError) as info:
        hub.locate("o/absent")
    assert str(info.value) == (f"no such model directory 'o/absent' (and no bundled model of "
                               f"that name; bundled: {names}); as a hub id: nothing for o/absent")
    with pytest.raises(ModelNotFoundError) as info:
        hub.locate("o/absent", what="draft")
    assert str(info.value) == ("no such draft directory 'o/absent'; as a hub id: nothing for "
                               "o/absent")


def test_locate_keeps_a_missing_extra_typed(fake_snapshot, monkeypatch):
    def fail(*a, **k):
        raise MissingExtraError("need the extra")
    monkeypatch.setattr(hub, "snapshot", fail)
    with pytest.raises(MissingExtraError, match="as a hub id: need the extra"):
        hub.locate("o/n", what="target")


def test_locate_local_paths(fake_snapshot, tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "f").write_text("x")
    assert hub.locate("d") == hub.Located(Path("d"), "d")
    assert hub.locate(tmp_path / "d", what="draft") == hub.Located(tmp_path / "d",
                                                                   str(tmp_path / "d"))
    with pytest.raises(InvalidInputError) as info:
        hub.locate("f")
    assert str(info.value) == "model 'f' is a file; give a directory with target/ and draft/"
    with pytest.raises(InvalidInputError) as info:
        hub.locate("f", what="draft")
    assert str(info.value) == "draft 'f' is a file; give a directory"
    with pytest.raises(InvalidInputError) as info:
        hub.locate("nowhere", what="target")
    assert str(info.value) == "no such target directory 'nowhere'"
    with pytest.raises(InvalidInputError, match="no such model directory 'nowhere'"):
        hub.locate("nowhere")
    with pytest.raises(InvalidInputError) as info:
        hub.locate("d", revision="main")
    assert str(info.value) == ("revision 'main' applies to hub ids; 'd' is not one (a local "
                               "path or a bundled name)")
    with pytest.raises(InvalidInputError, match="revision must be"):
        hub.locate("d", revision="")
    assert fake_snapshot["calls"] == []


def test_locate_a_bundled_name(fake_snapshot):
    from dflash2rt.bundled import bundled_models, bundled_path
    for name in bundled_models():
        assert hub.locate(name) == hub.Located(bundled_path(name), name)


# ---------------------------------------------------------------- locate_pair

def test_locate_pair_layouts(fake_snapshot, tmp_path):
    both = tmp_path / "both"
    _checkpoint(both / "target")
    _checkpoint(both / "draft")
    t, d, name = hub.locate_pair(str(both))
    assert (t.path, d.path, name) == (both / "target", both / "draft", "both")
    only = tmp_path / "only"
    _checkpoint(only / "target")
    t, d, name = hub.locate_pair(only)
    assert (t.path, d, name) == (only / "target", None, "only")
    one = _checkpoint(tmp_path / "one")
    t, d, name = hub.locate_pair(one)
    assert (t.path, d, name) == (one, None, "one")
    other = _checkpoint(tmp_path / "other")
    t, d, name = hub.locate_pair(both, draft=other)
    assert (t.path, d.path, name) == (both / "target", other, "both")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InvalidInputError) as info:
        hub.locate_pair(empty)
    assert str(info.value) == (f"{empty} has no target/ directory (expected target/ and "
                               "draft/, or a checkpoint's config.json)")


def test_locate_pair_by_hub_ids_is_named_by_the_id(fake_snapshot, tmp_path):
    snap = tmp_path / "snap"
    _checkpoint(snap / "target")
    _checkpoint(snap / "draft")
    fake_snapshot["o/pair"] = snap
    fake_snapshot["o/draft"] = _checkpoint(tmp_path / "dsnap")
    t, d, name = hub.locate_pair("o/pair", revision="r1")
    assert name == "o/pair" and fake_snapshot["calls"] == [("o/pair", "r1", True)]
    assert t == hub.Located(snap / "target", "o/pair", "o/pair", snap, "r1")
    assert d == hub.Located(snap / "draft", "o/pair", "o/pair", snap, "r1")
    t, d, name = hub.locate_pair("o/pair", draft="o/draft", draft_revision="r2", weights=False)
    assert d == hub.Located(tmp_path / "dsnap", "o/draft", "o/draft", tmp_path / "dsnap", "r2")
    assert fake_snapshot["calls"][-2:] == [("o/pair", None, False), ("o/draft", "r2", False)]
    t, d, name = hub.locate_pair(("o/draft", "o/pair"), revision="r3", draft_revision="r4")
    assert name == "o/draft" and t.revision == "r3" and d.revision == "r4"
    assert (t.path, d.path) == (tmp_path / "dsnap", snap)


def test_locate_pair_tuples(fake_snapshot, tmp_path):
    a, b = _checkpoint(tmp_path / "a"), _checkpoint(tmp_path / "b")
    t, d, name = hub.locate_pair((a, b))
    assert (t.path, d.path, name) == (a, b, "a")
    t, d, name = hub.locate_pair((str(b), None))
    assert (t.path, d, name) == (b, None, "b")
    for model, draft, revision, match in [
        ((a,), None, None, "must be \\(target_dir, draft_dir\\)"),
        ((a, b, b), None, None, "must be \\(target_dir, draft_dir\\)"),
        ((), None, None, "must be \\(target_dir, draft_dir\\)"),
        ((None, b), None, None, "needs a target_dir"),
        ((a, b), b, None, "not both"),
        ((a, None), b, None, "not both"),
        ((a, None), None, "r", "the \\(target, draft\\) tuple has no draft"),
    ]:
        with pytest.raises(InvalidInputError, match=match):
            hub.locate_pair(model, draft, draft_revision=revision)
    with pytest.raises(InvalidInputError) as info:
        hub.locate_pair((a, "nowhere"))
    assert str(info.value) == "no such draft directory 'nowhere'"
    with pytest.raises(InvalidInputError) as info:
        hub.locate_pair(("nowhere", b))
    assert str(info.value) == "no such target directory 'nowhere'"


def test_locate_pair_argument_checks(fake_snapshot, tmp_path):
    a = _checkpoint(tmp_path / "a")
    with pytest.raises(InvalidInputError) as info:
        hub.locate_pair(a, draft_revision="r")
    assert str(info.value) == "draft_revision applies to a draft hub id; give draft too"
    for bad in (None, 5, [str(a)]):
        with pytest.raises(InvalidInputError, match="model must be a bundled name"):
            hub.locate_pair(bad)
    with pytest.raises(InvalidInputError, match="the model's revision must be"):
        hub.locate_pair((a, None), revision="")
    with pytest.raises(InvalidInputError, match="the draft's revision must be"):
        hub.locate_pair(a, draft=a, draft_revision=" ")
    assert fake_snapshot["calls"] == []
