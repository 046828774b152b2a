"""``dflash2rt serve``'s HTTP API through OpenAI's own Python client: completions and chat,
streamed == whole, logprobs, structured output, every error's status and shape, /metrics
counters against what was sent; and SamplingParams under vLLM's field names."""

from __future__ import annotations

import json
import re

import httpx
import openai
import pytest

import dflash2rt
from dflash2rt.errors import ConflictingArgumentsError
from dflash2rt.serve import build_server
from dflash2rt.serve.live import LiveServer

KEY = "test-key"
MODEL = "stdlib-code"
TEMPLATE = ("{% for m in messages %}# {{ m.role }}: {{ m.content }}\n{% endfor %}"
            "{% if add_generation_prompt %}# assistant:{% endif %}")
PROMPT = "def add(a, b):"


@pytest.fixture(scope="module")
def live():
    server = build_server(MODEL, "cpu", max_num_seqs=4, max_model_len=192,
                          chat_template=TEMPLATE, api_key=KEY)
    with LiveServer(server) as s:
        yield s


@pytest.fixture(scope="module")
def client(live):
    return openai.OpenAI(base_url=live.url, api_key=KEY, max_retries=0, timeout=120)


def metrics(live) -> dict[str, float]:
    text = httpx.get(live.base + "/metrics", timeout=60).text
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


@pytest.mark.parametrize("sampling", [dict(temperature=0), dict(temperature=1.0, seed=11)])
def test_completion_streamed_equals_whole(client, live, sampling):
    kw = dict(model=MODEL, prompt=PROMPT, max_tokens=24, **sampling)
    whole = client.completions.create(**kw)
    chunks = list(client.completions.create(**kw, stream=True,
                                            stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text and text
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert reasons[-1] == whole.choices[0].finish_reason and set(reasons[:-1]) == {None}
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage
    assert whole.usage.completion_tokens <= 24
    assert whole.usage.prompt_tokens == len(live.server.pair.tokenizer.encode(PROMPT))


def test_completion_matches_the_library(client):
    """The server's tokens are run()'s with the same parameters and block."""
    got = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=20,
                                    temperature=1.0, seed=3,
                                    extra_body={"top_k": 40, "min_p": 0.05})
    ref = dflash2rt.run(MODEL, "cpu", prompts=[PROMPT], block_size=8,
                        sampling_params=dflash2rt.SamplingParams(
                            max_tokens=20, temperature=1.0, seed=3, top_k=40, min_p=0.05))
    assert got.choices[0].text == ref.texts[0]


def test_a_request_s_candidate_count_reaches_the_engine(client, live):
    """``num_candidates`` (extra_body) gives run()'s tokens at that count, counted in the
    server's stats."""
    stats = live.server.scheduler.stats
    before = stats.candidates.get(48, 0)
    got = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=16, temperature=1.0,
                                    seed=5, extra_body={"num_candidates": 48})
    ref = dflash2rt.run(MODEL, "cpu", prompts=[PROMPT], block_size=8,
                        sampling_params=dflash2rt.SamplingParams(
                            max_tokens=16, temperature=1.0, seed=5, num_candidates=48))
    assert got.choices[0].text == ref.texts[0] and ref.stats.candidates == {48: 1}
    assert stats.candidates.get(48, 0) == before + 1


def test_chat_streamed_equals_whole_with_logprobs(client):
    kw = dict(model=MODEL, messages=[{"role": "user", "content": "write a loop"}],
              max_tokens=16, temperature=1.0, seed=5, logprobs=True, top_logprobs=2)
    whole = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(**kw, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == whole.choices[0].message.content
    lps = whole.choices[0].logprobs.content
    assert len(lps) == whole.usage.completion_tokens
    assert all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in lps)
    streamed = [t for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert [t.token for t in streamed] == [t.token for t in lps]


def test_completion_logprobs_and_regex(client):
    r = client.completions.create(model=MODEL, prompt="x = ", max_tokens=12, temperature=0,
                                  logprobs=3,
                                  extra_body={"structured_outputs": {"regex": "[0-9]{1,6}"}})
    c = r.choices[0]
    assert re.fullmatch("[0-9]{1,6}", c.text) and c.finish_reason in ("stop", "length")
    assert len(c.logprobs.tokens) == len(c.logprobs.token_logprobs) == r.usage.completion_tokens
    assert all(len(top) == 3 for top in c.logprobs.top_logprobs)


def test_stop_string_cuts_stream_and_whole_alike(client):
    base = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=30, temperature=0)
    stop = base.choices[0].text.strip()[3:6]
    kw = dict(model=MODEL, prompt=PROMPT, max_tokens=30, temperature=0, stop=[stop])
    whole = client.completions.create(**kw)
    text = "".join(c.choices[0].text for c in client.completions.create(**kw, stream=True))
    assert whole.choices[0].finish_reason == "stop" and stop not in whole.choices[0].text
    assert text == whole.choices[0].text


