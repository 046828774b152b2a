"""``dflash2rt bench serve``: a load generator against the server on the loopback.

Each contender (the same server speculative at the draft's block, adaptive, and target-only)
is started as a ``dflash2rt serve`` process of its own on a free 127.0.0.1 port and driven at
each concurrency by that many clients of this process, each sending its next streamed completion when the last one ends, until
``requests`` have been sent or ``time_limit`` seconds have passed. Per request: TTFT (arrival
to the first text chunk), TPOT ((end - first chunk) / (tokens - 1)), ITL (the gaps between
text chunks: with speculation a chunk may carry several tokens), and its output tokens (from
the stream's usage). Per run: request and output-token throughput over the run's wall time,
the mean / p50 / p99 of each latency, and the acceptance length from the server's /metrics
counters (1 + accepted / drafts over the run; target-only: 1).
"""

from __future__ import annotations

import asyncio
import json
import math
import statistics
import time
from typing import Any, Callable, Sequence

import httpx

METRIC = "dflash2rt:spec_decode_num_{}_total"


def percentiles(xs: Sequence[float]) -> dict[str, float]:
    """mean / p50 / p99 (nearest rank) of ``xs`` in milliseconds (0 for none)."""
    if not xs:
        return {"mean": 0.0, "p50": 0.0, "p99": 0.0}
    s = sorted(xs)
    rank = lambda q: s[max(0, math.ceil(q * len(s)) - 1)]       # noqa: E731 - nearest rank
    return {"mean": 1e3 * statistics.fmean(s), "p50": 1e3 * rank(0.5),
            "p99": 1e3 * rank(0.99)}


async def _one(client: httpx.AsyncClient, url: str, body: dict) -> dict[str, Any]:
    t0 = time.perf_counter()
    first, last, gaps, tokens = None, None, [], 0
    async with client.stream("POST", url, json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"the server answered {r.status_code}: {await r.aread()!r:.200}")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: "):])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            if chunk["choices"] and chunk["choices"][0]["text"]:
                now = time.perf_counter()
                if first is None:
                    first = now
                else:
                    gaps.append(now - last)
                last = now
    end = time.perf_counter()
    if first is None:
        first = last = end
    return {"ttft": first - t0, "e2e": end - t0, "tokens": tokens, "itl": gaps,
            "tpot": (end - first) / (tokens - 1) if tokens > 1 else None}


