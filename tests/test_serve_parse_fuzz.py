"""Fuzzing the server's request parsing (``serve/parse.py``): any JSON a client may send to
``/v1/completions`` or ``/v1/chat/completions`` gives either a checked request (prompts of
token ids inside the vocabulary and the context, sampling parameters that decode) or an
``APIError`` with a 4xx status, a message and, where one field is at fault, that field's name;
never another exception (which the server would answer with a 500)."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dflash2rt.bundled import bundled_path
from dflash2rt.engine.request import SamplingParams
from dflash2rt.models.tokenizer import load_tokenizer
from dflash2rt.serve import parse
from dflash2rt.serve.chat import ChatTemplate
from dflash2rt.serve.errors import APIError
from dflash2rt.serve.protocol import CHAT, COMPLETION, OURS, Limits

from stub_constraint import Pattern

VOCAB, CONTEXT = 2048, 12                  # a short context: bodies reach its bound often
TEMPLATE = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
CHAT_TEMPLATE = ChatTemplate(TEMPLATE, {})


LIMITS = {block: Limits(("m", "n"), CONTEXT, block, VOCAB, Pattern) for block in (None, 1, 8)}
ROOMY = Limits(("m",), 64, 8, VOCAB, Pattern)       # a context that bare bodies fit in

scalars = (st.none() | st.booleans() | st.integers(-2**70, 2**70)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12))
anything = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                        | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                        max_leaves=8)
token = st.integers(0, VOCAB - 1) | st.sampled_from([0, VOCAB - 1, VOCAB, -1])   # and edges
ids = st.lists(token, min_size=1, max_size=6) | st.lists(st.integers(-3, VOCAB + 3), max_size=6)
messages = st.lists(st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant", "user", "robot", ""]),
     "content": st.text(max_size=20) | st.text(max_size=20) | st.none() | st.integers()}),
    min_size=1, max_size=3)
PLAUSIBLE = {
    "model": st.sampled_from(["m", "n", "m", "other"]),
    "prompt": st.text(max_size=30) | ids | st.lists(st.text(max_size=10) | ids, max_size=3),
    "messages": messages,
    "max_tokens": st.integers(-2, CONTEXT + 4),
    "max_completion_tokens": st.integers(-2, CONTEXT + 4),
    "temperature": st.floats(-1, 3) | st.integers(-1, 3),
    "top_p": st.floats(-0.5, 1.5), "top_k": st.integers(-3, VOCAB + 3),
    "min_p": st.floats(-0.5, 1.5), "seed": st.integers(-5, 2**64),
    "n": st.sampled_from([1, 1, 1, 0, 2]), "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
    "stop": st.text(max_size=5) | st.lists(st.text(max_size=5), max_size=3),
    "stop_token_ids": st.lists(token, max_size=3) | ids,
    "logprobs": st.integers(-2, 25) | st.booleans(),
    "top_logprobs": st.integers(-2, 25),
    "logit_bias": st.dictionaries(st.sampled_from(["1", "7", "1", str(VOCAB - 1), "-2", "x",
                                                   str(VOCAB)]),
                                  st.floats(-200, 200) | st.floats(-200, 200)
                                  | st.text(max_size=3), max_size=2),
    "presence_penalty": st.floats(-3, 3), "frequency_penalty": st.floats(-3, 3),
    "repetition_penalty": st.floats(-1, 3), "ignore_eos": st.booleans(),
    "include_stop_str_in_output": st.booleans(),
    "structured_outputs": st.fixed_dictionaries({"regex": st.text(max_size=6)}),
    "guided_regex": st.text(max_size=6), "block_size": st.integers(-1, 10),
    "num_candidates": st.integers(-1, VOCAB + 2), "echo": st.sampled_from([False, False, True]),
    "best_of": st.sampled_from([1, 1, 1, 0, 2]), "suffix": st.none() | st.text(max_size=3),
    "response_format": st.sampled_from([{"type": "text"}, {"type": "json_object"}]),
    "add_generation_prompt": st.booleans(), "user": st.text(max_size=5),
}
NUMBERS = {"max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "min_p",
           "seed", "presence_penalty", "frequency_penalty", "repetition_penalty",
           "top_logprobs", "block_size", "num_candidates"}
OTHERS = sorted(set(OURS) | {"bogus", "Temperature", ""})


@st.composite
def bodies(draw, chat: bool):
    """Mostly well-formed bodies of the endpoint's own fields, each value now and then
    anything JSON holds, now and then a field the endpoint lacks; at times not an object."""
    # (hypothesis leans to small draws: each rare branch takes the largest value)
    if draw(st.integers(0, 19)) == 19:
        return draw(anything)
    allowed = sorted(CHAT if chat else COMPLETION)
    names = draw(st.lists(st.sampled_from(allowed), max_size=7, unique=True))
    if draw(st.integers(0, 9)) == 9:
        names.append(draw(st.sampled_from(OTHERS + sorted(COMPLETION ^ CHAT))))
    if draw(st.integers(0, 5)) != 5:
        names.insert(0, "messages" if chat else "prompt")
    body = {}
    for name in names:
        wild = draw(st.integers(0, 5)) == 5 or name not in PLAUSIBLE
        body[name] = draw(anything if wild else PLAUSIBLE[name])
    return body


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(bundled_path("stdlib-code") / "target")


@settings(max_examples=1500, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.data(), chat=st.booleans(), block=st.sampled_from([None, 1, 8]))
def test_any_body_parses_to_a_checked_request_or_a_4xx_naming_its_field(tokenizer, data,
                                                                         chat, block):
    body = data.draw(bodies(chat), label="body")
    limits = LIMITS[block]
    allowed = CHAT if chat else COMPLETION
    try:
        if chat:
            got = parse.chat(body, limits, tokenizer, CHAT_TEMPLATE)
        else:
            got = parse.completion(body, limits, tokenizer)
    except APIError as exc:
        assert exc.status in (400, 404), (exc.status, exc.message)
        sent = set(body) if isinstance(body, dict) else set()
        field = None if exc.param is None else exc.param.split("[")[0]
        assert exc.message and field in allowed | sent | {None}, (exc.param, exc.message)
        if field is not None and field not in ("prompt", "messages", "max_tokens"):
            assert field in sent, (exc.param, exc.message)           # the field at fault
        return
    assert isinstance(body, dict) and set(body) <= allowed
    for name in NUMBERS & set(body):                # a number given as true / false is refused
        assert body[name] is None or not isinstance(body[name], bool), (name, body[name])
    assert got.model in limits.model_names
    p = got.params
    assert isinstance(p, SamplingParams)
    assert p.max_tokens is not None and p.max_tokens >= 1
    for prompt in got.prompts:
        assert all(isinstance(t, int) and 0 <= t < VOCAB for t in prompt)
        assert len(prompt) + p.max_tokens <= CONTEXT
    assert math.isfinite(p.temperature) and p.temperature >= 0
    assert 0 < p.top_p <= 1 and p.top_k >= 0 and 0 <= p.min_p <= 1
    assert all(0 <= t < VOCAB for t in p.stop_token_ids)
    assert all(0 <= t < VOCAB and math.isfinite(b) for t, b in p.logit_bias.items())
    if p.num_candidates is not None:
        assert block != 1 and 1 <= p.num_candidates <= VOCAB
    if "block_size" in body:
        assert body["block_size"] == block
    if got.logprobs is not None:
        assert 0 <= got.logprobs <= 20
    regex = [body[k] for k in ("structured_outputs", "guided_regex") if body.get(k) is not None]
    assert (p.constraint is None) == (not regex)


def test_two_regex_fields_at_once_are_refused(tokenizer):
    body = {"prompt": [1], "max_tokens": 2, "structured_outputs": {"regex": "a"},
            "guided_regex": "a"}
    with pytest.raises(APIError) as info:
        parse.completion(body, LIMITS[8], tokenizer)
    assert info.value.status == 400 and info.value.param == "structured_outputs"


# Each field's domain, written out here from the API's documentation (OpenAI's and vLLM's
# ranges, docs/serving.md), independently of the parser: (value, valid?) with the edges on
# both sides. Base body: 3 prompt tokens, max_tokens 4, context 12.
BIG = 2**63
EDGES = {
    "max_tokens": [(1, True), (9, True), (10, False), (0, False), (-1, False), (True, False),
                   (2.0, False), ("3", False), (None, False)],       # None: 16, past the context
    "temperature": [(0, True), (0.0, True), (1e-30, True), (1e38, True), (2, True),
                    (-1e-9, False), (1e-50, False), (3.5e38, False), (math.nan, False),
                    (math.inf, False), (True, False), ("1", False)],
    "top_p": [(1, True), (1e-9, True), (0.5, True), (0, False), (1.0000001, False),
              (-0.5, False), (math.nan, False), (True, False), ([1], False)],
    "top_k": [(0, True), (1, True), (VOCAB + 5, True), (BIG - 1, True), (-1, True),
              (-2, False), (BIG, False), (1.0, False), (False, False)],   # -1: vLLM's "off"
    "min_p": [(0, True), (1, True), (0.5, True), (-1e-9, False), (1.0000001, False),
              (math.nan, False), (True, False)],
    "seed": [(0, True), (BIG - 1, True), (-1, False), (BIG, False), (1.5, False),
             (True, False)],
    "presence_penalty": [(-2, True), (2, True), (0.5, True), (-2.0000001, False),
                         (2.0000001, False), (math.inf, False), (False, False)],
    "frequency_penalty": [(-2, True), (2.0, True), (-2.1, False), (2.1, False),
                          (math.nan, False), ("0", False)],
    "repetition_penalty": [(1e-6, True), (1e6, True), (1, True), (0, False), (9e-7, False),
                           (1e6 + 1, False), (-1, False), (True, False)],
    "logprobs": [(0, True), (20, True), (5, True), (21, False), (-1, False), (True, False),
                 (1.0, False)],
    "stop": [("x", True), (["a", "bc"], True), ([], True), ("", False), ([""], False),
             (["a", 1], False), (3, False), ({"a": 1}, False), (["\ud800"], False)],
    "stop_token_ids": [([0, VOCAB - 1], True), ([], True), ([VOCAB], False), ([-1], False),
                       ([1.0], False), ([True], False), (5, False)],
    "logit_bias": [({"0": 100}, True), ({str(VOCAB - 1): -100}, True), ({}, True),
                   ({str(VOCAB): 1}, False), ({"-1": 1}, False), ({"x": 1}, False),
                   ({"1": 100.5}, False), ({"1": -101}, False), ({"1": True}, False),
                   ({"1": "2"}, False), ([1], False)],
    "num_candidates": [(1, True), (VOCAB, True), (0, False), (VOCAB + 1, False),
                       (2.0, False), (True, False)],
    "block_size": [(8, True), (4, False), (0, False), (True, False)],
    "ignore_eos": [(True, True), (False, True), (1, False), ("true", False)],
    "include_stop_str_in_output": [(True, True), (0, False)],
    "stream": [(True, True), (False, True), (1, False)],
    "n": [(1, True), (2, False), (0, False)],
    "best_of": [(1, True), (2, False)],
    "echo": [(False, True), (True, False)],
    "model": [("m", True), ("n", True), ("other", False), (1, False)],
    "structured_outputs": [({"regex": "a+"}, True), ({"regex": ""}, False),
                           ({"regex": 1}, False), ({"pattern": "a"}, False),
                           ({"regex": "a", "x": 1}, False), ("a+", False),
                           ({"regex": "("}, False)],
    "guided_regex": [("a+", True), ("", False), (3, False), (["a"], False), ("(", False)],
    "prompt": [([0], True), ([VOCAB - 1], True), ([1] * 8, True), ([[1, 2], [3]], True),
               ("x = 1", True), ([VOCAB], False), ([-1], False), ([1] * 9, False), ([], False),
               ("", False), ([[1], ""], False), ([True], False), ([1.0], False), (None, False),
               ([[1], [VOCAB]], False)],
}
READ = {"max_tokens": "max_tokens", "temperature": "temperature", "top_p": "top_p",
        "top_k": "top_k", "min_p": "min_p", "seed": "seed", "num_candidates": "num_candidates",
        "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty",
        "repetition_penalty": "repetition_penalty", "ignore_eos": "ignore_eos",
        "include_stop_str_in_output": "include_stop_str_in_output",
        "stop_token_ids": "stop_token_ids"}


@pytest.mark.parametrize("name,value,valid", [(n, v, ok) for n, cases in EDGES.items()
                                              for v, ok in cases],
                         ids=lambda x: repr(x)[:24])
def test_each_field_is_taken_exactly_inside_its_domain(tokenizer, name, value, valid):
    """One field set on a valid body: inside its domain the request carries the value; out
    of it, a 4xx naming the field (404 for an unknown model)."""
    body = {"model": "m", "prompt": [5, 6, 7], "max_tokens": 4, name: value}
    try:
        got = parse.completion(body, LIMITS[8], tokenizer)
    except APIError as exc:
        assert not valid, f"{name}={value!r} refused: {exc.message}"
        unknown_model = name == "model" and isinstance(value, str)
        name = "max_tokens" if value == [1] * 9 else name       # the context: max_tokens's
        assert exc.param == name and exc.status == (404 if unknown_model else 400), \
            (exc.param, exc.status, exc.message)
        return
    assert valid, f"{name}={value!r} was taken"
    p = got.params
    if name in READ:
        want = tuple(value) if isinstance(value, list) else 0 if \
            (name, value) == ("top_k", -1) else value
        assert getattr(p, READ[name]) == want and type(getattr(p, READ[name])) is not bool \
            or isinstance(value, bool), (name, getattr(p, READ[name]))
    elif name == "stop":
        assert p.stop_strings == ((value,) if isinstance(value, str) else tuple(value))
    elif name == "logit_bias":
        assert p.logit_bias == {int(k): float(b) for k, b in value.items()}
    elif name == "logprobs":
        assert got.logprobs == value == p.logprobs
    elif name == "stream":
        assert got.stream is value
    elif name == "model":
        assert got.model == value
    elif name in ("structured_outputs", "guided_regex"):
        assert p.constraint.pattern == (value["regex"] if isinstance(value, dict) else value)
    elif name == "prompt" and not isinstance(value, str):
        want = value if isinstance(value[0], list) else [value]
        assert got.prompts == [tuple(x) for x in want]


def test_a_bare_body_takes_openai_s_defaults(tokenizer):
    """What a field left out means (OpenAI's and vLLM's defaults)."""
    got = parse.completion({"prompt": [1, 2]}, ROOMY, tokenizer)
    p = got.params
    assert (got.model, got.stream, got.include_usage, got.logprobs) == ("m", False, False, None)
    assert (p.max_tokens, p.temperature, p.top_p, p.top_k, p.min_p) == (16, 1.0, 1.0, 0, 0.0)
    assert (p.presence_penalty, p.frequency_penalty, p.repetition_penalty) == (0.0, 0.0, 1.0)
    assert (p.ignore_eos, p.include_stop_str_in_output, p.logprobs) == (False, False, None)
    assert (p.stop_strings, p.stop_token_ids, p.logit_bias) == ((), (), {})
    assert p.constraint is None and p.num_candidates is None
    assert 0 <= p.seed < 2**63
    greedy = parse.completion({"prompt": [1, 2], "temperature": 0}, ROOMY, tokenizer).params
    assert greedy.seed == 0
    seeds = {parse.completion({"prompt": [1, 2], "temperature": t}, ROOMY, tokenizer)
             .params.seed for t in (1e-3, 0.5, 0.5, 1, 1.5)}
    assert len(seeds) == 5 and 0 not in seeds         # unseeded sampling: a fresh seed each
    chat = parse.chat({"messages": [{"role": "user", "content": "hi"}]}, ROOMY, tokenizer,
                      ChatTemplate("{{ messages[0].content }}"
                                   "{% if add_generation_prompt %}!{% endif %}", {}))
    assert tokenizer.decode(chat.prompts[0]) == "hi!"          # a generation prompt by default
    assert chat.params.max_tokens == 64 - len(chat.prompts[0])  # what the context leaves


def test_a_model_without_a_template_or_tokenizer_refuses_what_needs_them(tokenizer):
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    for tok, template in ((tokenizer, None), (None, CHAT_TEMPLATE), (None, None)):
        with pytest.raises(APIError) as info:
            parse.chat(chat, ROOMY, tok, template)
        assert (info.value.status, info.value.param, info.value.code) == \
            (400, "messages", "chat_template_missing")
    with pytest.raises(APIError) as info:
        parse.completion({"prompt": "def f():"}, ROOMY, None)
    assert (info.value.status, info.value.param) == (400, "prompt")
    assert "tokenizer" in info.value.message
    assert parse.completion({"prompt": [3, 4]}, ROOMY, None).prompts == [(3, 4)]


@pytest.mark.parametrize("extra,want", [
    ({"logprobs": True, "top_logprobs": 0}, 0), ({"logprobs": True, "top_logprobs": 20}, 20),
    ({"logprobs": True}, 0), ({}, None), ({"logprobs": False}, None),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"logprobs": True, "top_logprobs": -1}, "top_logprobs"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"max_completion_tokens": 5}, 5), ({"max_tokens": 6}, 6),
    ({"max_tokens": 6, "max_completion_tokens": 5}, "max_completion_tokens"),
    ({"max_completion_tokens": 0}, "max_completion_tokens")])
def test_chat_s_own_fields_at_their_edges(tokenizer, extra, want):
    """Chat's logprobs (top_logprobs only with logprobs, 0-20) and its two names of the
    output length."""
    body = {"messages": [{"role": "user", "content": "hi"}], **extra}
    try:
        got = parse.chat(body, ROOMY, tokenizer, CHAT_TEMPLATE)
    except APIError as exc:
        assert (exc.status, exc.param) == (400, want), exc.message
        return
    assert not isinstance(want, str), f"{extra} was taken"
    if "max_tokens" in extra or "max_completion_tokens" in extra:
        assert got.params.max_tokens == want
    else:
        assert got.logprobs == want == got.params.logprobs
