"""Continuous batching through the server: 32 concurrent requests with mixed parameters give
exactly the tokens each gives alone (seeded sampling with the fixed block, greedy; greedy with
adaptive blocks too); a client
that goes away mid-stream frees its row; a full queue answers 503 with Retry-After; SIGTERM
drains the request in flight and exits cleanly."""

from __future__ import annotations

import asyncio
import types
import json
import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import openai
import pytest

from dflash2rt.errors import InvalidInputError
from dflash2rt.serve import build_server
from dflash2rt.serve.live import LiveServer

MODEL = "stdlib-code"
PROMPTS = ["def add(a, b):", "import os\n", "class Stack:\n", "for i in range(10):",
           "# parse the arguments\n", "with open(path) as f:", "x = [", "return self."]
WAIT_S = 120.0


def mixed(i: int) -> dict:
    """Request i's parameters: greedy and seeded sampling under every processor, some with a
    candidate count of their own."""
    kw: dict = {"model": MODEL, "prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": 6 + i % 11}
    extra: dict = {}
    if i % 4 == 0:
        kw["temperature"] = 0
    else:
        kw.update(temperature=0.7 + 0.1 * (i % 5), seed=1000 + i)
    if i % 3 == 0:
        kw["top_p"] = 0.9
    if i % 5 == 1:
        extra["top_k"] = 20
    if i % 7 == 2:
        extra["min_p"] = 0.05
    if i % 6 == 3:
        kw.update(presence_penalty=0.5, frequency_penalty=0.3)
    if i % 8 == 5:
        extra["repetition_penalty"] = 1.2
    if i % 9 == 4:
        kw["logit_bias"] = {"10": -5}
    if i % 10 == 6:
        kw["stop"] = ["\n"]
    if i % 11 == 7:
        kw["logprobs"] = 2
    if i % 13 == 8:
        extra["structured_outputs"] = {"regex": "[a-z_ ]{1,20}"}
    if i % 5 == 3:
        extra["num_candidates"] = (4, 32, 128)[i % 3]
    if extra:
        kw["extra_body"] = extra
    return kw


@pytest.fixture(scope="module")
def live():
    with LiveServer(build_server(MODEL, "cpu", max_num_seqs=8, max_queue=64,
                                 max_model_len=256)) as s:
        yield s


@pytest.fixture(scope="module")
def one_slot():
    with LiveServer(build_server(MODEL, "cpu", max_num_seqs=1, max_queue=0,
                                 max_model_len=1024)) as s:
        yield s


def test_32_concurrent_requests_match_each_alone(live):
    async def together() -> list:
        client = openai.AsyncOpenAI(base_url=live.url, api_key="none", max_retries=0,
                                    timeout=WAIT_S)

        async def one(i: int) -> tuple[str, str]:
            if i % 2:
                chunks = [c async for c in await client.completions.create(**mixed(i),
                                                                           stream=True)]
                return ("".join(c.choices[0].text for c in chunks),
                        chunks[-1].choices[0].finish_reason)
            r = await client.completions.create(**mixed(i))
            return r.choices[0].text, r.choices[0].finish_reason
        try:
            return await asyncio.gather(*(one(i) for i in range(32)))
        finally:
            await client.close()

    concurrent = asyncio.run(together())
    client = openai.OpenAI(base_url=live.url, api_key="none", max_retries=0, timeout=WAIT_S)
    alone = []
    for i in range(32):
        r = client.completions.create(**mixed(i))
        alone.append((r.choices[0].text, r.choices[0].finish_reason))
    assert concurrent == alone
    assert len({t for t, _ in alone}) > 8          # the parameters do make a difference


