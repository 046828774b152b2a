"""``dflash2rt/engine/request.py`` at the edges its docstrings and docs/sampling.md draw: vLLM's
``stop`` in each of its forms, ``block_size_or_default`` from 1 up, ``logprobs`` against a
vocabulary of about its size, ``stop_at`` and ``stop_cut`` against scans written anew."""

from __future__ import annotations

import itertools
import random

import pytest

from dflash2rt.engine.request import (Request, SamplingParams, block_size_or_default, stop_at,
                                      stop_cut)
from dflash2rt.errors import InvalidInputError, SamplingParamsError


@pytest.mark.parametrize("stop, want", [
    ("x", ("x",)), (None, ()), (["a", "b"], ("a", "b")), (("a",), ("a",)), ([], ()),
])
def test_vllm_stop_in_each_form(stop, want):
    assert SamplingParams(stop=stop).stop_strings == want
    assert SamplingParams(stop=stop).stop == want


def test_vllm_names_beside_ours():
    p = SamplingParams(max_tokens=5, stop="\n")
    assert (p.max_new_tokens, p.max_tokens, p.stop_strings) == (5, 5, ("\n",))
    with pytest.raises(InvalidInputError, match="same field"):
        SamplingParams(stop="x", stop_strings=("y",))
    with pytest.raises(SamplingParamsError):
        SamplingParams(max_tokens=None)            # not read as "no limit" nor as ()


@pytest.mark.parametrize("block", [1, 2, 3, 8, 64, 999])
def test_block_size_from_one(block):
    assert block_size_or_default(block, 8) == block
    assert block_size_or_default(None, block) == block


@pytest.mark.parametrize("block", [0, -1, 2.0, True, "8", "auto"])
def test_block_size_not_a_count(block):
    with pytest.raises(InvalidInputError, match="block_size must be an integer >= 1"):
        block_size_or_default(block, 8)


@pytest.mark.parametrize("vocab", [1, 4, 5, 6, 20])
def test_logprobs_up_to_the_vocabulary(vocab):
    """top-n alternatives: n may be the whole vocabulary, not more."""
    for n in range(0, min(vocab, 20) + 1):
        Request((0,), SamplingParams(logprobs=n)).validate(vocab)
    if vocab < 20:
        with pytest.raises(InvalidInputError, match="logprobs"):
            Request((0,), SamplingParams(logprobs=vocab + 1)).validate(vocab)


def _stop_at_ref(tokens, max_new, stops):
    for i, t in enumerate(tokens):
        if i >= max_new:
            break
        if t in stops:
            return i, "stop_token"
    return (max_new, "length") if len(tokens) >= max_new else None


def test_stop_at_against_a_scan():
    rng = random.Random(3)
    for _ in range(400):
        tokens = [rng.randrange(6) for _ in range(rng.randrange(0, 9))]
        max_new = rng.randrange(1, 9)
        stop_ids = tuple(rng.sample(range(6), rng.randrange(0, 3)))
        eos = tuple(rng.sample(range(6), rng.randrange(0, 2)))
        ignore = rng.random() < 0.3
        p = SamplingParams(max_new_tokens=max_new, stop_token_ids=stop_ids, ignore_eos=ignore)
        stops = set(stop_ids) | (set() if ignore else set(eos))
        assert stop_at(tokens, p, eos) == _stop_at_ref(tokens, max_new, stops), \
            (tokens, max_new, stop_ids, eos, ignore)


def _cut_ref(text, stops, include):
    hits = [(text.find(s), len(s)) for s in stops if s in text]
    if not hits:
        return None
    k, n = min(hits)
    return k + n if include else k


def test_stop_cut_against_a_scan():
    alphabet = "ab\n"
    words = ["".join(w) for n in (1, 2, 3) for w in itertools.product(alphabet, repeat=n)]
    rng = random.Random(5)
    for _ in range(2000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 8)))
        stops = rng.sample(words, rng.randrange(1, 4))
        for include in (False, True):
            assert stop_cut(text, stops, include) == _cut_ref(text, stops, include), \
                (text, stops, include)
