"""Graph replay == eager on a backend with graphs, and graph vs eager step latency (JSON)."""

from __future__ import annotations

import argparse
import json
import sys

import torch

from dflash2rt.api import resolve_model
from dflash2rt.engine.engine import Engine
from dflash2rt.engine.request import Request, SamplingParams
from dflash2rt.engine.compare import graph_vs_eager
from dflash2rt.registry import Registry
from dflash2rt.watermark import WatermarkKey

PROMPTS = ("def parse(self, text):\n", "import os\nimport sys\n", "class Node:\n",
           "for i in range(", "    return self.", "with open(path) as f:\n", "x = [", "if")


def same_tokens_as_cpu(pair, backend, model, requests, spec, key) -> bool:
    """The watermarked tokens of ``requests`` on ``backend`` (graphs) equal the CPU backend's
    for the same key and prompts. A fixed block (8) on both: an adaptive schedule chooses from
    each device's own step costs, and other block sizes give other (equally lossless) tokens."""
    tokens = []
    for p, be in ((pair, backend),
                  (resolve_model(model, "cpu", torch.float32),
                   Registry.discover().select("cpu").backend)):
        with Engine(p, be) as engine:
            outs, _ = engine.generate(requests, spec=spec, block_size=8 if spec else None,
                                      watermark=key)
        tokens.append([o.token_ids for o in outs])
    return tokens[0] == tokens[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--model", default="stdlib-code")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    backend = Registry.discover().select(args.backend).backend
    if backend.graph_adapter is None:
        print(f"{args.backend} has no graph adapter: {list(backend.standing_fallbacks)}",
              file=sys.stderr)
    pair = resolve_model(args.model, backend.device, getattr(torch, args.dtype))
    prompts = [tuple(pair.tokenizer.encode(t)) for t in PROMPTS]
    configs = [(True, b, t, False) for b in (1, 3, 8) for t in ((0.0,), (0.0, 1.0))] + \
        [(False, b, (0.0, 1.0), False) for b in (1, 8)] + \
        [(spec, 8, (1.0, 0.7), True) for spec in (True, False)]       # watermarked
    key = WatermarkKey(bytes(range(32)))        # a public test key: the tokens are compared
    rows = []
    for spec, batch, temps, marked in configs:
        def make(batch=batch, temps=temps):
            return [Request(p, SamplingParams(max_new_tokens=48, seed=i,
                                              temperature=temps[i % len(temps)]))
                    for i, p in enumerate(prompts[:batch])]
        row = {"batch": batch, "temperatures": temps, "watermark": marked,
               **graph_vs_eager(pair, backend, make, spec, key if marked else None)}
        if marked and args.dtype == "float32":   # same key + prompt: the CPU's tokens
            row["cpu_tokens_equal"] = same_tokens_as_cpu(pair, backend, args.model, make(), spec,
                                                         key)
        rows.append(row)
        print(json.dumps(rows[-1]))
    ok = all(r["equal"] and r.get("cpu_tokens_equal", True) for r in rows)
    json.dump({"backend": args.backend, "adapter": getattr(backend.graph_adapter, "name", None),
               "all_equal": ok, "rows": rows}, open(args.out, "w"), indent=2)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
