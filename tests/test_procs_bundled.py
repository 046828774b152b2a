"""Issue 18, per sampling parameter on the bundled pair's held-out prompts: greedy speculative
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
