"""Per sampling parameter on the bundled pair's held-out prompts: greedy speculative
decoding (fixed block and adaptive) returns exactly target-only decoding's tokens, and the
parameter does change the output (so the comparison is not vacuous)."""

from __future__ import annotations

import json

import pytest

from dflash2rt import get_backend
from dflash2rt.bundled import bundled_path
from dflash2rt.engine.engine import Engine
from dflash2rt.engine.request import Request, SamplingParams
from dflash2rt.models.pair import load_pair

PARAMS = {
    "repetition_penalty": dict(repetition_penalty=1.8),
    "frequency_penalty": dict(frequency_penalty=1.5),
    "presence_penalty": dict(presence_penalty=1.5),
    "min_p": dict(min_p=0.2),            # greedy: the argmax survives min-p; still processed
    "logit_bias": dict(logit_bias={220: 4.0}),   # plus −50 on plain decoding's first token
}


@pytest.fixture(scope="module")
def setup():
    root = bundled_path("stdlib-code")
    pair = load_pair(root / "target", root / "draft")
    prompts = json.loads((root / "heldout_prompts.json").read_text(encoding="utf-8"))
    ids = [tuple(pair.tokenizer.encode(p["prompt"])[-64:]) for p in prompts[:3]]
    eng = Engine(pair, get_backend("cpu"))
    plain, _ = eng.generate([Request(p, SamplingParams(max_new_tokens=24)) for p in ids],
                            spec=False)
    return eng, ids, [o.token_ids for o in plain]


@pytest.mark.parametrize("name", list(PARAMS))
def test_greedy_spec_equals_target_only_on_heldout(setup, name):
    eng, ids, plain = setup
    kw = PARAMS[name]
    if name == "logit_bias":
        kw = dict(logit_bias={**kw["logit_bias"], plain[0][0]: -50.0})
    reqs = [Request(p, SamplingParams(max_new_tokens=24, **kw)) for p in ids]
    ref, _ = eng.generate(reqs, spec=False)
    for block in (8, None):
        got, _ = eng.generate(reqs, spec=True, block_size=block)
        assert [o.token_ids for o in got] == [o.token_ids for o in ref], (name, block)
    if name != "min_p":
        assert [o.token_ids for o in ref] != plain, f"{name} changed nothing"


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_draft_side_is_processed_with_the_committed_counts(setup, monkeypatch, temperature):
    """The draft logits go through the request's bias and penalties (committed counts) before
    the selector (``engine.stages.draft_logits``): with −100 on the tokens plain decoding emits
    most, no draft proposes them (an unprocessed draft does, often), and the output still
    equals target-only decoding's at T = 0."""
    eng, ids, plain = setup
    counts: dict[int, int] = {}
    for toks in plain:
        for t in toks:
            counts[t] = counts.get(t, 0) + 1
    banned = sorted(counts, key=lambda t: -counts[t])[:4]
    drafts, real = [], eng.backend.select

    def spy(*args, **kw):
        out = real(*args, **kw)
        drafts.append(out.draft)
        return out
    monkeypatch.setattr(eng.backend, "select", spy)
    reqs = [Request(p, SamplingParams(max_new_tokens=24, temperature=temperature, seed=3,
                                      logit_bias={t: -100.0 for t in banned},
                                      presence_penalty=0.5)) for p in ids]
    got, stats = eng.generate(reqs, spec=True, block_size=8)
    assert drafts and stats.num_draft_tokens > 0
    proposed = {int(t) for d in drafts for t in d.flatten().tolist()}
    assert not proposed & set(banned), f"drafts propose banned tokens {proposed & set(banned)}"
    if temperature == 0:
        ref, _ = eng.generate(reqs, spec=False)
        assert [o.token_ids for o in got] == [o.token_ids for o in ref]
