"""Hub ids as model names (``dflash2rt.models.hub``), with no network: a hub cache written in the
client's own layout (tests/hub_cache.py), HF_HUB_CACHE pointing at it, HF_HUB_OFFLINE=1."""

from __future__ import annotations

import json
import sys

import pytest
import torch

import dflash2rt
from dflash2rt.api import resolve_model
from dflash2rt.cli import main
from dflash2rt.errors import (CheckpointError, InvalidInputError, MissingExtraError,
                              ModelNotFoundError)
from dflash2rt.models import hub

from hub_cache import add_repo, files_of
from tiny_models import save_pair_dir, tiny_pair

TARGET, DRAFT = "tiny-org/tiny-target", "tiny-org/tiny-target-dflash2-b8"
PROMPTS = ["def f(x):", "abc"]


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """Two local pairs (seeds 0 and 1) and a hub cache holding them: TARGET and DRAFT at main
    (seed 0), the seed-1 target as an older commit tagged v1, and a pickle-only repository."""
    root = tmp_path_factory.mktemp("hub")
    new = save_pair_dir(root / "new", tiny_pair(dtype=torch.float32))
    old = save_pair_dir(root / "old", tiny_pair(seed=1, dtype=torch.float32))
    cache = root / "cache"
    commits = {"old": add_repo(cache, TARGET, files_of(old / "target"), refs=("v1",))}
    commits["new"] = add_repo(cache, TARGET, files_of(new / "target"))
    commits["draft"] = add_repo(cache, DRAFT, files_of(new / "draft"))
    add_repo(cache, "tiny-org/pickled", {"config.json": (new / "target/config.json").read_bytes(),
                                         "pytorch_model.bin": b"never unpickled"})
    add_repo(cache, "tiny-org/tiny-pair", files_of(new))          # target/ and draft/ in one
    add_repo(cache, "tiny-org/configs-only", {
        "config.json": (new / "target/config.json").read_bytes()})
    return {"new": new, "old": old, "cache": cache, "commits": commits}


@pytest.fixture
def offline_cache(pairs, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(pairs["cache"]))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return pairs


def test_huggingface_hub_is_installed():
    import huggingface_hub  # noqa: F401 - the dev extra (and transformers) bring it


def test_run_by_hub_ids_matches_the_local_directories(offline_cache):
    kw = dict(prompts=PROMPTS, max_new_tokens=12, block_size=4)
    spec = dflash2rt.run(model=TARGET, draft=DRAFT, backend="cpu", **kw)
    base = dflash2rt.run(model=TARGET, draft=DRAFT, backend="cpu", spec=False, **kw)
    local = dflash2rt.run(offline_cache["new"], "cpu", **kw)
    assert spec.stats.mode != "target-only" and base.stats.mode == "target-only"
    assert spec.tokens == base.tokens == local.tokens
    assert spec.texts == local.texts
    pair = resolve_model(TARGET, draft=DRAFT)
    assert pair.name == TARGET
    assert pair.target.source_dir.endswith(offline_cache["commits"]["new"])
    assert pair.draft.source_dir.endswith(offline_cache["commits"]["draft"])
    # a (target, draft) tuple of hub ids, and a repository holding target/ and draft/
    assert dflash2rt.run((TARGET, DRAFT), "cpu", **kw).tokens == local.tokens
    assert dflash2rt.run("tiny-org/tiny-pair", "cpu", **kw).tokens == local.tokens


def test_cli_run_by_hub_ids(offline_cache, capsys):
    args = ["run", "--backend", "cpu", "--model", TARGET, "--draft", DRAFT, "--prompt", "abc",
            "--max-new-tokens", "8", "--block-size", "4", "--json"]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    local = dflash2rt.run(offline_cache["new"], "cpu", prompts=["abc"], max_new_tokens=8,
                          block_size=4)
    assert out["tokens"] == local.tokens


def test_a_revision_pins_the_snapshot(offline_cache):
    commits = offline_cache["commits"]
    for rev in ("v1", commits["old"]):          # a tag, and a commit hash
        pair = resolve_model(TARGET, revision=rev)
        assert pair.target.source_dir.endswith(commits["old"]) and pair.draft is None
    assert resolve_model(TARGET).target.source_dir.endswith(commits["new"])
    kw = dict(prompts=PROMPTS, max_new_tokens=10, spec=False)
    old = dflash2rt.run(model=TARGET, revision="v1", backend="cpu", **kw)
    assert old.tokens == dflash2rt.run((offline_cache["old"] / "target", None), "cpu",
                                       **kw).tokens
    assert old.tokens != dflash2rt.run(model=TARGET, backend="cpu", **kw).tokens
    pair = resolve_model(TARGET, draft=DRAFT, draft_revision=commits["draft"])
    assert pair.draft.source_dir.endswith(commits["draft"])


