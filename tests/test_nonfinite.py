"""Non-finite draft selectors and bad rows: a typed error naming the request and the source, at
the step's one sync, and an engine that stays usable (one test per reported failure; the fuzzing
property is in test_fuzz_weights.py)."""

from __future__ import annotations

import shutil

import pytest
from safetensors.torch import load_file, save_file

import dflash2rt
from dflash2rt import get_backend
from dflash2rt.bundled import bundled_path
from dflash2rt.engine.engine import Engine
from dflash2rt.engine.request import Request, SamplingParams
from dflash2rt.errors import NonFiniteLogitsError
from dflash2rt.models.pair import load_pair

SELECTOR = "candidate_selector."


def _copy_with(tmp_path, edit) -> str:
    """The bundled pair copied to tmp_path with ``edit(draft_tensors)`` applied on disk."""
    root = tmp_path / "pair"
    shutil.copytree(bundled_path("stdlib-code"), root)
    path = root / "draft" / "model.safetensors"
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path)
    return str(root)


def _nan_rows(rows):
    def edit(t):
        t[SELECTOR + "predecessor_codebook"][rows] = float("nan")
    return edit


@pytest.mark.parametrize("edit", [
    lambda t: t[SELECTOR + "predecessor_codebook"].fill_(float("nan")),
    lambda t: t[SELECTOR + "hidden_projection.weight"].fill_(float("nan")),
    lambda t: t[SELECTOR + "successor_codebook"].fill_(float("inf")),
], ids=["predecessor_codebook", "hidden_projection", "successor_codebook_inf"])
@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_nan_selector_raises_naming_the_selector(tmp_path, edit, temperature):
    """At T = 1 this returned one token and stopped ("stop_token"): the NaN draft mass passed
    the q_d <= 0 check and the inverse CDF fell back to index 0 (EOS)."""
    model = _copy_with(tmp_path, edit)
    with pytest.raises(NonFiniteLogitsError, match=r"candidate selector scores of request\(s\) \[0\]"):
        dflash2rt.run(model, "cpu", prompts=["def f(x):"], temperature=temperature,
                      max_new_tokens=32, block_size=4)


def test_a_few_nan_codebook_rows_raise_or_decode_correctly(tmp_path):
    """NaN in the codebook rows of the tokens the clean run emits: the walk reads them. Both
    runs speculate with a fixed block (adaptive calls may plan a call target-only, and at T > 0
    the tokens follow the blocks chosen)."""
    clean = dflash2rt.run("stdlib-code", "cpu", prompts=["def f(x):"], temperature=1.0,
                          max_new_tokens=32, seed=1, block_size=4)
    model = _copy_with(tmp_path, _nan_rows(clean.tokens[0][:4]))
    with pytest.raises(NonFiniteLogitsError, match="candidate selector"):
        dflash2rt.run(model, "cpu", prompts=["def f(x):"], temperature=1.0, max_new_tokens=32,
                      seed=1, block_size=4)


def test_engine_stays_usable_after_a_bad_request():
    """A NaN embedding row poisons only prompts that hold that token: the request fails with its
    index named, and the same engine then decodes a clean prompt exactly as a fresh one does
    (a fixed block: adaptive choices follow a table that learns between calls)."""
    root = bundled_path("stdlib-code")
    pair = load_pair(root / "target", root / "draft")
    good, poisoned = (5, 6, 7, 8), (5, 6, 1999, 8)
    with Engine(pair, get_backend("cpu")) as eng:
        want = eng.generate([Request(good, SamplingParams(max_new_tokens=12, temperature=1.0))],
                            block_size=8)
        weight = dict(pair.target.named_parameters())["model.embed_tokens.weight"]
        saved = weight.data[1999].clone()
        try:
            weight.data[1999] = float("nan")
            for spec in (True, False):
                with pytest.raises(NonFiniteLogitsError, match=r"target logits of request\(s\) \[1\]"):
                    eng.generate([Request(good, SamplingParams(max_new_tokens=12)),
                                  Request(poisoned, SamplingParams(max_new_tokens=12))],
                                 spec=spec)
            got = eng.generate([Request(good, SamplingParams(max_new_tokens=12,
                                                             temperature=1.0))], block_size=8)
        finally:
            weight.data[1999] = saved
    assert got[0][0].token_ids == want[0][0].token_ids
