"""``dflash2rt bench serve``: a load generator against the server on the loopback.

Each contender (the same server speculative at the draft's block, adaptive, and target-only)
is started as a ``dflash2rt serve`` process of its own on a free 127.0.0.1 port and driven at
each concurrency by that many clients of this process (``sse_client.SSEConnection``: one
keep-alive connection each, all polled by one thread), each sending its next streamed
completion when the last one ends, until ``requests`` have been sent or ``time_limit``
seconds have passed: one run. Per request: TTFT (arrival to the first text chunk), TPOT
((end - first chunk) / (tokens - 1)), ITL (the gaps between text chunks: with speculation a
chunk may carry several tokens), and its output tokens (from the stream's usage). Per run:
request and output-token throughput over the run's wall time, the mean / p50 / p99 of each
latency, and the acceptance length from the server's /metrics counters (1 + accepted / drafts
over the run; target-only: 1).

``run()``'s reference (``Offline``: an engine in this process) is taken beside each server
figure, so the machine's drift hits both sides of a pair alike: at concurrency 1 the same
request through ``run()`` right after the server has answered it (the server idles
meanwhile), at the largest one static batch right before and one right after the run. Each
contender runs in rounds; the rows pool a contender's rounds at each concurrency.
"""

from __future__ import annotations

import json
import math
import selectors
import statistics
import time
from typing import Any, Callable, Sequence

import httpx

from .sse_client import SSEConnection

METRIC = "dflash2rt:spec_decode_num_{}_total"
PATIENCE_S = 60.0          # the least time a request may take before the run gives up


Lengths = int | Sequence[int]     # output tokens: every request's, or request k's at [k % len]


def length_of(max_tokens: Lengths, k: int) -> int:
    """Request ``k``'s output tokens (the requests of a run and of a static batch are numbered
    from 0; request k sends prompt k % len(prompts))."""
    return max_tokens if isinstance(max_tokens, int) else max_tokens[k % len(max_tokens)]


def output_lengths(spec: str, spread: int) -> Lengths:
    """``--max-tokens``: "N" (every request N tokens) or "LO:HI": ``spread`` lengths evenly
    over [LO, HI] (both ends included when ``spread`` >= 2), in a fixed shuffled order, request
    k taking the (k % spread)-th: a static batch of ``spread`` requests holds each once, as
    every ``spread`` requests of a run do. ``ValueError`` for anything else."""
    import random

    lo, sep, hi = spec.partition(":")
    try:
        a, b = int(lo), int(hi) if sep else int(lo)
    except ValueError:
        a = b = 0
    if min(a, b) < 1 or b < a or spread < 1:
        raise ValueError(f"--max-tokens takes N or LO:HI with 1 <= LO <= HI, got {spec!r}")
    if not sep:
        return a
    out = [a] if spread == 1 else [a + round(k * (b - a) / (spread - 1)) for k in range(spread)]
    random.Random(0).shuffle(out)
    return out


def percentiles(xs: Sequence[float]) -> dict[str, float]:
    """mean / p50 / p99 (nearest rank) of ``xs`` in milliseconds (0 for none)."""
    if not xs:
        return {"mean": 0.0, "p50": 0.0, "p99": 0.0}
    s = sorted(xs)
    rank = lambda q: s[max(0, math.ceil(q * len(s)) - 1)]       # noqa: E731 - nearest rank
    return {"mean": 1e3 * statistics.fmean(s), "p50": 1e3 * rank(0.5),
            "p99": 1e3 * rank(0.99)}


def _result(conn: SSEConnection, t0: float, end: float) -> dict[str, Any]:
    """One answered request's figures from its events' arrival times: TTFT, TPOT, ITL."""
    conn.raise_for_status()
    first, last, gaps, tokens = None, None, [], 0
    for now, data in conn.events:
        if data == "[DONE]":
            continue
        chunk = json.loads(data)
        if chunk.get("usage"):
            tokens = chunk["usage"]["completion_tokens"]
        if chunk["choices"] and chunk["choices"][0]["text"]:
            if first is None:
                first = now
            else:
                gaps.append(now - last)
            last = now
    if first is None:
        first = last = end
    return {"ttft": first - t0, "e2e": end - t0, "tokens": tokens, "itl": gaps,
            "tpot": (end - first) / (tokens - 1) if tokens > 1 else None}


