"""The server's request series (``serve.metrics.ServerMetrics``) against Prometheus's and
vLLM's definitions, written out here: a histogram's bucket ``le`` counts the observations at
most ``le`` (cumulative, ``+Inf`` = the count), ``_sum`` their total; TTFT observed for a
request that had a first token, TPOT ``(e2e - ttft) / (tokens - 1)`` for one of two tokens or
more; finished requests by reason; HTTP requests by handler, method (a few, else "other") and
status class."""

from __future__ import annotations

import random
import re

import pytest

from dflash2rt.engine.stats import RunStats
from dflash2rt.serve.metrics import BUCKETS, METHODS, REASONS, ServerMetrics

LAB = {"model_name": "m"}
# docs/serving.md, "/metrics": the bounds every histogram shares.
DOCUMENTED = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
              7.5, 10.0, 20.0, 40.0, 80.0)
SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})? (\S+)$')


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    """Every sample line → {(name, labels): value}; each family's HELP and TYPE lines first."""
    out: dict[tuple[str, frozenset], float] = {}
    declared: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name = line.split(" ")[2]
            assert name not in declared
            declared[name] = ""
        elif line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert declared[name] == ""
            declared[name] = kind
        else:
            m = SAMPLE.match(line)
            assert m, line
            name, lab, v = m.groups()
            family = re.sub(r"_(bucket|count|sum)$", "", name) \
                if name not in declared else name
            assert declared.get(family), line
            labels = frozenset(re.findall(r'([a-z_]+)="([^"]*)"', lab or ""))
            assert (name, labels) not in out
            out[(name, labels)] = float(v)
    return out


def hist(s: dict, name: str) -> tuple[dict[str, float], float, float]:
    name = "dflash2rt:" + name
    buckets = {dict(k[1])["le"]: v for k, v in s.items() if k[0] == name + "_bucket"}
    assert all(dict(k[1]).items() >= LAB.items() for k in s if k[0].startswith(name))
    return buckets, s[(name + "_count", frozenset(LAB.items()))], \
        s[(name + "_sum", frozenset(LAB.items()))]


def assert_histogram(s: dict, name: str, observed: list[float]) -> None:
    buckets, count, total = hist(s, name)
    assert list(buckets) == [repr(b) for b in DOCUMENTED] + ["+Inf"]
    for b in DOCUMENTED:
        assert buckets[repr(b)] == sum(1 for v in observed if v <= b), (name, b)
    assert buckets["+Inf"] == count == len(observed)
    assert total == pytest.approx(sum(observed), rel=1e-12, abs=1e-15)


def text(m: ServerMetrics, running: int = 0, waiting: int = 0) -> str:
    return m.text(RunStats("spec", "cpu", "cpu", 4), running, waiting)


def test_the_bounds_are_the_documented_ones():
    assert BUCKETS == DOCUMENTED
    assert list(BUCKETS) == sorted(set(BUCKETS))


def test_no_request_yet():
    s = samples(text(ServerMetrics(LAB), 0, 0))
    for name in ("time_to_first_token_seconds", "time_per_output_token_seconds",
                 "e2e_request_latency_seconds"):
        assert_histogram(s, name, [])
    for r in REASONS:
        assert s[("dflash2rt:request_success_total",
                  frozenset({**LAB, "finished_reason": r}.items()))] == 0
    assert s[("dflash2rt:prompt_tokens_total", frozenset(LAB.items()))] == 0
    assert not [k for k in s if k[0] == "http_requests_total"]


def test_values_on_every_bucket_bound_and_beside_it():
    """Each bound itself (counted in its bucket), just above it (the next one) and past the
    last (only +Inf)."""
    m = ServerMetrics(LAB)
    e2es = [b for b in DOCUMENTED] + [b * (1 + 1e-9) for b in DOCUMENTED] + [1e-4, 100.0, 0.0]
    for e in e2es:
        m.finished("length", 1, 1, None, e)
    assert_histogram(samples(text(m)), "e2e_request_latency_seconds", e2es)


