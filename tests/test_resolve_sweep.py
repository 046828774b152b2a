"""``models.resolve.resolve_model`` against expectations written by hand: a loaded ModelPair
comes back as it is and refuses a draft, a revision or a draft_revision, each alone; and the
per-process cache of loads (``load_pair`` replaced by a recorder, so no weight is read) loads a
checkpoint once while its top-level files stay the same, again when one of them changes or a
setting differs, and keeps the four most recently used pairs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from dflash2rt.errors import InvalidInputError
from dflash2rt.models import resolve as resolve_mod
from dflash2rt.models.resolve import resolve_model

from tiny_models import tiny_pair


@pytest.fixture
def loads(monkeypatch):
    """Every load_pair call, (target, draft, dtype, device, name); each load gives a new object.
    The cache is emptied before and after, so no recorded load outlives the test."""
    calls = []

    def load_pair(target, draft, dtype, device, name):
        calls.append((target, draft, dtype, device, name))
        return object()

    monkeypatch.setattr(resolve_mod, "load_pair", load_pair)
    resolve_mod._load_cached.cache_clear()
    yield calls
    resolve_mod._load_cached.cache_clear()


def _checkpoint(path: Path) -> Path:
    """A directory that names one checkpoint (the target): a config.json at its top level."""
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}", encoding="utf-8")
    return path


def test_a_checkpoint_is_loaded_once_while_its_top_level_files_stay_the_same(tmp_path, loads):
    a = _checkpoint(tmp_path / "a")
    first = resolve_model(a)
    assert resolve_model(a) is first and resolve_model(str(a), "cpu", "auto") is first
    assert loads == [(str(a.resolve()), None, torch.float32, "cpu", "a")]
    (a / "nested").mkdir()
    (a / "nested" / "model.safetensors").write_bytes(b"x")   # below the top level: not read
    assert resolve_model(a) is first and len(loads) == 1
    weights = a / "model.safetensors"
    weights.write_bytes(b"12")                                 # a new top-level file
    second = resolve_model(a)
    assert second is not first and len(loads) == 2
    st = weights.stat()
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))   # same size, newer
    third = resolve_model(a)
    assert third is not second and len(loads) == 3
    weights.write_bytes(b"123")                                # another size, the same time
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert resolve_model(a) is not third and len(loads) == 4


def test_another_dtype_device_or_draft_is_another_load(tmp_path, loads):
    a, d = _checkpoint(tmp_path / "a"), _checkpoint(tmp_path / "d")
    resolve_model(a)
    resolve_model(a, dtype="float64")
    resolve_model(a, torch.device("cpu"), torch.float64)        # the same as the one before
    resolve_model(a, "cpu:0")
    resolve_model(a, draft=d)
    resolve_model((a, d))                                       # the same as the one before
    t, dd = str(a.resolve()), str(d.resolve())
    assert loads == [(t, None, torch.float32, "cpu", "a"), (t, None, torch.float64, "cpu", "a"),
                     (t, None, torch.float32, "cpu:0", "a"), (t, dd, torch.float32, "cpu", "a")]
    (d / "model.safetensors").write_bytes(b"1")                # the draft's files count too
    resolve_model(a, draft=d)
    assert len(loads) == 5


def test_the_cache_keeps_the_four_most_recently_used_pairs(tmp_path, loads):
    dirs = [_checkpoint(tmp_path / f"m{i}") for i in range(5)]
    pairs = [resolve_model(d) for d in dirs[:4]]
    assert all(resolve_model(d) is p for d, p in zip(dirs[:4], pairs)) and len(loads) == 4
    assert resolve_model(dirs[0]) is pairs[0]                   # m1 is now the least recent
    fifth = resolve_model(dirs[4])                              # a fifth: m1 goes
    assert len(loads) == 5
    assert [resolve_model(dirs[k]) is p for k, p in [(0, pairs[0]), (2, pairs[2]),
                                                     (3, pairs[3]), (4, fifth)]] == [True] * 4
    assert resolve_model(dirs[1]) is not pairs[1]
    assert [name for *_, name in loads] == ["m0", "m1", "m2", "m3", "m4", "m1"]


@pytest.fixture(scope="module")
def pair():
    return tiny_pair(dtype=torch.float32)


@pytest.mark.parametrize("kw", [dict(draft="some-draft"), dict(draft=Path("d")),
                                dict(revision="main"), dict(draft_revision="v1"),
                                dict(revision=""), dict(draft_revision=" ")])
def test_a_loaded_pair_refuses_a_draft_or_a_revision_each_alone(pair, loads, kw):
    with pytest.raises(InvalidInputError) as info:
        resolve_model(pair, **kw)
    assert str(info.value) == "a loaded ModelPair takes no draft, revision or draft_revision"
    assert loads == []


def test_a_loaded_pair_comes_back_as_it_is(pair, loads):
    assert resolve_model(pair) is pair
    assert resolve_model(pair, "cpu", "auto", draft=None, revision=None,
                         draft_revision=None) is pair
    assert resolve_model(pair, dtype="float") is pair and loads == []
