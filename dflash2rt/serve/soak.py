"""A soak of the server: many requests from concurrent clients with mixed lengths and
parameters, streamed and not, completions and chat, clients that leave mid-stream, and
malformed requests. Every answer is checked: no 5xx, a malformed request a 4xx in OpenAI's
error shape, a completed response well formed (text, finish reason, usage within max_tokens,
logprobs per token, a streamed response ending in [DONE]); every request bounded in time; and
after the run no request is left running or waiting. ``soak`` returns what it saw, with the
process's resident memory after warm-up and at the end (the server runs in this process)."""

from __future__ import annotations

import asyncio
import json
import random
import re
import time
from typing import Any

import httpx

MALFORMED = [
    b"{not json", b"[1, 2]", json.dumps({"prompt": "x", "max_tokens": -3}).encode(),
    json.dumps({"prompt": "x", "temperature": "hot"}).encode(),
    json.dumps({"prompt": "x", "frobnicate": 1}).encode(),
    json.dumps({"prompt": "x", "model": "no-such-model"}).encode(),
    json.dumps({"prompt": "x", "max_tokens": 10 ** 6}).encode(),
    json.dumps({"prompt": [], "max_tokens": 2}).encode(),
    json.dumps({"prompt": "x", "stop": [1]}).encode(),
    json.dumps({"prompt": "x", "structured_outputs": {"regex": "(("}}).encode(),
]
REGEX, REGEX_PREFIX = "[a-z ]{1,30}", "[a-z ]{0,30}"     # a cut output is a prefix of a match
PROMPTS = ["def add(a, b):", "import os\n", "class Stack:\n", "for i in range(10):",
           "# parse the arguments\n", "with open(path) as f:", "x = [", "return self."]


def rss_bytes() -> int:
    """This process's resident set size (Linux /proc; 0 where there is none)."""
    try:
        with open("/proc/self/statm") as f:
            import os
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


def _request(rng: random.Random, chat: bool) -> dict[str, Any]:
    body: dict[str, Any] = {"max_tokens": rng.choice([1, 2, 5, 12, 24, 48]),
                            "stream": rng.random() < 0.5}
    if chat:
        body["messages"] = [{"role": "user", "content": rng.choice(PROMPTS)}]
    else:
        body["prompt"] = rng.choice(PROMPTS)
    if rng.random() < 0.5:
        body.update(temperature=rng.choice([0.5, 0.8, 1.0]), seed=rng.randrange(10 ** 6))
    else:
        body["temperature"] = 0
    extra = rng.choice([{}, {"top_k": 20}, {"top_p": 0.9}, {"min_p": 0.1},
                        {"presence_penalty": 0.5}, {"repetition_penalty": 1.3},
                        {"stop": ["\n"]}, {"logit_bias": {"5": -10}},
                        {"structured_outputs": {"regex": REGEX}}])
    body.update(extra)
    if rng.random() < 0.2:
        body.update({"logprobs": True, "top_logprobs": 2} if chat else {"logprobs": 2})
    if body["stream"] and rng.random() < 0.5:
        body["stream_options"] = {"include_usage": True}
    return body


def _check(body: dict, answer: dict, chat: bool) -> str | None:
    """What is wrong with a completed answer, or None."""
    c = answer["choices"][0]
    text = c["message"]["content"] if chat else c["text"]
    if not isinstance(text, str) or c["finish_reason"] not in ("stop", "length"):
        return f"bad choice {c!r:.200}"
    use = answer["usage"]
    if use is not None and not 0 <= use["completion_tokens"] <= body["max_tokens"]:
        return f"usage {use} beyond max_tokens {body['max_tokens']}"
    if body.get("structured_outputs") and not re.fullmatch(REGEX_PREFIX, text):
        return f"{text!r} breaks the regex {REGEX}"
    return None