def drive(base: str, model: str, prompts: Sequence[str], concurrency: int, requests: int,
          max_tokens: Lengths, time_limit: float,
          reference: Callable[[int], float] | None = None) -> dict[str, Any]:
    """``concurrency`` clients over ``prompts`` (round robin), greedy, ``max_tokens`` each
    (``length_of``; EOS ignored, so every request makes them all), bounded by ``requests`` and
    ``time_limit`` → the run's figures. ``reference`` (concurrency 1 only): called with the
    request's number after each answer, while nothing else runs; its per-token seconds for the
    same request land in the row's "paired" list as (server TPOT, reference) pairs, and its
    time counts neither in the run's wall time nor against ``time_limit``. One thread polls
    every client's connection (``SSEConnection``); a request unanswered after
    ``max(time_limit, PATIENCE_S)`` seconds raises ``TimeoutError``."""
    if reference is not None and concurrency != 1:
        raise ValueError("a per-request reference needs concurrency 1")
    sent, results, paired, held = 0, [], [], 0.0       # held: seconds in ``reference``
    patience = max(time_limit, PATIENCE_S)
    sel = selectors.DefaultSelector()
    conns = [SSEConnection(base, sel) for _ in range(concurrency)]
    flight: dict[SSEConnection, tuple[int, float]] = {}   # request number, when it was sent

    def send(conn: SSEConnection) -> None:
        nonlocal sent
        if sent >= requests or time.perf_counter() - held >= deadline:
            return
        k = sent
        sent += 1
        flight[conn] = (k, time.perf_counter())
        conn.send("/v1/completions", {
            "model": model, "prompt": prompts[k % len(prompts)], "stream": True,
            "max_tokens": length_of(max_tokens, k),
            "temperature": 0, "ignore_eos": True, "stream_options": {"include_usage": True}})

    before = _spec_counters(base)
    t0 = time.perf_counter()
    deadline = t0 + time_limit
    try:
        for conn in conns:
            send(conn)
        while flight:
            for key, _ in sel.select(timeout=1.0):
                conn = key.data
                if not conn.read(time.perf_counter()):
                    continue
                end = time.perf_counter()
                k, start = flight.pop(conn)
                r = _result(conn, start, end)
                results.append(r)
                if reference is not None and r["tpot"] is not None:
                    t = time.perf_counter()
                    paired.append((r["tpot"], reference(k)))
                    held += time.perf_counter() - t
                send(conn)
            now = time.perf_counter()
            if any(now - start > patience for _, start in flight.values()):
                raise TimeoutError(f"a request went unanswered for {patience:.0f} s")
        wall = time.perf_counter() - t0 - held
    finally:
        for conn in conns:
            conn.close()
        sel.close()
    after = _spec_counters(base)
    raw = {"ttft": [r["ttft"] for r in results],
           "tpot": [r["tpot"] for r in results if r["tpot"] is not None],
           "itl": [g for r in results for g in r["itl"]]}
    row = _figures(concurrency, len(results), wall, sum(r["tokens"] for r in results),
                   after["drafts"] - before["drafts"],
                   after["accepted_tokens"] - before["accepted_tokens"], raw)
    return {**row, "paired": paired} if reference is not None else row


def _figures(concurrency: int, requests: int, wall: float, tokens: int, drafts: float,
             accepted: float, raw: dict[str, list[float]]) -> dict[str, Any]:
    """A run's row (or several runs' pooled): throughput over ``wall``, the latencies' mean
    / p50 / p99 from ``raw`` (seconds: "ttft", "tpot", "itl", kept in the row), acceptance
    length 1 + ``accepted`` / ``drafts``."""
    return {"concurrency": concurrency, "requests": requests, "wall_s": wall,
            "requests_per_s": requests / wall, "output_tokens_per_s": tokens / wall,
            "output_tokens": tokens,
            "ttft_ms": percentiles(raw["ttft"]), "tpot_ms": percentiles(raw["tpot"]),
            "itl_ms": percentiles(raw["itl"]),
            "drafts": drafts, "accepted": accepted, "raw": raw,
            "acceptance_length": 1 + accepted / drafts if drafts else 1.0}