def test_ttft_and_tpot_by_their_definitions():
    rng = random.Random(7)
    m = ServerMetrics(LAB)
    ttfts, tpots, e2es = [], [], []
    for _ in range(300):
        tokens = rng.choice([0, 1, 2, 3, 17])
        ttft = None if tokens == 0 or rng.random() < 0.1 else rng.uniform(0, 2)
        e2e = (ttft or 0) + rng.uniform(0, 30) * rng.choice([0.001, 0.1, 1])
        m.finished(rng.choice(REASONS), rng.randrange(50), tokens, ttft, e2e)
        e2es.append(e2e)
        if ttft is not None:
            ttfts.append(ttft)
            if tokens > 1:
                tpots.append((e2e - ttft) / (tokens - 1))
    s = samples(text(m))
    assert_histogram(s, "time_to_first_token_seconds", ttfts)
    assert_histogram(s, "time_per_output_token_seconds", tpots)
    assert_histogram(s, "e2e_request_latency_seconds", e2es)


def test_tpot_of_one_answer_exactly():
    m = ServerMetrics(LAB)
    m.finished("stop", 3, 5, 0.25, 1.25)           # 4 gaps of 0.25 s after the first token
    m.finished("stop", 3, 2, 0.5, 0.55)            # one gap of 0.05 s
    m.finished("stop", 3, 1, 0.5, 0.9)             # one token: no gap, no TPOT
    buckets, count, total = hist(samples(text(m)), "time_per_output_token_seconds")
    assert (count, total) == (2, pytest.approx(0.3))
    assert (buckets["0.04"], buckets["0.06"], buckets["0.1"], buckets["0.25"]) == (0, 1, 1, 2)


def test_requests_by_reason_and_prompt_tokens():
    rng = random.Random(3)
    m = ServerMetrics(LAB)
    want = dict.fromkeys(REASONS, 0)
    prompt = 0
    for _ in range(60):
        r, p = rng.choice(REASONS), rng.randrange(1, 400)
        m.finished(r, p, rng.randrange(3), None, 0.1)
        want[r] += 1
        prompt += p
    s = samples(text(m, 5, 9))
    for r in REASONS:
        assert s[("dflash2rt:request_success_total",
                  frozenset({**LAB, "finished_reason": r}.items()))] == want[r]
    assert s[("dflash2rt:prompt_tokens_total", frozenset(LAB.items()))] == prompt
    assert s[("dflash2rt:num_requests_running", frozenset(LAB.items()))] == 5
    assert s[("dflash2rt:num_requests_waiting", frozenset(LAB.items()))] == 9


@pytest.mark.parametrize("reason", ["", "eos", "Stop", None])
def test_an_unknown_reason_is_refused(reason):
    m = ServerMetrics(LAB)
    with pytest.raises(KeyError):
        m.finished(reason, 1, 1, None, 0.1)


def test_http_requests_by_handler_method_and_status_class():
    m = ServerMetrics(LAB)
    calls = [("/v1/completions", "POST", 200), ("/v1/completions", "POST", 299),
             ("/v1/completions", "POST", 400), ("/v1/completions", "POST", 499),
             ("/v1/completions", "POST", 500), ("/health", "GET", 200),
             ("/health", "BREW", 200), ("/health", "get", 200), ("/v1/models", "HEAD", 404),
             ("none", "PROPFIND", 405), ("/metrics", "GET", 200), ("/metrics", "GET", 200),
             ("/v1/completions", "POST", 100), ("/v1/completions", "POST", 503)]
    want: dict[tuple[str, str, str], int] = {}
    for h, meth, st in calls:
        m.http_request(h, meth, st)
        key = (h, meth if meth in METHODS else "other", f"{str(st)[0]}xx")
        want[key] = want.get(key, 0) + 1
    assert set(METHODS) == {"GET", "POST", "HEAD", "PUT", "DELETE", "PATCH", "OPTIONS"}
    s = samples(text(m))
    got = {(d["handler"], d["method"], d["status"]): v for (name, lab), v in s.items()
           if name == "http_requests_total" for d in [dict(lab)]}
    assert got == want
    assert got[("/v1/completions", "POST", "4xx")] == 2 and got[("/health", "other", "2xx")] == 2
    lines = [ln for ln in text(m).splitlines() if ln.startswith("http_requests_total{")]
    assert lines == sorted(lines, key=lambda ln: tuple(re.findall(r'"([^"]*)"', ln)))


def test_the_engine_series_come_first_and_labels_are_the_servers():
    m = ServerMetrics({"model_name": "a\"b"})
    m.finished("stop", 2, 2, 0.1, 0.2)
    out = m.text(RunStats("spec", "cpu", "cpu", 4), 1, 0)
    assert out.endswith("\n") and out.index("spec_decode") < out.index("num_requests_running")
    assert 'dflash2rt:num_requests_running{model_name="a\\"b"} 1' in out.splitlines()
