"""Graph replay == eager on a backend with graphs, and graph vs eager step latency (JSON)."""

from __future__ import annotations

import argparse
import json
import sys

import torch

from dflash2rt.api import resolve_model
from dflash2rt.engine.request import Request, SamplingParams
from dflash2rt.engine.compare import graph_vs_eager
from dflash2rt.registry import Registry

PROMPTS = ("def parse(self, text):\n", "import os\nimport sys\n", "class Node:\n",
           "for i in range(", "    return self.", "with open(path) as f:\n", "x = [", "if")


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
    configs = [(True, b, t) for b in (1, 3, 8) for t in ((0.0,), (0.0, 1.0))] + \
        [(False, b, (0.0, 1.0)) for b in (1, 8)]
    rows = []
    for spec, batch, temps in configs:
        def make(batch=batch, temps=temps):
            return [Request(p, SamplingParams(max_new_tokens=48, seed=i,
                                              temperature=temps[i % len(temps)]))
                    for i, p in enumerate(prompts[:batch])]
        rows.append({"batch": batch, "temperatures": temps,
                     **graph_vs_eager(pair, backend, make, spec)})
        print(json.dumps(rows[-1]))
    ok = all(r["equal"] for r in rows)
    json.dump({"backend": args.backend, "adapter": getattr(backend.graph_adapter, "name", None),
               "all_equal": ok, "rows": rows}, open(args.out, "w"), indent=2)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