def _spec_counters(base: str) -> dict[str, float]:
    text = httpx.get(base + "/metrics", timeout=60).text
    out = {"drafts": 0.0, "accepted_tokens": 0.0}
    for key in out:
        name = METRIC.format(key)
        for line in text.splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                out[key] = float(line.rsplit(" ", 1)[1])
    return out


class Offline:
    """``run()``'s figures for the same requests, in this process on an engine of its own
    (``with Offline(...) as off``): ``block`` as a server's (an int >= 2: that fixed block; 1:
    target-only; None: adaptive over ``table``). Request k is prompt k % len(prompts) for
    ``length_of(max_tokens, k)`` tokens. ``alone(k)``: the per-token seconds of request k
    alone (its decode seconds over the tokens after the first, as TPOT counts them);
    ``static(batch)``: the output tokens per second of one static batch of requests 0 to
    ``batch`` - 1. ``warm(batch)`` runs each shape once first."""

    def __init__(self, pair: Any, backend: Any, block: int | None, prompts: Sequence[str],
                 max_tokens: Lengths, table: Any = None) -> None:
        from ..prompts import encode_prompts
        from ..engine.engine import Engine

        self.spec, self.block = block != 1, (None if block is None or block == 1 else block)
        self.ids, self.max_tokens = encode_prompts(pair, list(prompts)), max_tokens
        self.engine = Engine(pair, backend, table=table)

    def __enter__(self) -> "Offline":
        return self

    def __exit__(self, *exc) -> None:
        self.engine.close()

    def _gen(self, reqs: list) -> Any:
        return self.engine.generate(reqs, self.spec, self.block)[1]

    def _batch(self, batch: int) -> list:
        return [self._request(j) for j in range(batch)]

    def _request(self, k: int) -> Any:
        from ..engine.request import Request, SamplingParams

        params = SamplingParams(max_new_tokens=length_of(self.max_tokens, k), ignore_eos=True)
        return Request(self.ids[k % len(self.ids)], params, key=k)

    def warm(self, batch: int) -> None:
        self._gen(self._batch(1))
        self._gen(self._batch(batch))

    def alone(self, k: int) -> float:
        st = self._gen([self._request(k)])
        return (st.wall_s - st.time["prefill"]) / max(st.generated - 1, 1)

    def static(self, batch: int) -> float:
        return self._gen(self._batch(batch)).tokens_per_s


