"""``SamplingParams``'s domains, each field edge by edge on both sides, written out here from
docs/sampling.md independently of the checks: inside, the value is kept (as the documented
type); outside, a SamplingParamsError whose message names the field. The HTTP side's own edges:
test_serve_parse_fuzz.py."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from dflash2rt.engine.request import SamplingParams
from dflash2rt.errors import SamplingParamsError

from test_serve_parse_fuzz import Pattern          # a stand-in constraint hook

I31, I63 = 2**31, 2**63
EDGES = {
    "max_new_tokens": [(1, True), (I63 - 1, True), (np.int64(3), True), (0, False),
                       (I63, False), (2.0, False), (True, False)],
    "temperature": [(0, True), (1e-30, True), (3e38, True), (-1e-12, False), (1e-50, False),
                    (3.5e38, False), (math.nan, False), (math.inf, False), (True, False)],
    "top_k": [(0, True), (-1, True), (I63 - 1, True), (-2, False), (I63, False),
              (1.0, False), (True, False)],
    "top_p": [(1.0, True), (1e-9, True), (0.0, False), (1.0000001, False), (math.nan, False)],
    "seed": [(0, True), (I63 - 1, True), (-1, False), (I63, False), (1.0, False)],
    "min_p": [(0.0, True), (1.0, True), (-1e-9, False), (1.0000001, False),
              (math.inf, False), (False, False)],
    "repetition_penalty": [(1e-6, True), (1e6, True), (9.99e-7, False), (1.000001e6, False),
                           (math.nan, False)],
    "frequency_penalty": [(-2.0, True), (2.0, True), (-2.000001, False), (2.000001, False)],
    "presence_penalty": [(-2, True), (2, True), (-2.1, False), (math.inf, False)],
    "logit_bias": [({0: 100.0}, True), ({I31 - 1: -100}, True), ({I31: 1.0}, False),
                   ({-1: 1.0}, False), ({1: 100.01}, False), ({1: -100.01}, False),
                   ({1: math.nan}, False), ({True: 1.0}, False), ({1.0: 1.0}, False),
                   ([1], False)],
    "logprobs": [(None, True), (0, True), (20, True), (21, False), (-1, False),
                 (True, False), (1.0, False)],
    "logprobs_mode": [("raw", True), ("processed", True), ("RAW", False), (None, False)],
    "num_candidates": [(None, True), (1, True), (I31 - 1, True), (0, False), (I31, False),
                       (2.0, False), (True, False)],
    "stop_token_ids": [((0, I63 - 1), True), ([], True), ((-1,), False), ((I63,), False),
                       ((1.0,), False), (5, False)],
    "stop_strings": [(("a", "bc"), True), ([], True), (("",), False), ("ab", False),
                     ((1,), False), (("\ud800",), False)],
    "ignore_eos": [(True, True), (False, True), (1, False), ("yes", False)],
    "include_stop_str_in_output": [(False, True), (0, False)],
}
KEPT_AS = {"temperature": float, "top_p": float, "min_p": float, "repetition_penalty": float,
           "frequency_penalty": float, "presence_penalty": float, "max_new_tokens": int,
           "top_k": int, "seed": int}


@pytest.mark.parametrize("name,value,valid", [(n, v, ok) for n, cases in EDGES.items()
                                              for v, ok in cases],
                         ids=lambda x: repr(x)[:24])
def test_each_field_is_kept_exactly_inside_its_domain(name, value, valid):
    if not valid:
        with pytest.raises(SamplingParamsError, match=name.split("_mode")[0]):
            SamplingParams(**{name: value})
        return
    got = getattr(SamplingParams(**{name: value}), name)
    if name == "top_k" and value == -1:
        assert got == 0                                     # vLLM's "off" is ours, 0
    elif isinstance(value, (list, tuple)):
        assert got == tuple(value)
    elif name == "logit_bias":
        assert got == {int(k): float(b) for k, b in value.items()}
        assert all(type(k) is int and type(b) is float for k, b in got.items())
    else:
        assert got == value
    if name in KEPT_AS:
        assert type(getattr(SamplingParams(**{name: value}), name)) in (KEPT_AS[name], int) \
            if KEPT_AS[name] is float else type(got) is int


def test_the_defaults_are_the_documented_ones():
    p = SamplingParams()
    assert (p.max_new_tokens, p.temperature, p.top_k, p.top_p, p.seed) == (64, 0.0, 0, 1.0, 0)
    assert (p.stop_token_ids, p.stop_strings, p.logit_bias) == ((), (), {})
    assert (p.include_stop_str_in_output, p.ignore_eos) == (False, False)
    assert (p.repetition_penalty, p.frequency_penalty, p.presence_penalty, p.min_p) == \
        (1.0, 0.0, 0.0, 0.0)
    assert (p.logprobs, p.logprobs_mode, p.constraint, p.num_candidates) == \
        (None, "raw", None, None)
    assert not p.processed


@pytest.mark.parametrize("field,value", [
    ("logit_bias", {1: 0.5}), ("logprobs", 0), ("min_p", 0.1), ("repetition_penalty", 1.2),
    ("frequency_penalty", -0.5), ("presence_penalty", 0.3), ("constraint", Pattern("a"))])
def test_any_one_processor_makes_a_request_processed(field, value):
    """``processed`` (the batch then builds its processor state) is true when any one of
    them is set, and only then."""
    assert SamplingParams(**{field: value}).processed
    assert not SamplingParams(temperature=0.7, top_k=5, top_p=0.9, seed=3,
                              stop_strings=("x",), ignore_eos=True).processed


V = 10


def _table(vocab: int):
    from dflash2rt.constraints import TokenAutomaton

    return TokenAutomaton(np.zeros((1, vocab), dtype=np.int32))


@pytest.mark.parametrize("prompt,params,key,valid", [
    ((0, V - 1), {}, 0, True), ((V,), {}, 0, False), ((-1,), {}, 0, False), ((), {}, 0, False),
    ((1,), {}, 2**32 - 1, True), ((1,), {}, 2**32, False), ((1,), {}, -1, False),
    ((1,), {"stop_token_ids": (V - 1,)}, 0, True), ((1,), {"stop_token_ids": (V,)}, 0, False),
    ((1,), {"logit_bias": {V - 1: 1.0}}, 0, True), ((1,), {"logit_bias": {V: 1.0}}, 0, False),
    ((1,), {"num_candidates": V}, 0, True), ((1,), {"num_candidates": V + 1}, 0, False),
    ((1,), {"constraint": "table V"}, 0, True), ((1,), {"constraint": "table V+1"}, 0, False)],
    ids=lambda x: repr(x)[:20])
def test_a_request_is_checked_against_the_vocabulary_at_its_edges(prompt, params, key, valid):
    """``Request.validate``: token ids, the key, and every per-token field against the
    vocabulary, on both sides of each bound."""
    from dflash2rt.engine.request import Request
    from dflash2rt.errors import DFlash2Error

    if params.get("constraint"):
        params = {"constraint": _table(V if params["constraint"] == "table V" else V + 1)}
    q = Request(prompt, SamplingParams(**params), key=key)
    if valid:
        q.validate(V)
    else:
        with pytest.raises(DFlash2Error):
            q.validate(V)


def test_params_are_immutable_and_hashable_with_a_bias_and_a_constraint():
    """Requests share and key SamplingParams (a frozen dataclass): the dict-valued fields
    stay out of the hash instead of making it fail."""
    import dataclasses

    p = SamplingParams(logit_bias={1: 2.0}, constraint=Pattern("a"), stop_strings=("x",))
    assert hash(p) == hash(SamplingParams(logit_bias={3: 1.0}, constraint=Pattern("b"),
                                          stop_strings=("x",)))
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.temperature = 1.0


# vLLM's fields dflash2rt has only at their default (docs/sampling.md): that default is
# taken and changes nothing; any other value is refused naming the field.
VLLM_ONLY_DEFAULT = [("n", [1], [2, 0, True, 1.0, "1", None]),
                     ("best_of", [None, 1], [2, 0, True, 1.0]),
                     ("min_tokens", [0], [1, 5, -1, False, 0.0]),
                     ("prompt_logprobs", [None], [0, 1, False]),
                     ("truncate_prompt_tokens", [None], [0, 16, -1]),
                     ("detokenize", [True], [False, 1, None]),
                     ("bad_words", [None], [["x"], [], "x"]),
                     ("allowed_token_ids", [None], [[1, 2], [], 0]),
                     ("logits_processors", [None], [[], [print]]),
                     ("skip_special_tokens", [False], [True, 0, None]),
                     ("spaces_between_special_tokens", [True], [False, 1, None])]


@pytest.mark.parametrize("name, taken, refused", VLLM_ONLY_DEFAULT)
def test_vllm_fields_at_their_default_only(name, taken, refused):
    base = SamplingParams(max_tokens=7, temperature=0.5, seed=3)
    for v in taken + [np.int64(1)] * (name in ("n", "best_of")):
        assert SamplingParams(max_tokens=7, temperature=0.5, seed=3, **{name: v}) == base
    for v in refused:
        with pytest.raises(SamplingParamsError, match=re.escape(f"{name}={v!r} is not supported")):
            SamplingParams(max_tokens=7, **{name: v})
    with pytest.raises(TypeError, match="unexpected keyword argument 'no_such_field'"):
        SamplingParams(no_such_field=1)


def test_seed_none_is_a_random_seed_the_params_keep(monkeypatch):
    import dflash2rt.engine.request as request

    drawn = iter([5, 2**62 - 1])
    monkeypatch.setattr(request.secrets, "randbits", lambda bits: bits == 62 and next(drawn))
    a = SamplingParams(temperature=1.0, seed=None)
    b = SamplingParams(max_tokens=3, seed=None)
    assert (a.seed, b.seed) == (5, 2**62 - 1)
    assert "seed=5" in repr(a)
    assert a == SamplingParams(temperature=1.0, seed=5)
    monkeypatch.undo()
    seeds = {SamplingParams(temperature=1.0, seed=None).seed for _ in range(8)}
    assert len(seeds) > 1 and all(0 <= s < 2**62 for s in seeds)
    assert SamplingParams(temperature=1.0).seed == 0             # no seed given: 0, as before