def test_models_and_health(client, live):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert httpx.get(live.base + "/health", timeout=60).status_code == 200


ERRORS = [
    (dict(max_tokens=0), 400, "max_tokens"),
    (dict(temperature=-1), 400, "temperature"),
    (dict(top_p=1.5), 400, "top_p"),
    (dict(n=2), 400, "n"),
    (dict(logprobs=99), 400, "logprobs"),
    (dict(presence_penalty=5), 400, "presence_penalty"),
    (dict(logit_bias={"99999": 1}), 400, "logit_bias"),
    (dict(extra_body={"min_p": 2}), 400, "min_p"),
    (dict(extra_body={"block_size": 3}), 400, "block_size"),
    (dict(extra_body={"num_candidates": 0}), 400, "num_candidates"),
    (dict(extra_body={"num_candidates": 2049}), 400, "num_candidates"),
    (dict(extra_body={"num_candidates": "8"}), 400, "num_candidates"),
    (dict(extra_body={"tools": []}), 400, "tools"),
    (dict(extra_body={"structured_outputs": {"regex": "("}}), 400, "structured_outputs"),
    (dict(prompt=[5000]), 400, "prompt"),
    (dict(prompt=[1] * 200), 400, "prompt"),
    (dict(max_tokens=500), 400, "max_tokens"),
    (dict(model="no-such-model"), 404, "model"),
]


@pytest.mark.parametrize("change,status,param", ERRORS)
def test_errors_name_the_parameter(client, change, status, param):
    kw = dict(model=MODEL, prompt="x", max_tokens=4)
    kw.update(change)
    with pytest.raises(openai.APIStatusError) as info:
        client.completions.create(**kw)
    e = info.value
    assert e.status_code == status
    assert e.body["param"] == param and e.body["type"] == "invalid_request_error"
    assert e.body["message"]


def test_context_errors_say_context_length(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL, prompt=[1] * 200, max_tokens=4)
    assert info.value.body["code"] == "context_length_exceeded"
    assert "192" in info.value.body["message"]


def test_api_key_required(live):
    for key in ("wrong", None):
        headers = {} if key is None else {"Authorization": f"Bearer {key}"}
        r = httpx.post(live.url + "/completions", json={"model": MODEL, "prompt": "x"},
                       headers=headers, timeout=60)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    bad = openai.OpenAI(base_url=live.url, api_key="wrong", max_retries=0, timeout=60)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    assert httpx.get(live.base + "/metrics", timeout=60).status_code == 200   # open


def test_malformed_bodies_and_routes(live):
    auth = {"Authorization": f"Bearer {KEY}"}
    r = httpx.post(live.url + "/completions", content=b"{not json", headers=auth, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.post(live.url + "/completions", json=[1, 2], headers=auth, timeout=60)
    assert r.status_code == 400
    for depth in (100_000, 10_000):
        for nested in (b"[" * depth + b"]" * depth,
                       b'{"prompt": ' + b'{"a": ' * depth + b"1" + b"}" * depth + b"}"):
            r = httpx.post(live.url + "/completions", content=nested,
                           headers={**auth, "content-type": "application/json"}, timeout=60)
            assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
            assert "too deeply" in r.json()["error"]["message"]
    r = httpx.get(live.url + "/nowhere", headers=auth, timeout=60)
    assert r.status_code == 404 and "routes" in r.json()["error"]["message"]
    r = httpx.get(live.url + "/completions", headers=auth, timeout=60)
    assert r.status_code == 405 and "error" in r.json()


def test_metrics_count_what_was_sent(client, live):
    before = metrics(live)
    prompts = ["import os", "class A:", "for i in range(3):"]
    sent = [client.completions.create(model=MODEL, prompt=p, max_tokens=9, temperature=0,
                                      extra_body={"ignore_eos": True}) for p in prompts]
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt="x", max_tokens=0)
    after = metrics(live)
    lab = f'model_name="{MODEL}"'

    def grew(name: str) -> float:
        return after.get(name, 0) - before.get(name, 0)
    assert grew(f'dflash2rt:request_success_total{{{lab},finished_reason="length"}}') == 3
    assert grew(f"dflash2rt:prompt_tokens_total{{{lab}}}") == \
        sum(r.usage.prompt_tokens for r in sent)
    assert grew(f"dflash2rt:generation_tokens_total{{{lab}}}") == 27
    assert grew(f"dflash2rt:e2e_request_latency_seconds_count{{{lab}}}") == 3
    ok = 'http_requests_total{handler="/v1/completions",method="POST",status="%s"}'
    assert grew(ok % "2xx") == 3 and grew(ok % "4xx") == 1
    assert after[f"dflash2rt:num_requests_running{{{lab}}}"] == 0
    assert grew(f"dflash2rt:spec_decode_num_drafts_total{{{lab}}}") > 0


