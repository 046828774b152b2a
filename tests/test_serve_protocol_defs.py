"""The server's request-body checks (``serve/protocol.py``) against docs/serving.md's request
fields and errors written out here: the context's bound on both sides, the stream options,
``block_size`` / ``num_candidates`` per kind of server, defaults and seeds, each bad field alone
beside good ones, and the field an error from ``SamplingParams`` is charged to."""

from __future__ import annotations

import dataclasses

import pytest

from dflash2rt.serve import protocol
from dflash2rt.serve.errors import APIError

from stub_constraint import Pattern as Regex

VOCAB = 50


def limits(block=8, context=10, names=("a", "b")):
    return protocol.Limits(names, context, block, VOCAB, Regex)


def refused(fn, *args, status=400):
    with pytest.raises(APIError) as info:
        fn(*args)
    assert info.value.status == status and info.value.message
    return info.value


# ---- check_context: room = context − prompt; max_tokens in [1, room] -----------------------

@pytest.mark.parametrize("plen,max_tokens,want", [
    (3, 7, 7), (3, 1, 1), (3, None, 7), (9, 1, 1), (9, None, 1),
    (3, 8, "max_tokens"), (9, 2, "max_tokens"), (3, 0, "max_tokens"), (3, -1, "max_tokens"),
    (10, None, "prompt"), (10, 1, "prompt"), (11, 5, "prompt"), (12, None, "prompt"),
])
def test_check_context_on_both_sides_of_the_context(plen, max_tokens, want):
    prompt = tuple(range(plen))
    if isinstance(want, int):
        assert protocol.check_context(prompt, max_tokens, limits(), "prompt") == want
        return
    exc = refused(protocol.check_context, prompt, max_tokens, limits(), "prompt")
    assert exc.param == want
    if max_tokens is None or max_tokens >= 1:
        assert exc.code == "context_length_exceeded"
        asked = plen + (max_tokens or 1)
        assert f"needs {asked} ({plen} in the prompt, {max_tokens or 1} to generate)" \
            in exc.message
        assert "maximum context length is 10 tokens" in exc.message


def test_check_context_names_the_field_the_request_used():
    exc = refused(protocol.check_context, (1, 2), 9, limits(), "messages",
                  "max_completion_tokens")
    assert exc.param == "max_completion_tokens"
    exc = refused(protocol.check_context, tuple(range(10)), 1, limits(), "messages",
                  "max_completion_tokens")
    assert exc.param == "messages" and "shorten the messages" in exc.message
    exc = refused(protocol.check_context, (1,), 0, limits(), "messages",
                  "max_completion_tokens")
    assert exc.param == "max_completion_tokens" and exc.code is None


# ---- check_common: n, stream, stream_options ----------------------------------------------

@pytest.mark.parametrize("body,want", [
    ({}, (False, False)), ({"n": 1}, (False, False)), ({"n": None}, (False, False)),
    ({"stream": True}, (True, False)), ({"stream": False}, (False, False)),
    ({"stream": True, "stream_options": {}}, (True, False)),
    ({"stream": True, "stream_options": {"include_usage": True}}, (True, True)),
    ({"stream": True, "stream_options": {"include_usage": False}}, (True, False)),
    ({"stream": True, "stream_options": {"include_usage": None}}, (True, False)),
    ({"stream": True, "stream_options": None}, (True, False)),
    ({"n": 2}, "n"), ({"n": 0}, "n"), ({"stream": 1}, "stream"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"stream": False, "stream_options": {}}, "stream_options"),
    ({"stream": True, "stream_options": {"include_usage": True, "x": 1}}, "stream_options"),
    ({"stream": True, "stream_options": {"x": 1}}, "stream_options"),
    ({"stream": True, "stream_options": ["include_usage"]}, "stream_options"),
    ({"stream": True, "stream_options": {"include_usage": 1}}, "include_usage"),
])
def test_check_common(body, want):
    if isinstance(want, tuple):
        assert protocol.check_common(body) == want
        return
    assert refused(protocol.check_common, body).param == want


# ---- sampling_params: per kind of server, defaults, each field alone -----------------------

def params(body, lim=None, max_tokens=4, logprobs=None, logprobs_param="logprobs"):
    return protocol.sampling_params(body, lim or limits(), max_tokens, logprobs,
                                    logprobs_param)


@pytest.mark.parametrize("block,body,want", [
    (8, {"block_size": 8}, None), (8, {}, None), (None, {}, None), (1, {"block_size": 1}, None),
    (8, {"block_size": 4}, "block_size"), (8, {"block_size": 9}, "block_size"),
    (None, {"block_size": 8}, "block_size"), (None, {"block_size": 1}, "block_size"),
    (8, {"num_candidates": 1}, 1), (8, {"num_candidates": VOCAB}, VOCAB),
    (None, {"num_candidates": 3}, 3), (2, {"num_candidates": 2}, 2),
    (1, {"num_candidates": 1}, "num_candidates"), (1, {"num_candidates": 5}, "num_candidates"),
    (8, {"num_candidates": 0}, "num_candidates"),
    (8, {"num_candidates": VOCAB + 1}, "num_candidates"),
    (None, {"num_candidates": 0}, "num_candidates"),
])
def test_block_size_and_num_candidates_per_server(block, body, want):
    if not isinstance(want, str):
        assert params(body, limits(block=block)).num_candidates == want
        return
    exc = refused(params, body, limits(block=block))
    assert exc.param == want
    if want == "block_size":
        assert "--block-size" in exc.message


