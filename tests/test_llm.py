"""The vLLM-shaped API: ``dflash2rt.LLM`` (load once, ``generate`` many times) and
``run(..., sampling_params=...)``, over the same engine as ``run``'s keywords."""

from __future__ import annotations

import pytest
import torch

import dflash2rt
from dflash2rt import api, llm as llm_mod
from dflash2rt.engine.request import SamplingParams
from dflash2rt.engine.policy.adaptive import AdaptivePolicy
from dflash2rt.errors import ConflictingArgumentsError, DFlash2Error, InvalidInputError
from dflash2rt.models import resolve
from dflash2rt.watermark import WatermarkKey

from tiny_models import save_pair_dir, tiny_pair

MODEL = "stdlib-code"
PROMPTS = ["import os\n", "def f(x):", [702, 605, 199]]     # the last: "import os\n"'s ids


@pytest.fixture(scope="module")
def llm():
    with dflash2rt.LLM(MODEL, "cpu") as llm:
        yield llm


def tokens(outs):
    return [o.outputs[0].token_ids for o in outs]


def test_top_level_names():
    assert dflash2rt.SamplingParams is SamplingParams and dflash2rt.LLM is llm_mod.LLM
    assert {"LLM", "SamplingParams"} <= set(dflash2rt.__all__)


def test_greedy_generate_equals_run(llm):
    ref = dflash2rt.run(MODEL, "cpu", prompts=PROMPTS, max_new_tokens=12, block_size=4)
    streamed: dict[int, list[int]] = {}
    outs = llm.generate(PROMPTS, SamplingParams(max_new_tokens=12), block_size=4,
                        on_tokens=lambda i, ids: streamed.setdefault(i, []).extend(ids))
    assert tokens(outs) == ref.tokens and len(outs) == 3
    assert [o.outputs[0].text for o in outs] == ref.texts
    assert [o.outputs[0].finish_reason for o in outs] == [o.finish_reason for o in ref.outputs]
    assert [streamed[i] for i in range(3)] == ref.tokens
    assert [o.prompt for o in outs] == ["import os\n", "def f(x):", None]
    assert outs[2].prompt_token_ids == [702, 605, 199] == outs[0].prompt_token_ids
    assert [o.request_id for o in outs] == ["0", "1", "2"] and all(o.finished for o in outs)
    c = outs[0].outputs[0]
    assert c.index == 0 and c.logprobs is None and c.cumulative_logprob is None
    s = llm.last_stats
    assert s.mode == "spec" and s.requests == 3 and s.block_sizes == {4: s.steps}
    # one SamplingParams through run(), adaptive (a fixed cost table: no timing) and
    # target-only: greedy output is the same
    via = dflash2rt.run(MODEL, "cpu", prompts=PROMPTS, block_size=4,
                        sampling_params=SamplingParams(max_new_tokens=12))
    assert via.tokens == ref.tokens
    llm.engine.policy = AdaptivePolicy((1, 2, 4, 8), costs={1: 1.0, 2: 1.3, 4: 1.5, 8: 2.0})
    assert tokens(llm.generate(PROMPTS, SamplingParams(max_new_tokens=12))) == ref.tokens
    assert llm.last_stats.adaptive
    assert tokens(llm.generate(PROMPTS, SamplingParams(max_new_tokens=12), spec=False)) \
        == ref.tokens
    assert llm.last_stats.mode == "target-only"
    # a single string prompt; no SamplingParams: the defaults (greedy, 64 new tokens)
    one = llm.generate("def f(x):", SamplingParams(max_new_tokens=12), block_size=4)
    assert len(one) == 1 and tokens(one) == [ref.tokens[1]]
    assert api.params_list(None, 2) == [SamplingParams()] * 2


def test_per_prompt_sampling_params(llm):
    greedy = SamplingParams(max_new_tokens=6)
    sampled = SamplingParams(max_new_tokens=11, temperature=0.8, top_k=20, seed=3)
    outs = llm.generate(["import os\n", "def f(x):"], [greedy, sampled], block_size=4)
    # with a fixed block a request's tokens depend on its prompt and params only
    first = dflash2rt.run(MODEL, "cpu", prompts=["import os\n"], max_new_tokens=6, block_size=4)
    second = dflash2rt.run(MODEL, "cpu", prompts=["def f(x):"], max_new_tokens=11,
                           temperature=0.8, top_k=20, seed=3, block_size=4)
    assert tokens(outs) == [first.tokens[0], second.tokens[0]]
    assert len(first.tokens[0]) <= 6 and len(second.tokens[0]) <= 11
    assert llm.generate(["import os\n", "def f(x):"], (greedy, sampled), block_size=4)[1] \
        .outputs[0].token_ids == second.tokens[0]                  # a tuple too
    via = dflash2rt.run(MODEL, "cpu", prompts=["import os\n", "def f(x):"], block_size=4,
                        sampling_params=[greedy, sampled])
    assert via.tokens == tokens(outs)
    # the watermark passes through as in run()
    key = WatermarkKey(bytes(range(32)))
    marked = llm.generate(["def f(x):"], [sampled], block_size=4, watermark=key)
    assert llm.last_stats.watermarked
    assert tokens(marked) == dflash2rt.run(MODEL, "cpu", prompts=["def f(x):"], block_size=4,
                                           sampling_params=sampled, watermark=key).tokens