def test_sampling_params_take_vllm_names():
    p = dflash2rt.SamplingParams(max_tokens=12, stop=["\n\n"], top_k=-1)
    assert (p.max_new_tokens, p.stop_strings, p.top_k) == (12, ("\n\n",), 0)
    assert (p.max_tokens, p.stop) == (12, ("\n\n",))
    assert dflash2rt.SamplingParams(stop="x").stop_strings == ("x",)
    assert dflash2rt.SamplingParams(stop=None).stop_strings == ()
    assert p == dflash2rt.SamplingParams(max_new_tokens=12, stop_strings=("\n\n",))
    with pytest.raises(ConflictingArgumentsError, match="max_new_tokens"):
        dflash2rt.SamplingParams(max_tokens=3, max_new_tokens=3)
    with pytest.raises(TypeError, match="stop_strings"):
        dflash2rt.SamplingParams(stop="a", stop_strings=("b",))


def test_sse_framing(live):
    r = httpx.post(live.url + "/completions", headers={"Authorization": f"Bearer {KEY}"},
                   json={"model": MODEL, "prompt": PROMPT, "max_tokens": 5, "stream": True,
                         "temperature": 0}, timeout=60)
    assert r.headers["content-type"].startswith("text/event-stream")
    events = [e for e in r.text.split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    bodies = [json.loads(e[len("data: "):]) for e in events[:-1]]
    assert all(b["object"] == "text_completion" and b["model"] == MODEL for b in bodies)


def test_several_prompts_are_several_choices(client):
    prompts = ["import os\n", [5, 6, 7]]
    kw = dict(model=MODEL, prompt=prompts, max_tokens=8, temperature=0)
    whole = client.completions.create(**kw)
    assert [c.index for c in whole.choices] == [0, 1]
    texts = ["", ""]
    for chunk in client.completions.create(**kw, stream=True):
        for c in chunk.choices:
            texts[c.index] += c.text
    assert texts == [c.text for c in whole.choices]
    alone = client.completions.create(model=MODEL, prompt=[5, 6, 7], max_tokens=8,
                                      temperature=0)
    assert alone.choices[0].text == whole.choices[1].text


def test_chat_templates_are_found_where_models_keep_them(tmp_path):
    from dflash2rt.errors import InvalidInputError
    from dflash2rt.serve.chat import ChatTemplate, find_template, special_tokens

    assert find_template(tmp_path, None) is None
    cfg = tmp_path / "tokenizer_config.json"
    cfg.write_text(json.dumps({"chat_template": [{"name": "tools", "template": "T"},
                                                 {"name": "default", "template": "D"}],
                               "eos_token": {"content": "<e>"}, "bos_token": "<s>"}))
    assert find_template(tmp_path, None) == "D"
    assert special_tokens(tmp_path) == {"bos_token": "<s>", "eos_token": "<e>"}
    (tmp_path / "chat_template.jinja").write_text("J")
    assert find_template(tmp_path, None) == "J"
    given = tmp_path / "mine.jinja"
    given.write_text("{{ messages[0].content }}")
    assert find_template(tmp_path, str(given)) == "{{ messages[0].content }}"
    assert find_template(None, "{{ x }}") == "{{ x }}"
    with pytest.raises(InvalidInputError, match="neither a file nor"):
        find_template(None, "no-such-file.jinja")
    t = ChatTemplate("{{ bos_token }}{% for m in messages %}{{ m.role }}={{ m.content }};"
                     "{% endfor %}{% if add_generation_prompt %}>{% endif %}", {"bos_token": "^"})
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    assert t.render([{"role": "user", "content": parts}], True) == "^user=ab;>"
    from dflash2rt.serve.errors import APIError
    with pytest.raises(APIError, match="refused the messages: roles alternate") as info:
        ChatTemplate("{{ raise_exception('roles alternate') }}", {}).render(
            [{"role": "user", "content": "x"}], True)
    assert (info.value.status, info.value.param) == (400, "messages")
    with pytest.raises(APIError) as info:
        t.render([{"role": "robot", "content": "x"}], True)
    assert info.value.param == "messages[0].role"
