"""Every sampling parameter reaches every position the engine emits: the first token (prefill),
target-only steps and speculative steps, greedy and sampled, fixed and adaptive blocks.

The engine's own comparisons (spec == target-only) share prefill and the processing code on
both sides, so a parameter dropped there passes them. Here each emitted token is checked
against an independent float64 decoder: the target's forward over prompt + output so far
(``dflash2rt_conformance.reference.model``), then the processors, temperature, top-k, top-p and
min-p as vLLM defines them (``reference.procs``, ``reference.sampling``). Greedy: every token is
the argmax of the processed logits. Sampled: every token has positive probability under that
law and its reported log-probability (``logprobs_mode="processed"``) is the reference's, and
so are its top-20 alternatives (which are the reference's 20 most likely tokens); ``raw`` is the
unprocessed model's law.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dflash2rt import get_backend
from dflash2rt.engine.engine import Engine
from dflash2rt.engine.request import Request, SamplingParams

from dflash2rt_conformance import models
from dflash2rt_conformance.reference.model import target_forward
from dflash2rt_conformance.reference.procs import process_row
from dflash2rt_conformance.reference.sampling import probs_row

from tiny_models import fixed_policy

PROMPTS = [(3, 17, 5, 17), (40,), (8, 9, 10, 11, 12, 13)]
N_NEW = 14
PARAMS = {
    "bias": dict(logit_bias={7: 3.0, 11: -2.5, 20: 1.5}),
    "repetition": dict(repetition_penalty=1.7),
    "frequency": dict(frequency_penalty=0.9),
    "presence": dict(presence_penalty=1.3),
    "penalties+bias": dict(repetition_penalty=1.3, frequency_penalty=0.4,
                           presence_penalty=0.6, logit_bias={5: 2.0}),
    "top_k": dict(top_k=5),
    "top_p": dict(top_p=0.6),
    "min_p": dict(min_p=0.2),
    "temperature": dict(temperature=0.6),
    "everything": dict(temperature=1.3, top_k=9, top_p=0.9, min_p=0.05,
                       repetition_penalty=1.2, frequency_penalty=0.3, presence_penalty=0.2,
                       logit_bias={2: 1.0}),
}
TOP = 20                                         # the most alternatives a request may ask for
MODES = {"target-only": dict(spec=False), "block-4": dict(block_size=4),
         "adaptive": dict(block_size=None)}


@pytest.fixture(scope="module")
def setup():
    pair = models.tiny_pair(7, torch.float64, block=4)
    engine = Engine(pair, get_backend("cpu"))
    engine.policy = fixed_policy(4)          # adaptive choices from a fixed table
    w, cfg = models.target_reference(pair.target)
    return engine, w, cfg


def _reference_law(w, cfg, prompt, out, kw):
    """The float64 law of the token after prompt + out, and the processed logits."""
    logits = target_forward(w, cfg, list(prompt) + list(out))[0][-1]
    x = process_row(logits, prompt, out, kw.get("repetition_penalty", 1.0),
                    kw.get("frequency_penalty", 0.0), kw.get("presence_penalty", 0.0),
                    kw.get("logit_bias"))
    t = kw.get("temperature", 1.0)
    return probs_row(x, t, kw.get("top_k", 0), kw.get("top_p", 1.0), kw.get("min_p", 0.0)), x, \
        logits


def _run(engine, kw, mode, seed=5, logprobs_mode="processed"):
    reqs = [Request(p, SamplingParams(max_new_tokens=N_NEW, seed=seed + i, ignore_eos=True,
                                      logprobs=TOP, logprobs_mode=logprobs_mode, **kw))
            for i, p in enumerate(PROMPTS)]
    outs, stats = engine.generate(reqs, **MODES[mode])
    assert all(len(o.token_ids) == N_NEW for o in outs)
    return outs, stats


def _check_top(top: dict, ref: np.ndarray, where: str) -> None:
    """The alternatives are TOP tokens with the reference's log-probabilities, and no token
    left out is more likely than one given (ties at the edge either way)."""
    assert len(top) == TOP, where
    with np.errstate(invalid="ignore"):
        for alt, lp in top.items():
            assert lp == pytest.approx(ref[alt], abs=2e-5) or lp == ref[alt] == -np.inf, \
                (where, alt)
    edge = min(ref[a] for a in top)
    rest = np.delete(ref, list(top))
    assert rest.max() <= edge + 1e-9, f"{where}: a likelier token is missing"


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("name", list(PARAMS))
def test_sampled_tokens_follow_the_reference_law_at_every_position(setup, name, mode):
    engine, w, cfg = setup
    kw = dict(temperature=1.0, **PARAMS[name]) if "temperature" not in PARAMS[name] \
        else dict(PARAMS[name])
    outs, stats = _run(engine, kw, mode)
    if mode != "target-only":
        assert stats.num_drafts > 0                          # speculative steps ran
    for prompt, o in zip(PROMPTS, outs):
        for t, tok in enumerate(o.token_ids):
            law, _, _ = _reference_law(w, cfg, prompt, o.token_ids[:t], kw)
            where = f"{name} {mode} prompt {prompt} position {t}"
            assert law[tok] > 0, f"{where}: token {tok} has probability 0 under the law"
            assert o.logprobs[t] == pytest.approx(np.log(law[tok]), abs=2e-5), where
            with np.errstate(divide="ignore"):
                _check_top(o.top_logprobs[t], np.log(law), where)


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("name", ["bias", "repetition", "frequency", "presence",
                                  "penalties+bias"])
def test_greedy_tokens_are_the_argmax_of_the_processed_logits(setup, name, mode):
    engine, w, cfg = setup
    kw = dict(temperature=0.0, **PARAMS[name])
    outs, _ = _run(engine, kw, mode)
    plain, _ = _run(engine, dict(temperature=0.0), mode)
    assert [o.token_ids for o in outs] != [o.token_ids for o in plain], \
        f"{name} changes no greedy token here: the test would not see it dropped"
    for prompt, o in zip(PROMPTS, outs):
        for t, tok in enumerate(o.token_ids):
            _, x, _ = _reference_law(w, cfg, prompt, o.token_ids[:t], kw)
            top = np.sort(x)[-2:]
            if top[1] - top[0] < 1e-9:                       # a tie: either is right
                continue
            assert tok == int(np.argmax(x)), f"{name} {mode} prompt {prompt} position {t}"


@pytest.mark.parametrize("mode", ["target-only", "block-4"])
def test_raw_logprobs_are_the_models_own_law(setup, mode):
    engine, w, cfg = setup
    kw = PARAMS["everything"]
    outs, _ = _run(engine, kw, mode, logprobs_mode="raw")
    for prompt, o in zip(PROMPTS, outs):
        for t, tok in enumerate(o.token_ids):
            law, _, logits = _reference_law(w, cfg, prompt, o.token_ids[:t], kw)
            assert law[tok] > 0
            raw = logits - logits.max()
            raw = raw - np.log(np.exp(raw).sum())
            assert o.logprobs[t] == pytest.approx(raw[tok], abs=2e-5)
            _check_top(o.top_logprobs[t], raw, f"raw {mode} prompt {prompt} position {t}")