def test_logprobs_are_vllm_shaped(llm):
    ref = dflash2rt.run(MODEL, "cpu", prompts=["def f(x):"], max_new_tokens=8, logprobs=3,
                        block_size=4).outputs[0]
    c = llm.generate(["def f(x):"], SamplingParams(max_new_tokens=8, logprobs=3),
                     block_size=4)[0].outputs[0]
    assert c.token_ids == ref.token_ids and len(c.logprobs) == len(ref.token_ids)
    assert c.cumulative_logprob == pytest.approx(sum(ref.logprobs))
    for t, lp, top, entry in zip(ref.token_ids, ref.logprobs, ref.top_logprobs, c.logprobs):
        assert next(iter(entry)) == t and entry[t].logprob == lp      # the token comes first
        ranks = {k: i + 1 for i, (k, _) in enumerate(sorted(top.items(), key=lambda kv: -kv[1]))}
        assert {k: e.rank for k, e in entry.items()} == {t: None, **ranks}   # 1 = most likely
        assert entry[t].decoded_token == llm.tokenizer.decode([t])


def test_regex_with_sampling_params(llm):
    pattern = r"[a-z]+\(x\)"
    ref = dflash2rt.run(MODEL, "cpu", prompts=["def f(x):"], max_new_tokens=12, regex=pattern,
                        block_size=4)
    via = dflash2rt.run(MODEL, "cpu", prompts=["def f(x):"], regex=pattern, block_size=4,
                        sampling_params=SamplingParams(max_new_tokens=12))
    outs = llm.generate(["def f(x):"], SamplingParams(
        max_new_tokens=12, constraint=llm.regex_constraint(pattern)), block_size=4)
    assert via.tokens == ref.tokens == tokens(outs)
    with pytest.raises(ConflictingArgumentsError, match="constraint"):
        dflash2rt.run(MODEL, "cpu", prompts=["a"], regex="[0-9]+", sampling_params=SamplingParams(
            constraint=llm.regex_constraint(pattern)))


def test_one_load_for_many_generate_calls(monkeypatch, tmp_path):
    root = save_pair_dir(tmp_path, tiny_pair(dtype=torch.float32))   # a fresh path: no cache
    loads, engines = [], []
    real_load, real_engine = resolve.load_pair, llm_mod.Engine

    class CountingEngine(real_engine):
        def __init__(self, *args, **kwargs):
            engines.append(self)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(resolve, "load_pair", lambda *a: loads.append(a) or real_load(*a))
    monkeypatch.setattr(llm_mod, "Engine", CountingEngine)
    llm = dflash2rt.LLM(root, "cpu")
    first = llm.generate(["abc"], SamplingParams(max_new_tokens=6), block_size=4)
    second = llm.generate(["def f(x):", "abc"], SamplingParams(max_new_tokens=6), block_size=4)
    assert len(loads) == 1 and engines == [llm.engine]
    assert second[1].outputs[0].token_ids == first[0].outputs[0].token_ids
    assert llm.last_stats.requests == 2
    llm.close()
    llm.close()                                                    # idempotent
    with pytest.raises(DFlash2Error, match="closed"):
        llm.generate(["abc"])
    with dflash2rt.LLM(root, "cpu") as again:                      # the cache: no second load
        assert again.generate([[3, 4]], SamplingParams(max_new_tokens=3))[0].prompt is None
    assert again.engine is None and len(loads) == 1


@pytest.mark.parametrize("kw", [dict(temperature=0.5), dict(temperature=0.0),
                                dict(max_new_tokens=64), dict(stop="x"), dict(logprobs=None),
                                dict(seed=1, top_k=5), dict(constraint=None)])
def test_keywords_and_sampling_params_conflict(kw):
    with pytest.raises(ConflictingArgumentsError, match="not both") as err:
        dflash2rt.run(MODEL, "cpu", prompts=["a"], sampling_params=SamplingParams(), **kw)
    assert all(name in str(err.value) for name in kw)
    assert issubclass(ConflictingArgumentsError, InvalidInputError)


def test_wrong_lengths_and_types(llm):
    sp = SamplingParams(max_new_tokens=4)
    with pytest.raises(InvalidInputError, match="2 entries for 3 prompts"):
        llm.generate(["a", "b", "c"], [sp, sp])
    with pytest.raises(InvalidInputError, match="3 entries for 1 prompt:"):
        llm.generate("a", [sp, sp, sp])
    with pytest.raises(InvalidInputError, match="0 entries for 1 prompt"):
        llm.generate("a", [])
    with pytest.raises(InvalidInputError, match="2 entries for 1 prompt"):
        dflash2rt.run(MODEL, "cpu", prompts=["a"], sampling_params=[sp, sp])
    with pytest.raises(InvalidInputError, match=r"sampling_params\[1\] is dict"):
        llm.generate(["a", "b"], [sp, {"temperature": 0.0}])
    with pytest.raises(InvalidInputError, match="got dict"):
        llm.generate(["a"], {"max_new_tokens": 3})