def test_defaults_and_values_are_kept():
    p = params({}, max_tokens=3)
    assert (p.max_tokens, p.temperature, p.top_p, p.top_k, p.min_p) == (3, 1.0, 1.0, 0, 0.0)
    assert (p.presence_penalty, p.frequency_penalty, p.repetition_penalty) == (0.0, 0.0, 1.0)
    assert (p.stop_strings, p.stop_token_ids, p.logit_bias, p.logprobs) == ((), (), {}, None)
    assert (p.ignore_eos, p.include_stop_str_in_output) == (False, False)
    assert p.constraint is None and p.num_candidates is None
    body = {"temperature": 0.5, "top_p": 0.25, "top_k": 7, "min_p": 0.125, "seed": 99,
            "stop": ["x", "yz"], "stop_token_ids": [0, VOCAB - 1], "ignore_eos": True,
            "include_stop_str_in_output": True, "presence_penalty": -1.5,
            "frequency_penalty": 2, "repetition_penalty": 1.75,
            "logit_bias": {"0": -100, str(VOCAB - 1): 2.5, "007": 1},
            "structured_outputs": {"regex": "a|b"}}
    p = params(body, max_tokens=5, logprobs=3)
    assert (p.max_tokens, p.temperature, p.top_p, p.top_k, p.min_p, p.seed) == \
        (5, 0.5, 0.25, 7, 0.125, 99)
    assert (p.stop_strings, p.stop_token_ids) == (("x", "yz"), (0, VOCAB - 1))
    assert (p.ignore_eos, p.include_stop_str_in_output) == (True, True)
    assert (p.presence_penalty, p.frequency_penalty, p.repetition_penalty) == (-1.5, 2.0, 1.75)
    assert p.logit_bias == {0: -100.0, VOCAB - 1: 2.5, 7: 1.0}
    assert p.logprobs == 3 and p.constraint.pattern == "a|b"
    assert params({"stop": "end"}).stop_strings == ("end",)
    assert params({"guided_regex": "c+"}).constraint.pattern == "c+"


@pytest.mark.parametrize("temperature,seeded", [(0, False), (0.0, False), (1e-9, True),
                                                (1, True), (None, True)])
def test_a_sampled_request_without_seed_gets_a_random_one(temperature, seeded):
    body = {} if temperature is None else {"temperature": temperature}
    seeds = {params(body).seed for _ in range(4)}
    if seeded:
        assert len(seeds) == 4 and all(0 <= s < 2**63 for s in seeds)
    else:
        assert seeds == {0}
    assert params({**body, "seed": 5}).seed == 5


GOOD = {"temperature": 0.5, "top_p": 0.5, "stop_token_ids": [1], "logit_bias": {"2": 1.0},
        "stop": "s", "structured_outputs": {"regex": "a"}}


@pytest.mark.parametrize("field,value", [
    ("stop_token_ids", [VOCAB]), ("stop_token_ids", [-1]), ("stop_token_ids", [1, 2.0]),
    ("stop_token_ids", 3), ("stop_token_ids", [True]),
    ("logit_bias", {str(VOCAB): 1}), ("logit_bias", {"1": "x"}), ("logit_bias", {"-1": 1}),
    ("logit_bias", {"1.0": 1}), ("logit_bias", ["1"]), ("logit_bias", {"1": False}),
    ("stop", ""), ("stop", ["a", ""]), ("stop", ("a",)), ("stop", 5),
    ("structured_outputs", {"regex": "("}), ("structured_outputs", {"regex": ""}),
    ("structured_outputs", {"regex": "a", "json": 1}), ("structured_outputs", "a"),
    ("guided_regex", 7), ("temperature", "1"), ("temperature", True), ("top_p", False),
    ("top_k", 1.0), ("seed", True), ("ignore_eos", 0), ("include_stop_str_in_output", "no"),
    ("min_p", 2), ("presence_penalty", 3), ("frequency_penalty", -3),
    ("repetition_penalty", 0), ("seed", -1), ("top_k", -2), ("top_p", 0),
])
def test_each_bad_field_alone_is_a_400_naming_it(field, value):
    assert params({**GOOD}).constraint is not None                 # the good body is good
    body = {**GOOD, field: value}
    if field == "guided_regex":
        del body["structured_outputs"]
    exc = refused(params, body)
    assert exc.param == field, (exc.param, exc.message)