async def _one(client: httpx.AsyncClient, url: str, rng: random.Random, model: str,
               chat: bool, stats: dict) -> None:
    kind = rng.random()
    if kind < 0.1:                                       # malformed
        r = await client.post(url + "/completions", content=rng.choice(MALFORMED),
                              headers={"content-type": "application/json"})
        ok = 400 <= r.status_code < 500 and "message" in r.json().get("error", {})
        stats["malformed"] += 1
        if not ok:
            stats["failures"].append(f"malformed → {r.status_code} {r.text[:200]}")
        return
    body = {"model": model, **_request(rng, chat)}
    path = url + ("/chat/completions" if chat else "/completions")
    leave = body["stream"] and kind < 0.25               # a client that leaves mid-stream
    if not body["stream"]:
        r = await client.post(path, json=body)
        if r.status_code != 200:
            stats["failures"].append(f"{r.status_code}: {r.text[:200]}")
            return
        problem = _check(body, r.json(), chat)
    else:
        problem, parts = None, []
        async with client.stream("POST", path, json=body) as r:
            if r.status_code != 200:
                stats["failures"].append(f"{r.status_code}: {(await r.aread())[:200]!r}")
                return
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    parts.append(line[6:])
                    if leave and len(parts) >= 2:
                        stats["cancelled"] += 1
                        return
        if parts[-1] != "[DONE]":
            problem = f"stream ended without [DONE]: {parts[-1]!r:.200}"
        else:
            chunks = [json.loads(p) for p in parts[:-1]]
            last = next(c for c in reversed(chunks) if c["choices"])
            use = chunks[-1]["usage"] if body.get("stream_options") else None
            if last["choices"][0]["finish_reason"] not in ("stop", "length"):
                problem = f"stream ended with {last!r:.200}"
            elif use is not None and not 0 <= use["completion_tokens"] <= body["max_tokens"]:
                problem = f"usage {use} beyond max_tokens {body['max_tokens']}"
    stats["completed"] += problem is None
    if problem:
        stats["failures"].append(problem)


async def soak(base: str, model: str, total: int, clients: int, seed: int, chat: bool,
               time_limit: float, warm_up: int) -> dict[str, Any]:
    """``total`` requests from ``clients`` concurrent clients → counts, failures, RSS after
    the first ``warm_up`` requests and at the end, and the wall time."""
    rng = random.Random(seed)
    stats: dict[str, Any] = {"completed": 0, "cancelled": 0, "malformed": 0, "failures": [],
                             "sent": 0, "rss_warm": 0}
    deadline = time.monotonic() + time_limit
    url = base + "/v1"

    async def client_loop(client: httpx.AsyncClient, r: random.Random) -> None:
        while stats["sent"] < total:
            if time.monotonic() > deadline:
                stats["failures"].append("time limit reached: the soak did not finish")
                return
            stats["sent"] += 1
            if stats["sent"] == warm_up:
                stats["rss_warm"] = rss_bytes()
            try:
                await _one(client, url, r, model, chat and r.random() < 0.3, stats)
            except (httpx.HTTPError, ValueError, KeyError) as exc:
                stats["failures"].append(f"{type(exc).__name__}: {exc}")

    t0 = time.monotonic()
    async with httpx.AsyncClient(timeout=120.0) as client:
        await asyncio.gather(*(client_loop(client, random.Random(rng.random()))
                               for _ in range(clients)))
        for _ in range(200):                             # the cancelled rows drain
            m = (await client.get(base + "/metrics")).text
            left = sum(float(line.rsplit(" ", 1)[1]) for line in m.splitlines()
                       if line.startswith(("dflash2rt:num_requests_running",
                                           "dflash2rt:num_requests_waiting")))
            if left == 0:
                break
            await asyncio.sleep(0.1)
        else:
            stats["failures"].append(f"{left} requests still running or waiting at the end")
    stats.update(wall_s=time.monotonic() - t0, rss_end=rss_bytes())
    return stats
