"""Graph replay == eager on a backend with graphs, and graph vs eager step latency (JSON)."""

from __future__ import annotations

import argparse
import copy
import json
import sys

import torch

from dflash2rt.api import resolve_model
from dflash2rt.engine.engine import Engine
from dflash2rt.engine.request import Request, SamplingParams
from dflash2rt.registry import Registry


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--model", default="stdlib-code")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    graphed = Registry.discover().select(args.backend).backend
    if graphed.graph_adapter is None:
        print(f"{args.backend} has no graph adapter: {graphed.fallbacks}", file=sys.stderr)
    eager = copy.copy(graphed)
    eager.graph_adapter, eager.fallbacks = None, []
    pair = resolve_model(args.model, graphed.device, getattr(torch, args.dtype))
    prompts = [tuple(pair.tokenizer.encode(t)) for t in
               ("def parse(self, text):\n", "import os\nimport sys\n", "class Node:\n",
                "for i in range(", "    return self.", "with open(path) as f:\n", "x = [", "if")]
    results = []
    for spec, batch, temps in [(True, b, t) for b in (1, 3, 8) for t in ((0.0,), (0.0, 1.0))] + \
        [(False, b, (0.0, 1.0)) for b in (1, 8)]:
        reqs = [Request(p, SamplingParams(max_new_tokens=48, temperature=temps[i % len(temps)],
                                          seed=i)) for i, p in enumerate(prompts[:batch])]
        row = {"mode": "spec" if spec else "target-only", "batch": batch,
               "temperatures": temps}
        for name, be in (("graph", graphed), ("eager", eager)):
            Engine(pair, be).generate(reqs, spec=spec)          # warm-up / capture
            outs, stats = Engine(pair, be).generate(reqs, spec=spec)
            row[f"{name}_tokens"] = [o.token_ids for o in outs]
            row[f"{name}_step_ms"] = 1e3 * stats.step_s
            row[f"{name}_capture_ms"] = 1e3 * stats.capture_s
            row[f"{name}_fallbacks"] = stats.fallbacks
        row["equal"] = row.pop("graph_tokens") == row.pop("eager_tokens")
        print(json.dumps(row))
        results.append(row)
    json.dump({"backend": args.backend, "adapter": getattr(graphed.graph_adapter, "name", None),
               "all_equal": all(r["equal"] for r in results), "rows": results},
              open(args.out, "w"), indent=2)
    return 0 if all(r["equal"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
