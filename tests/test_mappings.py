"""Mappings fixtures make trivial: unordered reduced vocabularies, revisions, every rank cell."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import pytest
import torch

import dflash2rt
from dflash2rt import get_backend
from dflash2rt.api import resolve_model
from dflash2rt.cli import main
from dflash2rt.distributed import consensus
from dflash2rt.engine.engine import Engine
from dflash2rt.engine.request import Request, SamplingParams
from dflash2rt.errors import DistributedError, InvalidInputError
from dflash2rt.models.draft import DraftModel
from dflash2rt.models.draft_loader import check_vocab_mapping, load_draft, save_draft
from dflash2rt.models.pair import ModelPair

from hub_cache import add_repo, files_of
from tiny_models import VOCAB, save_pair_dir, tiny_pair

# ---- a reduced draft vocabulary in no ascending order ------------------------------------
KEPT = torch.randperm(VOCAB, generator=torch.Generator().manual_seed(0))[:40]   # draft → target
assert not bool((KEPT[1:] > KEPT[:-1]).all())


def reduced(pair: ModelPair, ids: torch.Tensor, fmt: str = "") -> DraftModel:
    """``pair``'s draft with its own head over the target ids ``ids`` (draft id i is target id
    ids[i]: d2t[i] = ids[i] - i), the head's rows the target's rows of those ids."""
    cfg = dataclasses.replace(pair.draft.cfg, draft_vocab_size=len(ids), own_head=True,
                              source_format=fmt or pair.draft.cfg.source_format)
    d = DraftModel(cfg).to(pair.dtype)
    d.load_state_dict(pair.draft.state_dict(), strict=False)
    with torch.no_grad():
        d.lm_head.weight.copy_(pair.target.lm_head.weight[ids])
        d.d2t.copy_(ids - torch.arange(len(ids)))
        d.t2d.zero_()[ids] = True
    return d.eval().requires_grad_(False)


def test_a_non_ascending_mapping_places_each_logit_at_its_target_id():
    """The permuted mapping is valid, and its logits are exactly the ascending one's (the same
    ids, the head's rows in another order): the target head's logit at each kept id, −inf at
    every other."""
    pair = tiny_pair("dflash2", block=4, seed=2)
    perm, ascending = reduced(pair, KEPT), reduced(pair, KEPT.sort().values)
    check_vocab_mapping(perm.d2t, perm.t2d, perm.cfg, "permuted")
    h = torch.randn(2, 3, pair.target.cfg.hidden_size, dtype=pair.dtype)
    got = perm.logits(h, pair.target)                  # (a head's row order may round apart)
    torch.testing.assert_close(got, ascending.logits(h, pair.target), rtol=1e-12, atol=1e-12)
    want = torch.full_like(got, float("-inf"))
    want[..., KEPT] = pair.target.lm_head(h)[..., KEPT]
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert torch.equal(torch.isinf(got), torch.isinf(want))


def test_a_non_ascending_mapping_proposes_what_the_ascending_one_does():
    """Sampled speculative decoding with the two drafts: the same proposals, so the same tokens
    and acceptance (a mapping read in ascending order proposes other tokens at T = 1)."""
    pair = tiny_pair("dflash2", block=4, seed=2)
    reqs = [Request((3, 9, 4), SamplingParams(max_new_tokens=24, temperature=1.0, seed=s), key=s)
            for s in range(3)]
    runs = []
    for ids in (KEPT, KEPT.sort().values):
        eng = Engine(ModelPair(pair.target, reduced(pair, ids)), get_backend("cpu"))
        out, stats = eng.generate(reqs, block_size=4)
        runs.append(([o.token_ids for o in out], stats.num_accepted_tokens))
    assert runs[0] == runs[1] and runs[0][1] > 0


def test_a_non_ascending_mapping_survives_save_and_load(tmp_path):
    pair = tiny_pair("dflash1", block=4, seed=2)
    d = reduced(pair, KEPT, "speculators")
    save_draft(d, tmp_path / "draft")
    back, cfg = load_draft(tmp_path / "draft", pair.dtype)
    assert cfg.reduced_vocab and torch.equal(back.d2t, d.d2t) and torch.equal(back.t2d, d.t2d)
    h = torch.randn(1, 3, pair.target.cfg.hidden_size, dtype=pair.dtype)
    torch.testing.assert_close(back.logits(h, pair.target), d.logits(h, pair.target), rtol=0,
                               atol=0)


# ---- a draft hub repository with two revisions -------------------------------------------
TARGET, DRAFT = "tiny-org/tiny-target", "tiny-org/tiny-target-dflash2-b8"


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """Target and draft repositories with two commits each: seed 1's tagged v1, seed 0's at
    main (added last)."""
    root = tmp_path_factory.mktemp("hub")
    dirs = {"old": save_pair_dir(root / "old", tiny_pair(seed=1, dtype=torch.float32)),
            "new": save_pair_dir(root / "new", tiny_pair(dtype=torch.float32))}
    cache, commits = root / "cache", {}
    for age, refs in (("old", ("v1",)), ("new", ("main",))):
        commits["t_" + age] = add_repo(cache, TARGET, files_of(dirs[age] / "target"), refs=refs)
        commits["d_" + age] = add_repo(cache, DRAFT, files_of(dirs[age] / "draft"), refs=refs)
    return {"cache": cache, "commits": commits, **dirs}


@pytest.fixture
def offline(hub, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(hub["cache"]))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return hub


@pytest.mark.parametrize("kw, target, draft", [
    (dict(), "t_new", "d_new"),
    (dict(draft_revision="v1"), "t_new", "d_old"),
    (dict(draft_revision="COMMIT d_old"), "t_new", "d_old"),
    (dict(revision="v1"), "t_old", "d_new"),                 # the target's revision only
    (dict(revision="v1", draft_revision="main"), "t_old", "d_new"),
    (dict(revision="main", draft_revision="v1"), "t_new", "d_old"),
])
def test_each_revision_pins_its_own_repository(offline, kw, target, draft):
    c = offline["commits"]
    kw = {k: c[v.split()[1]] if v.startswith("COMMIT ") else v for k, v in kw.items()}
    for pair in (resolve_model(TARGET, draft=DRAFT, **kw), resolve_model((TARGET, DRAFT), **kw)):
        assert pair.target.source_dir.endswith(c[target]), (kw, pair.target.source_dir)
        assert pair.draft.source_dir.endswith(c[draft]), (kw, pair.draft.source_dir)


def test_a_draft_revision_needs_a_draft(offline):
    for model, draft in (((TARGET, None), None), (TARGET, None)):
        with pytest.raises(InvalidInputError, match="draft_revision applies to a draft hub id"):
            resolve_model(model, draft=draft, draft_revision="v1")


def test_the_draft_revision_decodes_with_that_draft(offline, capsys):
    """T = 1 speculative tokens (they depend on the draft): the hub ids at draft revision v1
    decode as the local new target with the old draft, through run and the CLI."""
    kw = dict(prompts=[[3, 17, 5]], max_new_tokens=16, block_size=4, temperature=1.0, seed=5)
    old = dflash2rt.run((offline["new"] / "target", offline["old"] / "draft"), "cpu", **kw)
    new = dflash2rt.run((offline["new"] / "target", offline["new"] / "draft"), "cpu", **kw)
    assert old.tokens != new.tokens
    assert dflash2rt.run(TARGET, "cpu", draft=DRAFT, draft_revision="v1", **kw).tokens == old.tokens
    assert main(["run", "--backend", "cpu", "--model", TARGET, "--draft", DRAFT,
                 "--draft-revision", "v1", "--prompt-file", _prompt_file(offline), "--json",
                 "--max-new-tokens", "16", "--block-size", "4", "--temperature", "1",
                 "--seed", "5"]) == 0
    assert json.loads(capsys.readouterr().out)["tokens"] == old.tokens


def _prompt_file(hub) -> str:
    f = hub["cache"].parent / "prompts.json"
    f.write_text("[[3, 17, 5]]")
    return str(f)


# ---- tensor-parallel ranks that disagree beyond row 0's tokens ---------------------------
HOST = [[2, 0, 11, 4, 7, 1, 0x3F800000, 5],          # accepted, flags, B = 4 tokens, logprobs
        [0, 0, 9, 9, 9, 9, 0x3F000000, 2],
        [3, 1, 6, 2, 8, 3, 0x3E800000, 7]]


def _step_check(monkeypatch, other: list) -> consensus.StepCheck:
    """Rank 0's StepCheck, the all-reduce answered as if a rank 1 had committed ``other``."""
    def all_reduce(both, op=None, group=None):
        h = consensus.digest(other)
        both.copy_(torch.maximum(both, torch.tensor([h, -h], dtype=torch.int64)))
    monkeypatch.setattr(consensus.dist, "all_reduce", all_reduce)
    return consensus.StepCheck(SimpleNamespace(rank=0, host_group=None))


def test_the_step_check_passes_ranks_that_agree(monkeypatch):
    check = _step_check(monkeypatch, [list(r) for r in HOST])
    check(HOST)
    check(HOST)
    assert check.steps == 2


@pytest.mark.parametrize("row", range(len(HOST)))
@pytest.mark.parametrize("col", range(len(HOST[0])))
def test_the_step_check_sees_any_cell_that_differs(monkeypatch, row, col):
    """Every cell: a later row, the accepted count, the flags, a token, a packed logprob."""
    other = [list(r) for r in HOST]
    other[row][col] += 1
    with pytest.raises(DistributedError, match="ranks disagree on the tokens committed at step 0"):
        _step_check(monkeypatch, other)(HOST)
