"""The bundled stdlib-code pair: loads, fits, is small, its held-out prompts are held out, and it is lossless."""

from __future__ import annotations

import json

import pytest
import torch

from dflash2rt import get_backend
from dflash2rt.bundled import bundled_models, bundled_path
from dflash2rt.engine.engine import Engine
from dflash2rt.engine.request import Request, SamplingParams
from dflash2rt.errors import InvalidInputError
from dflash2rt.models.draft_config import DraftConfig
from dflash2rt.models.hf_loader import read_config
from dflash2rt.models.pair import load_pair
from dflash2rt.train.corpus import is_heldout, list_files, stdlib_root

NAME = "stdlib-code"


@pytest.fixture(scope="module")
def pair():
    root = bundled_path(NAME)
    return load_pair(root / "target", root / "draft")


@pytest.fixture(scope="module")
def prompts():
    return json.loads((bundled_path(NAME) / "heldout_prompts.json").read_text(encoding="utf-8"))


def test_listed_and_unknown_name_lists_available():
    assert NAME in bundled_models()
    with pytest.raises(InvalidInputError, match=NAME):
        bundled_path("no-such-model")


def test_model_dir_takes_a_directory_or_a_bundled_name(tmp_path):
    from dflash2rt.bundled import model_dir

    assert model_dir(tmp_path) == tmp_path and model_dir(str(tmp_path)) == tmp_path
    assert model_dir(NAME) == bundled_path(NAME)
    with pytest.raises(InvalidInputError, match=NAME):
        model_dir(tmp_path / "missing")


def test_loads_as_float32_and_draft_fits_target(pair):
    assert pair.dtype == torch.float32 and pair.tokenizer is not None
    cfg = pair.draft.cfg
    cfg.check_target(pair.target.cfg)
    assert cfg.variant == "dflash2" and cfg.block_size == 8
    assert cfg.mask_token_id not in pair.tokenizer.encode("x = '<|mask|>'\n")
    assert pair.eos_token_ids and cfg.mask_token_id not in pair.eos_token_ids
    assert DraftConfig.from_dict(read_config(bundled_path(NAME) / "draft")) == cfg


def test_total_size_at_most_16_mb():
    root = bundled_path(NAME)
    total = sum(f.stat().st_size for d in ("target", "draft") for f in (root / d).iterdir())
    assert total <= 16 * 2**20


def test_heldout_prompts_come_from_heldout_files(prompts, pair):
    assert 16 <= len(prompts) <= 32
    files = set(list_files(stdlib_root()))
    for p in prompts:
        assert is_heldout(p["file"])
        assert pair.tokenizer.encode(p["prompt"]) == p["prompt_ids"]
        if p["file"] in files:        # the same Python version as the one the pair was made on
            assert p["prompt"] in (stdlib_root() / p["file"]).read_text(encoding="utf-8")


def test_greedy_spec_equals_target_only_on_heldout(pair, prompts):
    engine = Engine(pair, get_backend("cpu"))
    reqs = [Request(tuple(p["prompt_ids"]), SamplingParams(max_new_tokens=24, ignore_eos=True))
            for p in prompts[:2]]
    for req in reqs:
        (spec,), stats = engine.generate([req], spec=True)
        (ref,), _ = engine.generate([req], spec=False)
        assert spec.token_ids == ref.token_ids
        assert stats.tau > 1.0


def test_transformers_reads_the_target(pair, prompts):
    transformers = pytest.importorskip("transformers")
    root = bundled_path(NAME) / "target"
    hf = transformers.AutoModelForCausalLM.from_pretrained(root, dtype=torch.float32).eval()
    ids = torch.tensor([prompts[0]["prompt_ids"][:48]])
    with torch.no_grad():
        ref = hf(ids).logits
    from dflash2rt.train.target import lm_logits

    with torch.no_grad():
        got = lm_logits(pair.target, ids)
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
    tok = transformers.AutoTokenizer.from_pretrained(root)
    assert tok.encode(prompts[0]["prompt"]) == prompts[0]["prompt_ids"]
