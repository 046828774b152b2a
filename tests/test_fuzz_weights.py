"""Property: a NaN / ±inf / huge value anywhere in the draft's or the target's weights (or a
temperature at the edge of float32) gives a typed error or a right answer, never a silently
wrong token sequence.

Each case corrupts one weight tensor of the bundled pair in place (one element, one row or the
whole tensor, seeded), decodes a held-out prompt with speculation through a backend that
certifies every step against the float64 reference (``_certify.py``), and classifies:

- ``error``: a typed ``DFlash2Error`` (NaN target / draft / selector rows are refused);
- ``identical``: the clean run's tokens (greedy: also the corrupted target's own target-only
  tokens when the target was corrupted);
- ``certified``: T > 0 with different tokens, every step certified — a finite change of the
  draft (or of the target) changes which tokens a seed gives, not their law;
- ``other``: anything else (an untyped exception, an uncertified step, greedy tokens that differ
  from target-only decoding) — must never happen.

``DFLASH2RT_FUZZ_ROUNDS=N`` runs N seeded rounds over every tensor (default 1, as in CI).
"""

from __future__ import annotations

import json
import os
from collections import Counter

import numpy as np
import pytest
import torch

from dflash2rt.bundled import bundled_path
from dflash2rt.engine.engine import Engine
from dflash2rt.engine.request import Request, SamplingParams
from dflash2rt.errors import DFlash2Error
from dflash2rt.models.pair import load_pair

from _certify import CertifyingBackend

KINDS = ("nan", "+inf", "-inf", "huge")
HUGE = (1e30, 3e38)
N_NEW = 10


@pytest.fixture(scope="module")
def pair():
    root = bundled_path("stdlib-code")
    return load_pair(root / "target", root / "draft")


@pytest.fixture(scope="module")
def prompt(pair):
    first = json.loads((bundled_path("stdlib-code") / "heldout_prompts.json").read_text())[0]
    return tuple(first["prompt_ids"])


def decode(pair, prompt, temperature, spec=True):
    """→ ("error", exc) | ("tokens", ids, violations)."""
    be = CertifyingBackend()
    params = SamplingParams(max_new_tokens=N_NEW, temperature=temperature, seed=3,
                            top_p=0.95 if 0 < temperature < 1 else 1.0)
    try:
        with Engine(pair, be) as eng:
            out, _ = eng.generate([Request(prompt, params)], spec=spec)
    except DFlash2Error as exc:
        return ("error", exc, [])
    return ("tokens", out[0].token_ids, be.violations)


def _corrupt(param: torch.Tensor, g: np.random.Generator, kind: str) -> None:
    value = {"nan": float("nan"), "+inf": float("inf"), "-inf": float("-inf")}.get(kind)
    if value is None:
        value = float(g.choice(HUGE)) * float(g.choice([-1.0, 1.0]))
    flat = param.data.view(-1)
    where = g.choice(["element", "row", "all"], p=[0.6, 0.3, 0.1])
    if where == "element" or param.dim() == 1:
        flat[int(g.integers(flat.numel()))] = value
    elif where == "row":
        param.data[int(g.integers(param.shape[0]))] = value
    else:
        param.data.fill_(value)


def classify(result, clean, temperature, target_only=None) -> str:
    if result[0] == "error":
        return "error"
    _, tokens, violations = result
    if violations:
        return "other"
    if tokens == clean:
        return "identical"
    if temperature == 0:
        return "identical" if target_only is not None and tokens == target_only else "other"
    return "certified"


def _cases(pair, rounds: int):
    params = [("draft", n, p) for n, p in pair.draft.named_parameters()]
    params += [("target", n, p) for n, p in pair.target.named_parameters()]
    for r in range(rounds):
        for i, (model, name, p) in enumerate(params):
            for temperature in (0.0, 1.0, 0.7):
                g = np.random.default_rng([r, i, int(temperature * 10)])
                yield model, name, p, KINDS[int(g.integers(len(KINDS)))], temperature, g


@pytest.mark.slow                       # a long run (over 10 s on 2 cores)
def test_weight_injection_never_gives_a_silently_wrong_answer(pair, prompt):
    rounds = int(os.environ.get("DFLASH2RT_FUZZ_ROUNDS", "1"))
    clean = {t: decode(pair, prompt, t) for t in (0.0, 1.0, 0.7)}
    assert all(c[0] == "tokens" and not c[2] for c in clean.values()), clean
    counts, others = Counter(), []
    for model, name, p, kind, t, g in _cases(pair, rounds):
        saved = p.data.clone()
        try:
            _corrupt(p, g, kind)
            result = decode(pair, prompt, t)
            ar = None
            if t == 0 and model == "target" and result[0] == "tokens" \
                    and result[1] != clean[t][1]:
                ar = decode(pair, prompt, t, spec=False)
                ar = ar[1] if ar[0] == "tokens" else None
            outcome = classify(result, clean[t][1], t, ar)
        finally:
            p.data.copy_(saved)
        counts[outcome] += 1
        if outcome == "other":
            others.append((model, name, kind, t, result[1], result[2][:2]))
    print(f"\nweight injection: {sum(counts.values())} cases: {dict(counts)}")
    assert not others, others
    assert counts["error"] > 0 and counts["identical"] > 0


@pytest.mark.parametrize("temperature", [1e-38, 1.4e-45, 1e-30])
def test_tiny_temperatures_are_the_greedy_law(pair, prompt, temperature):
    """logits / T overflowed float32 (NaN probabilities, every token EOS); now the law at a tiny
    T is the one-hot limit, so the tokens are the greedy ones (spec and target-only)."""
    greedy = decode(pair, prompt, 0.0)[1]
    for spec in (True, False):
        result = decode(pair, prompt, temperature, spec=spec)
        assert result[0] == "tokens" and not result[2], result
        assert result[1] == greedy


@pytest.mark.parametrize("temperature", [1e30, 3e38])
def test_huge_temperatures_are_certified(pair, prompt, temperature):
    result = decode(pair, prompt, temperature)
    assert result[0] == "tokens" and not result[2] and len(result[1]) >= 1, result