def test_adaptive_blocks_keep_greedy_requests_batch_independent(monkeypatch):
    monkeypatch.setattr("dflash2rt.serve.blocks.EPOCH_ROWS", 3)   # epochs end as rows join
    server = build_server(MODEL, "cpu", max_num_seqs=4, max_model_len=256, block_size="auto")
    kws = [{"model": MODEL, "prompt": p, "max_tokens": 24 + i, "temperature": 0}
           for i, p in enumerate(PROMPTS)]
    with LiveServer(server) as live:
        async def together() -> list[str]:
            client = openai.AsyncOpenAI(base_url=live.url, api_key="none", max_retries=0,
                                        timeout=WAIT_S)
            try:
                rs = await asyncio.gather(*(client.completions.create(**kw) for kw in kws))
            finally:
                await client.close()
            return [r.choices[0].text for r in rs]
        concurrent = asyncio.run(together())
        client = openai.OpenAI(base_url=live.url, api_key="none", max_retries=0,
                               timeout=WAIT_S)
        alone = [client.completions.create(**kw).choices[0].text for kw in kws]
        with pytest.raises(openai.BadRequestError, match="adaptively"):
            client.completions.create(**kws[0], extra_body={"block_size": 8})
    assert concurrent == alone
    assert server.scheduler.stats.adaptive and server.scheduler.stats.steps > 0
    # one epoch per request alone, and together more than one: full epochs end at a join
    assert server.scheduler.blocks.epochs >= len(kws) + 2


def _metric(base: str, name: str) -> float:
    for line in httpx.get(base + "/metrics", timeout=60).text.splitlines():
        if line.startswith(name):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


ABORTS = 'dflash2rt:request_success_total{model_name="stdlib-code",finished_reason="abort"}'
RUNNING = 'dflash2rt:num_requests_running{model_name="stdlib-code"}'


def _long_stream(base: str):
    return httpx.stream("POST", base + "/v1/completions", timeout=WAIT_S, json={
        "model": MODEL, "prompt": "import os\n", "max_tokens": 1000, "temperature": 0,
        "ignore_eos": True, "stream": True})