def bench_serve(start: Callable[[str], Any], baseline: Callable[[str], Offline],
                prompts: Sequence[str], concurrencies: Sequence[int], requests: int,
                max_tokens: Lengths, time_limit: float, log: Callable[[str], None],
                contenders: Sequence[str] = ("spec", "adaptive", "target-only"),
                rounds: int = 3) -> dict[str, Any]:
    """Each contender ("spec" at the draft's block, "adaptive", "target-only"; ``start(name)``:
    a context manager giving its server's ``base`` URL and ``model`` name; ``baseline(name)``:
    the ``Offline`` of its mode) in ``rounds`` rounds, each at every concurrency in turn, with
    ``run()``'s reference measured beside the server's figure, while the server idles: at
    concurrency 1 ``alone(k)`` after each request k, for the same request (the round's ratio:
    the server's mean TPOT over these requests to the references' mean), at the largest
    the mean of ``static(largest)`` right before and right after the run. The targets are the
    medians of the rounds' ratios. → {"rows": [one per contender and concurrency, its rounds
    pooled], "offline": {name: references, paired ratios and their medians}}."""
    rows, base = [], {}
    top = max(concurrencies)
    for name in contenders:
        with start(name) as server, baseline(name) as off:
            drive(server.base, server.model, prompts, 1, 2, max_tokens, time_limit)  # warm-up
            off.warm(top)
            runs: dict[int, list] = {c: [] for c in concurrencies}
            ref = {"tpot_ms": [], "tokens_per_s": [], "tpot_ratio": [], "throughput_ratio": []}
            for _ in range(rounds):
                for c in concurrencies:
                    before = off.static(top) if c == top else None
                    row = drive(server.base, server.model, prompts, c, requests, max_tokens,
                                time_limit, off.alone if c == 1 else None)
                    runs[c].append(row)
                    paired = row.pop("paired", None)    # none where every request made 1 token
                    if paired:
                        mine, theirs = zip(*paired)
                        ref["tpot_ms"].append(1e3 * statistics.fmean(theirs))
                        ref["tpot_ratio"].append(statistics.fmean(mine)
                                                 / statistics.fmean(theirs))
                    if c == top:              # bracketed: a linear drift cancels
                        ref["tokens_per_s"].append((before + off.static(top)) / 2)
                        ref["throughput_ratio"].append(row["output_tokens_per_s"]
                                                       / ref["tokens_per_s"][-1])
                    log(f"{name:12s} c={c:3d}: {row['output_tokens_per_s']:.1f} tok/s, TPOT "
                        f"mean {row['tpot_ms']['mean']:.2f} ms, acceptance length "
                        f"{row['acceptance_length']:.2f}"
                        + (f"; run() alone {ref['tpot_ms'][-1]:.2f} ms/token, paired ratio "
                           f"{ref['tpot_ratio'][-1]:.3f}" if paired else "")
                        + (f"; run() static {ref['tokens_per_s'][-1]:.1f} tok/s" if c == top
                           else ""))
        rows += [{**pooled(runs[c]), "server": name} for c in concurrencies]
        base[name] = {"batch": top, **ref, **{
            k + "_median": statistics.median(v) for k, v in ref.items() if v}}
    return {"rows": rows, "offline": base}


def pooled(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """``drive``'s rows of one server and concurrency over several rounds as one: the
    latencies of every request, throughput over the summed wall time, acceptance length
    over the summed counters."""
    row = _figures(runs[0]["concurrency"], sum(r["requests"] for r in runs),
                   sum(r["wall_s"] for r in runs), sum(r["output_tokens"] for r in runs),
                   sum(r["drafts"] for r in runs), sum(r["accepted"] for r in runs),
                   {k: [x for r in runs for x in r["raw"][k]] for k in ("ttft", "tpot", "itl")})
    del row["raw"]
    return {**row, "rounds": len(runs)}


def targets(res: dict[str, Any]) -> str:
    """The server against ``run()`` per contender (a Markdown table): TPOT at concurrency 1
    over run()'s per-token time alone, and output throughput at the largest concurrency over
    run()'s static batch of as many requests: the medians of each side over the rounds and
    the median of the paired ratios, with their range."""
    lines = ["| server | TPOT c=1 mean ms | run() alone ms/token | ratio (range) | output "
             "tok/s at the largest c | run() static batch tok/s | ratio (range) |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    span = lambda v: f"{statistics.median(v):.2f} ({min(v):.2f}–{max(v):.2f})"  # noqa: E731
    for name, off in res["offline"].items():
        mine = [r for r in res["rows"] if r["server"] == name]
        one = next((r for r in mine if r["concurrency"] == 1), None)
        big = max(mine, key=lambda r: r["concurrency"])
        cells = [name, f"{one['tpot_ms']['mean']:.2f}" if one else "–"]
        cells += [f"{off['tpot_ms_median']:.2f}", span(off["tpot_ratio"])] \
            if off["tpot_ratio"] else ["–", "–"]
        cells += [f"{big['output_tokens_per_s']:.1f}", f"{off['tokens_per_s_median']:.1f}",
                  span(off["throughput_ratio"])]
        lines.append("| " + " | ".join(cells) + " |")
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