async def drive(base: str, model: str, prompts: Sequence[str], concurrency: int,
                requests: int, max_tokens: int, time_limit: float) -> dict[str, Any]:
    """``concurrency`` clients over ``prompts`` (round robin), greedy, ``max_tokens`` each
    (EOS ignored, so every request makes them all), bounded by ``requests`` and
    ``time_limit`` → the run's figures."""
    url = base + "/v1/completions"
    sent, results = 0, []
    deadline = time.perf_counter() + time_limit

    async def client_loop(client: httpx.AsyncClient) -> None:
        nonlocal sent
        while sent < requests and time.perf_counter() < deadline:
            body = {"model": model, "prompt": prompts[sent % len(prompts)], "stream": True,
                    "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
                    "stream_options": {"include_usage": True}}
            sent += 1
            results.append(await _one(client, url, body))

    before = _spec_counters(base)
    t0 = time.perf_counter()
    async with httpx.AsyncClient(timeout=max(time_limit, 60.0)) as client:
        await asyncio.gather(*(client_loop(client) for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    after = _spec_counters(base)
    drafts = after["drafts"] - before["drafts"]
    tokens = sum(r["tokens"] for r in results)
    return {"concurrency": concurrency, "requests": len(results), "wall_s": wall,
            "requests_per_s": len(results) / wall, "output_tokens_per_s": tokens / wall,
            "output_tokens": tokens,
            "ttft_ms": percentiles([r["ttft"] for r in results]),
            "tpot_ms": percentiles([r["tpot"] for r in results if r["tpot"] is not None]),
            "itl_ms": percentiles([g for r in results for g in r["itl"]]),
            "acceptance_length": 1 + (after["accepted_tokens"] - before["accepted_tokens"])
            / drafts if drafts else 1.0}


def _spec_counters(base: str) -> dict[str, float]:
    text = httpx.get(base + "/metrics", timeout=60).text
    out = {"drafts": 0.0, "accepted_tokens": 0.0}
    for key in out:
        name = METRIC.format(key)
        for line in text.splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                out[key] = float(line.rsplit(" ", 1)[1])
    return out


def offline(pair: Any, backend: Any, block: int | None, prompts: Sequence[str],
            max_tokens: int, batch: int, singles: int = 4, table: Any = None
            ) -> dict[str, Any]:
    """``run()``'s figures for the same requests, in this process on an engine of its own:
    ``block`` as a server's (an int >= 2: that fixed block; 1: target-only; None: adaptive
    over ``table``). The per-token time of each of the first ``singles`` prompts alone (its
    decode seconds over the tokens after the first, as TPOT counts them; the median) and the
    output tokens per second of one static batch of ``batch`` requests (the prompts in
    turn), each after a warm-up call of its shape."""
    from ..api import encode_prompts
    from ..engine.engine import Engine
    from ..engine.request import Request, SamplingParams

    spec, block_size = block != 1, (None if block is None or block == 1 else block)
    params = SamplingParams(max_new_tokens=max_tokens, ignore_eos=True)
    ids = encode_prompts(pair, list(prompts))
    with Engine(pair, backend, table=table) as eng:
        gen = lambda reqs: eng.generate(reqs, spec, block_size)[1]     # noqa: E731
        gen([Request(ids[0], params)])
        per_token = []
        for i in ids[:singles]:
            st = gen([Request(i, params)])
            per_token.append((st.wall_s - st.time["prefill"]) / max(st.generated - 1, 1))
        reqs = [Request(ids[j % len(ids)], params, key=j) for j in range(batch)]
        gen(reqs)
        st = gen(reqs)
    return {"tpot_ms": 1e3 * statistics.median(per_token), "batch": batch,
            "tokens_per_s": st.tokens_per_s}


def bench_serve(start: Callable[[str], Any], baseline: Callable[[str, int], dict[str, Any]],
                prompts: Sequence[str], concurrencies: Sequence[int], requests: int,
                max_tokens: int, time_limit: float, log: Callable[[str], None],
                contenders: Sequence[str] = ("spec", "adaptive", "target-only")
                ) -> dict[str, Any]:
    """Each contender ("spec" at the draft's block, "adaptive", "target-only"; ``start(name)``:
    a context manager giving its server's ``base`` URL and ``model`` name) at every
    concurrency, then ``baseline(name, batch)`` (``offline``'s figures, with the largest
    concurrency as the static batch) → {"rows": [...], "offline": {name: ...}}."""
    rows, base = [], {}
    for name in contenders:
        with start(name) as server:
            asyncio.run(drive(server.base, server.model, prompts, 1, 2, max_tokens,
                              time_limit))                                      # warm-up
            for c in concurrencies:
                row = asyncio.run(drive(server.base, server.model, prompts, c, requests,
                                        max_tokens, time_limit))
                row["server"] = name
                log(f"{name:12s} c={c:3d}: {row['requests_per_s']:.2f} req/s, "
                    f"{row['output_tokens_per_s']:.1f} tok/s, TTFT p50 "
                    f"{row['ttft_ms']['p50']:.1f} ms, TPOT p50 {row['tpot_ms']['p50']:.2f} ms, "
                    f"acceptance length {row['acceptance_length']:.2f}")
                rows.append(row)
        base[name] = baseline(name, max(concurrencies))
        log(f"{name:12s} run(): {base[name]['tpot_ms']:.2f} ms per token alone, "
            f"{base[name]['tokens_per_s']:.1f} tok/s as a static batch of "
            f"{base[name]['batch']}")
    return {"rows": rows, "offline": base}


def targets(res: dict[str, Any]) -> str:
    """The server against ``run()``: TPOT at concurrency 1 over run()'s per-token time alone,
    and output throughput at the largest concurrency over run()'s static batch of as many
    requests, per contender (a Markdown table)."""
    lines = ["| server | TPOT c=1 mean ms | run() alone ms/token | ratio | output tok/s at the "
             "largest c | run() static batch tok/s | ratio |", "| --- | ---: | ---: | ---: | "
             "---: | ---: | ---: |"]
    for name, off in res["offline"].items():
        mine = [r for r in res["rows"] if r["server"] == name]
        one = next((r for r in mine if r["concurrency"] == 1), None)
        top = max(mine, key=lambda r: r["concurrency"])
        tpot = one["tpot_ms"]["mean"] if one else float("nan")
        lines.append(f"| {name} | {tpot:.2f} | {off['tpot_ms']:.2f} | "
                     f"{tpot / off['tpot_ms']:.2f} | {top['output_tokens_per_s']:.1f} | "
                     f"{off['tokens_per_s']:.1f} | "
                     f"{top['output_tokens_per_s'] / off['tokens_per_s']:.2f} |")
    return "\n".join(lines) + "\n"


def markdown(res: dict[str, Any]) -> str:
    """The rows as a Markdown table."""
    head = ("| server | concurrency | requests | req/s | output tok/s | TTFT mean / p50 / p99 ms "
            "| TPOT mean / p50 / p99 ms | ITL mean / p50 / p99 ms | acceptance length |\n"
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
    trio = lambda d: f"{d['mean']:.1f} / {d['p50']:.1f} / {d['p99']:.1f}"  # noqa: E731
    return head + "".join(
        f"| {r['server']} | {r['concurrency']} | {r['requests']} | {r['requests_per_s']:.2f} | "
        f"{r['output_tokens_per_s']:.1f} | {trio(r['ttft_ms'])} | {trio(r['tpot_ms'])} | "
        f"{trio(r['itl_ms'])} | {r['acceptance_length']:.2f} |\n" for r in res["rows"])