def test_a_missing_id_says_how_to_get_it(offline_cache, capsys):
    with pytest.raises(ModelNotFoundError, match=r"tiny-org/absent.*not in the Hugging Face "
                       r"cache.*HF_HUB_OFFLINE.*download tiny-org/absent.*unset HF_HUB_OFFLINE"):
        dflash2rt.run(model="tiny-org/absent", backend="cpu", prompts=["a"])
    with pytest.raises(ModelNotFoundError, match=r"no such draft directory.*download "
                       r"tiny-org/absent-draft"):
        resolve_model(TARGET, draft="tiny-org/absent-draft")
    with pytest.raises(ModelNotFoundError, match=r"at revision v9 .*--revision v9"):
        resolve_model(TARGET, revision="v9")
    # weights not cached (a configs-only snapshot, as `inspect` leaves one)
    with pytest.raises(ModelNotFoundError, match=r"incomplete .*model.safetensors missing"):
        resolve_model("tiny-org/configs-only")
    assert main(["run", "--backend", "cpu", "--model", "tiny-org/absent", "--prompt", "a"]) == 2
    err = capsys.readouterr().err
    assert "ModelNotFoundError" in err and "download tiny-org/absent" in err


def test_pickle_weights_are_refused(offline_cache):
    with pytest.raises(CheckpointError, match=r"tiny-org/pickled.*no safetensors.*"
                       r"pytorch_model.bin.*never pickle"):
        resolve_model("tiny-org/pickled")


def test_without_huggingface_hub_a_hub_id_names_the_extra(offline_cache, monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)      # import fails
    with pytest.raises(MissingExtraError, match=r"pip install 'dflash2rt\[hub\]'"):
        resolve_model(TARGET)
    # local directories never need it
    assert resolve_model(offline_cache["new"]).draft is not None


def test_an_existing_local_path_is_never_a_hub_id(offline_cache, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    save_pair_dir(tmp_path / "tiny-org" / "local-only", tiny_pair(dtype=torch.float32))
    assert not hub.is_hub_id("tiny-org/local-only") and hub.is_hub_id("tiny-org/elsewhere")
    assert resolve_model("tiny-org/local-only").name == "local-only"
    with pytest.raises(InvalidInputError, match="revision 'main' applies to hub ids"):
        resolve_model("tiny-org/local-only", revision="main")


def test_online_fetches_configs_tokenizer_and_safetensors_only(offline_cache, monkeypatch):
    """Online, ``snapshot_download`` is asked for configs, tokenizer and safetensors only
    (its progress bar is its own); the call is intercepted here, no network is used."""
    import huggingface_hub

    calls = []
    real = huggingface_hub.snapshot_download

    def fake(repo_id, **kw):
        calls.append(kw)
        return real(repo_id, **{**kw, "local_files_only": True})

    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    resolve_model(TARGET, draft=DRAFT, revision="main")
    assert [c["local_files_only"] for c in calls] == [False, False]
    assert calls[0]["revision"] == "main" and calls[0]["cache_dir"] == str(offline_cache["cache"])
    patterns = calls[0]["allow_patterns"]
    assert "*.safetensors" in patterns and "*config.json" in patterns
    assert all(p.endswith((".json", ".safetensors")) for p in patterns)     # never .bin / .pt


@pytest.mark.parametrize("revision", ["", "  ", 5, b"main", ["main"]])
def test_a_revision_that_is_not_a_name_is_refused_before_the_cache_is_read(
        revision, offline_cache, monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("the hub cache was read")
    monkeypatch.setattr(hub, "snapshot", refuse)
    match = r"the (model|draft|target)'s revision must be a branch, tag or commit name"
    for call in (lambda: resolve_model(TARGET, revision=revision),
                 lambda: resolve_model(TARGET, draft=DRAFT, draft_revision=revision),
                 lambda: resolve_model((TARGET, DRAFT), revision=revision),
                 lambda: resolve_model(offline_cache["new"], revision=revision)):
        with pytest.raises(InvalidInputError, match=match):
            call()
