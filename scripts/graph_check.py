"""Graph replay == eager on a backend with graphs, graph vs eager step latency, every bucket's
capture time, and (float32) the device's seeded sampled tokens == the CPU's (JSON).

Rows: speculative (adaptive) and target-only requests, greedy and sampled, plain and
watermarked, each run through a graph engine and its eager twin (``engine.compare``); the
sampled float32 rows also through the CPU backend at a fixed block (8) or target-only, seeded
T = 1 and T = 0.7 requests, unkeyed and keyed: a device's sampled tokens must equal the CPU's.
``--shard I/N`` runs rows I, I+N, ... (the device check runs shards side by side)."""

from __future__ import annotations

import argparse
import json
import sys

import torch

from dflash2rt.api import resolve_model
from dflash2rt.engine.compare import graph_vs_eager
from dflash2rt.engine.engine import Engine
from dflash2rt.engine.request import Request, SamplingParams
from dflash2rt.registry import Registry
from dflash2rt.watermark import WatermarkKey

PROMPTS = ("def parse(self, text):\n", "import os\nimport sys\n", "class Node:\n",
           "for i in range(", "    return self.", "with open(path) as f:\n", "x = [", "if")
CAPTURE_LIMIT_MS = 2000.0         # no bucket's warm-up + capture may stall a step longer
# (speculative, batch, temperatures of its requests in turn, watermarked)
CONFIGS = ([(True, b, t, False) for b in (1, 3, 8) for t in ((0.0,), (0.0, 1.0))]
           + [(False, b, (0.0, 1.0), False) for b in (1, 8)]
           + [(spec, 8, (1.0, 0.7), marked) for marked in (True, False) for spec in (True, False)])


def cpu_tokens_equal(pair, backend, model, requests, spec, key) -> dict:
    """The seeded tokens of ``requests`` on ``backend`` (graphs) and on the CPU backend, the
    same key (or none) and prompts, a fixed block (8) or target-only on both: an adaptive
    schedule chooses from each device's own step costs, and other block sizes give other
    (equally lossless) tokens. → equal, and where the first difference is."""
    tokens = []
    for p, be in ((pair, backend),
                  (resolve_model(model, "cpu", torch.float32),
                   Registry.discover().select("cpu").backend)):
        with Engine(p, be) as engine:
            outs, _ = engine.generate(requests, spec=spec, block_size=8 if spec else None,
                                      watermark=key)
        tokens.append([o.token_ids for o in outs])
    first = next(((i, next((j for j, (a, b) in enumerate(zip(x, y)) if a != b),
                           min(len(x), len(y))))
                  for i, (x, y) in enumerate(zip(*tokens)) if x != y), None)
    return {"cpu_tokens_equal": tokens[0] == tokens[1],
            "cpu_requests_equal": sum(x == y for x, y in zip(*tokens)),
            "cpu_first_difference": None if first is None else
            {"request": first[0], "token": first[1]}}


def captures(row: dict) -> dict:
    """Per graph and bucket the first call's capture milliseconds (warm-up + capture +
    checked replay), as the engine's run stats report them."""
    return {f"{g} @{size}": round(ms, 1) for g, b in row.get("graph_captures_ms", {}).items()
            for size, ms in b.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--model", default="stdlib-code")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--tokens", type=int, default=48, help="max_new_tokens of every request")
    ap.add_argument("--shard", default="0/1", help="I/N: rows I, I+N, ... of the configurations")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    index, count = (int(x) for x in args.shard.split("/"))
    backend = Registry.discover().select(args.backend).backend
    if backend.graph_adapter is None:
        print(f"{args.backend} has no graph adapter: {list(backend.standing_fallbacks)}",
              file=sys.stderr)
    pair = resolve_model(args.model, backend.device, getattr(torch, args.dtype))
    prompts = [tuple(pair.tokenizer.encode(t)) for t in PROMPTS]
    key = WatermarkKey(bytes(range(32)))        # a public test key: the tokens are compared
    rows = []
    for spec, batch, temps, marked in CONFIGS[index::count]:
        def make(batch=batch, temps=temps, n=args.tokens):
            return [Request(p, SamplingParams(max_new_tokens=n, seed=i,
                                              temperature=temps[i % len(temps)]))
                    for i, p in enumerate(prompts[:batch])]
        row = {"batch": batch, "temperatures": temps, "watermark": marked,
               **graph_vs_eager(pair, backend, make, spec, key if marked else None)}
        row["captures_ms"] = captures(row)
        if args.dtype == "float32" and min(temps) > 0:     # seeded sampled: the CPU's tokens
            row.update(cpu_tokens_equal(pair, backend, args.model, make(), spec,
                                        key if marked else None))
        rows.append(row)
        print(json.dumps(rows[-1]))
    slow = {f"{r['mode']} b{r['batch']}{' watermarked' if r['watermark'] else ''}: {k}": ms
            for r in rows for k, ms in r["captures_ms"].items() if ms > CAPTURE_LIMIT_MS}
    ok = all(r["equal"] and r.get("cpu_tokens_equal", True) for r in rows) and not slow
    json.dump({"backend": args.backend, "adapter": getattr(backend.graph_adapter, "name", None),
               "dtype": args.dtype, "shard": args.shard, "all_equal": ok,
               "capture_limit_ms": CAPTURE_LIMIT_MS, "captures_over_limit": slow,
               "rows": rows}, open(args.out, "w"), indent=2)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