@pytest.mark.parametrize("key,want", [
    ("0", 0), ("49", 49), ("007", 7), ("0" * 5000 + "7", 7), ("0" * 5000, 0),
    ("50", None), ("100", None), ("9" * 5000, None), ("1" + "0" * 4400, None),
    ("\u0663", None), ("+3", None), (" 3", None), ("3 ", None), ("", None), ("0x1", None),
])
def test_logit_bias_keys_are_ascii_decimal_token_ids(key, want):
    """A key is a token id in [0, vocab) written in decimal digits, however long the
    string; anything else is a 400 naming logit_bias (never an error of int())."""
    if want is not None:
        assert params({"logit_bias": {key: 1.5}}).logit_bias == {want: 1.5}
        return
    exc = refused(params, {"logit_bias": {key: 1.5}})
    assert exc.param == "logit_bias" and "not a token id in [0, 50)" in exc.message


def test_both_regex_fields_are_refused():
    assert refused(params, {"structured_outputs": {"regex": "a"}, "guided_regex": "a"}).param \
        == "structured_outputs"


@pytest.mark.parametrize("max_tokens,logprobs,logprobs_param,want", [
    (0, None, "logprobs", "max_tokens"), (4, 21, "logprobs", "logprobs"),
    (4, 21, "top_logprobs", "top_logprobs"), (4, -1, "top_logprobs", "top_logprobs"),
])
def test_an_error_of_sampling_params_names_the_request_s_field(max_tokens, logprobs,
                                                               logprobs_param, want):
    """``SamplingParams``'s own names (``max_new_tokens``) are read back as the request's
    (``max_tokens``), and ``logprobs`` as the field it came in (chat: ``top_logprobs``)."""
    exc = refused(params, {}, None, max_tokens, logprobs, logprobs_param)
    assert exc.param == want


# ---- model, fields, prompts, small readers -------------------------------------------------

def test_model_of_and_check_fields():
    assert protocol.model_of({}, limits()) == "a"
    assert protocol.model_of({"model": "b"}, limits()) == "b"
    exc = refused(protocol.model_of, {"model": "c"}, limits(), status=404)
    assert (exc.param, exc.code) == ("model", "model_not_found")
    assert refused(protocol.model_of, {"model": 3}, limits()).param == "model"
    assert protocol.check_fields({"model": "a", "prompt": [1]}, protocol.COMPLETION) == \
        {"model": "a", "prompt": [1]}
    exc = refused(protocol.check_fields, {"prompt": [1], "zz": 1, "yy": 2}, protocol.COMPLETION)
    assert exc.param == "yy" and exc.message.startswith("unsupported parameter 'yy'")
    exc = refused(protocol.check_fields, {"prompt": [1], "zz": 1}, protocol.COMPLETION)
    assert exc.param == "zz" and exc.message.startswith("unsupported parameter 'zz'")
    assert refused(protocol.check_fields, {"messages": []}, protocol.COMPLETION).param == \
        "messages"
    assert refused(protocol.check_fields, {"prompt": [1]}, protocol.CHAT).param == "prompt"
    assert refused(protocol.check_fields, [1], protocol.CHAT).param is None


def encode(text):
    return [ord(c) % VOCAB for c in text]


@pytest.mark.parametrize("value,want", [
    ("hi", [(104 % VOCAB, 105 % VOCAB)]), ([3, 4], [(3, 4)]), ([0], [(0,)]),
    ([VOCAB - 1], [(VOCAB - 1,)]), ([[1], [2, 3]], [(1,), (2, 3)]),
    (["a", [5]], [(97 % VOCAB,), (5,)]), (["a", "b"], [(97 % VOCAB,), (98 % VOCAB,)]),
    ([VOCAB], "prompt"), ([-1], "prompt"), ([[1], [VOCAB]], "prompt"), ([], "prompt"),
    ([[]], "prompt"), ([""], "prompt"), ("", "prompt"), ([1, "a"], "prompt"),
    ([[1, "a"]], "prompt"), ([True], "prompt"), ([[1.0]], "prompt"), (None, "prompt"),
    (5, "prompt"), ([["a"]], "prompt"),
])
def test_prompt_ids(value, want):
    if isinstance(want, list):
        assert protocol.prompt_ids(value, encode, VOCAB) == want
        return
    assert refused(protocol.prompt_ids, value, encode, VOCAB).param == "prompt"


def test_small_readers():
    assert protocol.integer({}, "k", 7) == 7 and protocol.integer({"k": None}, "k", None) is None
    assert protocol.integer({"k": 0}, "k", 7) == 0
    assert refused(protocol.integer, {"k": True}, "k", 1).param == "k"
    assert refused(protocol.integer, {"k": 1.0}, "k", 1).param == "k"
    assert protocol.flag({}, "f") is False and protocol.flag({}, "f", True) is True
    assert protocol.flag({"f": False}, "f", True) is False
    assert refused(protocol.flag, {"f": 0}, "f").param == "f"
    protocol.only({}, "n", 1, "x")
    protocol.only({"n": 1}, "n", 1, "x")
    assert "n=2 is not supported: one" in refused(protocol.only, {"n": 2}, "n", 1, "one").message


def test_limits_and_parsed_are_frozen():
    """A server's limits and a checked request never change after they are made."""
    lim = limits()
    parsed = protocol.Parsed([(1,)], params({}), False, False, None, "a")
    for obj, name in ((lim, "block"), (lim, "vocab"), (parsed, "params"), (parsed, "model")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(obj, name, None)