def test_full_queue_is_503_with_retry_after_and_cancel_frees_the_row(one_slot):
    base = one_slot.base
    aborts = _metric(base, ABORTS)
    with _long_stream(base) as r:
        lines = r.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))   # decoding now
        client = openai.OpenAI(base_url=one_slot.url, api_key="none", max_retries=0,
                               timeout=WAIT_S)
        with pytest.raises(openai.InternalServerError) as info:
            client.completions.create(model=MODEL, prompt="x", max_tokens=2)
        assert info.value.status_code == 503
        assert info.value.response.headers["Retry-After"] == "1"
        assert info.value.body["code"] == "server_overloaded"
    deadline = time.monotonic() + WAIT_S            # the client left: its row is freed
    while _metric(base, RUNNING) or _metric(base, ABORTS) == aborts:
        assert time.monotonic() < deadline, "the cancelled request kept its row"
        time.sleep(0.05)
    assert _metric(base, ABORTS) == aborts + 1
    r = client.completions.create(model=MODEL, prompt="x", max_tokens=2, temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_sigterm_drains_the_request_in_flight():
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "dflash2rt", "serve", MODEL, "--backend",
                             "cpu", "--port", str(port), "--max-model-len", "1024",
                             "--log-level", "warning"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + WAIT_S
        while True:
            assert proc.poll() is None, proc.stdout.read().decode()
            assert time.monotonic() < deadline, "the server did not come up"
            try:
                if httpx.get(base + "/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        events = []
        with httpx.stream("POST", base + "/v1/completions", timeout=WAIT_S, json={
                "model": MODEL, "prompt": "import os\n", "max_tokens": 300, "temperature": 0,
                "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}}) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    if not events:
                        proc.send_signal(signal.SIGTERM)
                    events.append(line[len("data: "):])
        assert events[-1] == "[DONE]"
        assert json.loads(events[-2])["usage"]["completion_tokens"] == 300
        assert proc.wait(WAIT_S) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()


def test_a_spawned_server_serves_and_exits_cleanly_and_a_bad_one_says_why():
    """bench serve's servers: ``dflash2rt serve`` processes (the engine loop on their main
    thread, uvicorn beside it); leaving the block drains and exits 0. One that cannot start
    raises with what it printed."""
    from dflash2rt.serve.live import SpawnedServer

    with SpawnedServer([MODEL, "--backend", "cpu", "--max-num-seqs", "2",
                        "--max-model-len", "256"]) as s:
        assert s.model == MODEL
        r = httpx.post(s.base + "/v1/completions", timeout=WAIT_S, json={
            "model": s.model, "prompt": "import os\n", "max_tokens": 5, "temperature": 0,
            "ignore_eos": True})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 5
    assert s.proc.returncode == 0
    with pytest.raises(RuntimeError, match="max_num_seqs|max-num-seqs|slots"):
        with SpawnedServer([MODEL, "--backend", "cpu", "--max-num-seqs", "0"]):
            pass


def test_a_failing_step_fails_its_batch_and_the_server_goes_on(one_slot):
    runner = one_slot.server.engine.runner
    client = openai.OpenAI(base_url=one_slot.url, api_key="none", max_retries=0,
                           timeout=WAIT_S)

    def failing(*args, **kwargs):
        raise RuntimeError("injected step failure")
    runner.step = failing
    try:
        with pytest.raises(openai.InternalServerError) as info:
            client.completions.create(model=MODEL, prompt="x", max_tokens=20, temperature=0,
                                      extra_body={"ignore_eos": True})
    finally:
        del runner.step                     # the class's own again
    assert info.value.status_code == 500 and "injected" in info.value.body["message"]
    assert info.value.body["code"] == "engine_error"
    r = client.completions.create(model=MODEL, prompt="x", max_tokens=20, temperature=0,
                                  extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 20
    assert httpx.get(one_slot.base + "/health", timeout=60).status_code == 200


def test_a_client_that_got_its_answer_may_send_the_next_at_once(one_slot):
    """One slot, no queue: a request whose answer (or error) has reached its client holds no
    slot any more, even before the engine loop's next turn drops its row; a client sending
    its next request at once is never refused."""
    client = openai.OpenAI(base_url=one_slot.url, api_key="none", max_retries=0,
                           timeout=WAIT_S)
    sched = one_slot.server.scheduler
    drop = sched._drop

    def slow_drop():                 # the loop's turn comes late: the client is faster
        time.sleep(0.2)
        drop()
    sched._drop = slow_drop
    try:
        for i in range(4):
            r = client.completions.create(model=MODEL, prompt="x", max_tokens=1 + i % 3,
                                          temperature=0, extra_body={"ignore_eos": True})
            assert r.usage.completion_tokens == 1 + i % 3
    finally:
        del sched._drop


def test_kv_budget_lowers_the_batch():
    gib = 4 * 2**20 / 2**30
    small = build_server(MODEL, "cpu", max_num_seqs=64, max_model_len=256, kv_cache_gib=gib)
    large = build_server(MODEL, "cpu", max_num_seqs=64, max_model_len=256,
                         kv_cache_gib=2 * gib)
    a, b = small.scheduler.slots, large.scheduler.slots
    assert 1 <= a < b <= 2 * a + 1 < 64
    with pytest.raises(InvalidInputError, match="kv_cache_gib"):
        build_server(MODEL, "cpu", max_model_len=256, kv_cache_gib=1e-6)


def test_chat_without_a_template_is_a_clear_400(one_slot):
    client = openai.OpenAI(base_url=one_slot.url, api_key="none", max_retries=0,
                           timeout=WAIT_S)
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    assert info.value.body["code"] == "chat_template_missing"
    assert "--chat-template" in info.value.body["message"]


def test_bench_serve_drives_the_server_and_reports(live):
    from dflash2rt.serve.load import drive, markdown, percentiles

    row = drive(live.base, MODEL, PROMPTS, concurrency=3, requests=5, max_tokens=7,
                time_limit=WAIT_S)
    assert row["requests"] == 5 and row["output_tokens"] == 35
    assert row["acceptance_length"] >= 1 and row["requests_per_s"] > 0
    assert all(set(row[k]) == {"mean", "p50", "p99"} for k in ("ttft_ms", "tpot_ms", "itl_ms"))
    got = percentiles([0.001, 0.002, 0.003, 0.1])
    assert got == pytest.approx({"mean": 26.5, "p50": 2.0, "p99": 100.0})
    assert percentiles([]) == {"mean": 0.0, "p50": 0.0, "p99": 0.0}
    assert percentiles([0.005]) == pytest.approx({"mean": 5.0, "p50": 5.0, "p99": 5.0})
    assert "| spec | 3 | 5 |" in markdown({"rows": [{**row, "server": "spec"}]})
    from dflash2rt.serve.load import _spec_counters

    before = _spec_counters(live.base)
    assert before["drafts"] > 0                           # the first run's steps counted
    mixed = drive(live.base, MODEL, PROMPTS, concurrency=2, requests=7, max_tokens=[3, 9, 5],
                  time_limit=WAIT_S)                      # request k: [3, 9, 5][k % 3] tokens
    after = _spec_counters(live.base)
    assert mixed["requests"] == 7 and mixed["output_tokens"] == 3 + 9 + 5 + 3 + 9 + 5 + 3
    for r in (row, mixed):                                # rates over the run's wall time
        assert r["requests_per_s"] == pytest.approx(r["requests"] / r["wall_s"])
        assert r["output_tokens_per_s"] == pytest.approx(r["output_tokens"] / r["wall_s"])
    assert mixed["drafts"] == after["drafts"] - before["drafts"] > 0   # this run's only
    assert mixed["accepted"] == after["accepted_tokens"] - before["accepted_tokens"]
    assert mixed["acceptance_length"] == pytest.approx(
        1 + mixed["accepted"] / mixed["drafts"])


def test_the_speculation_counters_are_read_off_metrics_and_absent_ones_are_zero(monkeypatch):
    from dflash2rt.serve import load

    text = ('# HELP dflash2rt:spec_decode_num_drafts_total x\n'
            'dflash2rt:spec_decode_num_drafts_total{model_name="m"} 12.0\n'
            'dflash2rt:spec_decode_num_draft_tokens_total{model_name="m"} 96.0\n'
            'dflash2rt:spec_decode_num_accepted_tokens_total 40.0\n')
    pages = {"a": text, "b": "# nothing here\n"}
    monkeypatch.setattr(load.httpx, "get", lambda url, timeout: types.SimpleNamespace(
        text=pages[url.split("/")[0]]))
    assert load._spec_counters("a") == {"drafts": 12.0, "accepted_tokens": 40.0}
    assert load._spec_counters("b") == {"drafts": 0.0, "accepted_tokens": 0.0}


def test_output_lengths_spread_evenly_and_a_static_batch_holds_each_once(live):
    from dflash2rt.serve.load import Offline, length_of, output_lengths

    assert output_lengths("48", 16) == 48 and length_of(48, 5) == 48
    spread = output_lengths("16:80", 16)
    assert sorted(spread) == [16 + round(k * 64 / 15) for k in range(16)]
    assert spread == output_lengths("16:80", 16) and sum(spread) / 16 == 48
    assert output_lengths("7:9", 1) == [7] and output_lengths("5:5", 3) == [5, 5, 5]
    assert sorted(output_lengths("1:3", 3)) == [1, 2, 3]
    assert [length_of(spread, k) for k in range(18)] == spread + spread[:2]
    for bad in ("", "x", "0", "-3", "4:2", "1:", ":4", "1:2:3"):
        with pytest.raises(ValueError, match="N or LO:HI"):
            output_lengths(bad, 4)
    srv = live.server
    with Offline(srv.pair, srv.engine.backend, srv.limits.block, PROMPTS[:2], [3, 9, 5],
                 table=srv.engine.table) as off:
        reqs = off._batch(4)
        assert [r.params.max_new_tokens for r in reqs] == [3, 9, 5, 3]
        assert all(r.params.ignore_eos and r.params.temperature == 0 for r in reqs)
        assert [r.prompt_ids for r in reqs] == [off.ids[0], off.ids[1]] * 2
        assert off._gen(reqs).generated == 20
        off._gen = lambda reqs: types.SimpleNamespace(wall_s=1.5, time={"prefill": 0.25},
                                                      generated=6, tokens_per_s=123.0)
        assert off.alone(0) == pytest.approx(1.25 / 5)    # decode seconds per later token
        assert off.static(4) == 123.0
        off._gen = lambda reqs: types.SimpleNamespace(wall_s=1.5, time={"prefill": 0.25},
                                                      generated=2, tokens_per_s=1.0)
        assert off.alone(0) == pytest.approx(1.25)         # one token after the first
    from dflash2rt.serve.load import _figures

    raw = {"ttft": [], "tpot": [], "itl": []}
    assert _figures(1, 2, 1.0, 10, 0.0, 0.0, raw)["acceptance_length"] == 1.0   # no drafts
    assert _figures(1, 2, 1.0, 10, 4.0, 6.0, raw)["acceptance_length"] == 2.5
    from dflash2rt.serve.load import pooled

    one = {**_figures(3, 2, 2.0, 10, 4.0, 6.0, {"ttft": [0.1], "tpot": [0.2], "itl": [0.3]})}
    alone = pooled([one])                                  # one round pools to itself
    assert (alone["concurrency"], alone["requests"], alone["rounds"]) == (3, 2, 1)
    assert alone["output_tokens_per_s"] == 5.0 and "raw" not in alone
    for block, spec, fixed in ((1, False, None), (8, True, 8), (None, True, None)):
        with Offline(srv.pair, srv.engine.backend, block, PROMPTS[:1], 4,
                     table=srv.engine.table) as off:            # target-only, 8, adaptive
            assert (off.spec, off.block) == (spec, fixed)


def test_bench_serve_pairs_each_request_with_its_reference_at_concurrency_1(live):
    """At concurrency 1 the reference runs after each answer, for the same request; its time
    counts neither in the run's wall time nor against the time limit."""
    import time

    from dflash2rt.serve.load import drive

    asked = []

    def reference(i: int) -> float:
        asked.append(i)
        time.sleep(0.25)
        return 0.5 + i

    t0 = time.perf_counter()
    row = drive(live.base, MODEL, PROMPTS[:3], concurrency=1, requests=5, max_tokens=5,
                time_limit=WAIT_S, reference=reference)
    outer = time.perf_counter() - t0
    assert asked == [0, 1, 2, 3, 4] and row["requests"] == 5     # request k: prompt k % 3
    assert [ref for _, ref in row["paired"]] == [0.5, 1.5, 2.5, 3.5, 4.5]
    assert [tpot for tpot, _ in row["paired"]] == pytest.approx(row["raw"]["tpot"])
    assert 0 < row["wall_s"] <= outer - 5 * 0.25
    with pytest.raises(ValueError, match="concurrency 1"):
        drive(live.base, MODEL, PROMPTS, 2, 2, 5, WAIT_S, reference=reference)


def test_bench_serve_pairs_each_server_run_with_its_run_reference(live):
    """bench serve in rounds: each request at concurrency 1 beside run()'s time for it alone,
    each run at the largest beside run()'s static batch measured right after it; the rows
    pool the rounds; the targets are the medians of the rounds' paired ratios."""
    import contextlib
    import re

    from dflash2rt.serve.load import Offline, bench_serve, targets

    srv, lines, statics = live.server, [], []

    def baseline(name: str) -> Offline:
        off = Offline(srv.pair, srv.engine.backend, srv.limits.block, PROMPTS, max_tokens=6,
                      table=srv.engine.table)
        real = off.static
        off.static = lambda batch: statics.append(real(batch)) or statics[-1]
        return off
    res = bench_serve(lambda name: contextlib.nullcontext(
                          type("S", (), {"base": live.base, "model": MODEL})),
                      baseline,
                      PROMPTS, [1, 3], requests=4, max_tokens=6, time_limit=WAIT_S,
                      log=lines.append, contenders=("spec",), rounds=2)
    one, three = res["rows"]
    assert (one["concurrency"], three["concurrency"]) == (1, 3)
    assert one["rounds"] == three["rounds"] == 2 and one["requests"] == three["requests"] == 8
    assert one["output_tokens"] == 48 and one["acceptance_length"] >= 1
    off = res["offline"]["spec"]
    assert len(off["tpot_ratio"]) == len(off["throughput_ratio"]) == 2
    assert len(lines) == 4 and all(r > 0 for r in off["tpot_ratio"] + off["throughput_ratio"])
    for line, ratio in zip([x for x in lines if "c=  1" in x], off["tpot_ratio"]):
        tpot, alone = map(float, re.findall(r"TPOT mean ([\d.]+) ms.*alone ([\d.]+)", line)[0])
        assert ratio == pytest.approx(tpot / alone, rel=0.02, abs=0.01), line
        assert f"paired ratio {ratio:.3f}" in line
    assert "paired" not in one
    assert len(statics) == 4                # one before and one after each round's run at 3
    assert off["tokens_per_s"] == pytest.approx([(statics[0] + statics[1]) / 2,
                                                 (statics[2] + statics[3]) / 2])
    for line, ratio in zip([x for x in lines if "c=  3" in x], off["throughput_ratio"]):
        tok, static = map(float, re.findall(r"([\d.]+) tok/s.*static ([\d.]+)", line)[0])
        assert ratio == pytest.approx(tok / static, rel=0.02), line
    cells = [c.strip() for c in targets(res).splitlines()[2].strip("|").split("|")]
    assert cells[0] == "spec" and cells[1] == f"{one['tpot_ms']['mean']:.2f}"
    assert cells[4] == f"{three['output_tokens_per_s']:.1f}"
    for cell, ratios in ((cells[3], off["tpot_ratio"]), (cells[6], off["throughput_ratio"])):
        assert cell == f"{sum(ratios) / 2:.2f} ({min(ratios):.2f}–{max(ratios):.2f})", cells


def test_the_command_lines_parse():
    from dflash2rt.cli import build_parser

    a = build_parser().parse_args(["serve", "stdlib-code", "--block-size", "auto", "--port",
                                   "9000", "--api-key", "k", "--max-num-seqs", "4"])
    assert (a.model, a.block_size, a.port, a.api_key, a.max_num_seqs, a.host) == \
        ("stdlib-code", "auto", 9000, "k", 4, "127.0.0.1")
    assert build_parser().parse_args(["serve", "--block-size", "4"]).block_size == 4
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--block-size", "big"])
    b = build_parser().parse_args(["bench", "serve", "--concurrency", "1,4", "--requests", "8"])
    assert b.tool == "serve" and (b.concurrency, b.requests) == ("1,4", 8)
    c = build_parser().parse_args(["serve", "--stream-interval", "4"])
    assert c.stream_interval == 4 and build_parser().parse_args(["serve"]).stream_interval == 1
    d = build_parser().parse_args(["bench", "serve", "--servers", "target-only",
                                   "--stream-interval", "4"])
    assert (d.servers, d.stream_interval) == ("target-only", 4)


@pytest.mark.parametrize("flags, says", [
    (["--servers", "spec,fast"], "--servers takes distinct names"),
    (["--servers", "spec,spec"], "--servers takes distinct names"),
    (["--stream-interval", "0"], "--stream-interval must be positive"),
    (["--max-tokens", "0"], "--max-tokens takes N or LO:HI"),
    (["--max-tokens", "9:8"], "--max-tokens takes N or LO:HI"),
    (["--max-tokens", "0:8"], "--max-tokens takes N or LO:HI"),
    (["--max-tokens", "8:x"], "--max-tokens takes N or LO:HI"),
    (["--max-tokens", "8-16"], "--max-tokens takes N or LO:HI"),
])
def test_bench_serve_refuses_bad_flags_before_starting_anything(flags, says):
    from dflash2rt.cli import build_parser

    args = build_parser().parse_args(["bench", "serve", *flags])
    with pytest.raises(InvalidInputError, match=says):
        args.func(args)


def test_the_targets_table_without_concurrency_1_leaves_its_cells_empty():
    from dflash2rt.serve.load import targets

    res = {"rows": [{"server": "spec", "concurrency": 16, "output_tokens_per_s": 1234.5,
                     "tpot_ms": {"mean": 9.0}}],
           "offline": {"spec": {"tpot_ratio": [], "throughput_ratio": [0.9, 1.1, 1.3],
                                "tokens_per_s_median": 1000.0}}}
    row = targets(res).splitlines()[2]
    assert row == "| spec | – | – | – | 1234.5 | 1000.0 | 1.10 (0.90–1.30) |"
