#!/usr/bin/env python
"""Soak the OpenAI server: 2,000 requests from 32 concurrent clients (mixed lengths and
parameters, streamed and not, completions and chat, clients that leave mid-stream, malformed
requests) against the bundled pair served in this process on a loopback port.

Fails (exit 1) on any 5xx, any malformed request not answered with a 4xx error, any completed
response that is not well formed, a request left running or waiting at the end, the time limit,
or resident memory that grew by more than --max-rss-growth-mib from warm-up to the end.

    .venv/bin/python scripts/serve_soak.py [--requests 2000] [--clients 32] [--backend cpu]

CI runs a short version: tests/test_serve_soak.py.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from dflash2rt.serve.soak import soak
from dflash2rt.serve import build_server
from dflash2rt.serve.live import LiveServer

TEMPLATE = ("{% for m in messages %}# {{ m.role }}: {{ m.content }}\n{% endfor %}"
            "{% if add_generation_prompt %}# assistant:{% endif %}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="stdlib-code")
    p.add_argument("--backend", default="cpu")
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-num-seqs", type=int, default=16)
    p.add_argument("--time-limit", type=float, default=3600.0, help="seconds for the whole soak")
    p.add_argument("--max-rss-growth-mib", type=float, default=64.0)
    args = p.parse_args()
    server = build_server(args.model, args.backend, max_num_seqs=args.max_num_seqs,
                          max_model_len=256, max_queue=args.clients, chat_template=TEMPLATE)
    with LiveServer(server) as live:
        res = asyncio.run(soak(live.base, server.limits.model_names[0], args.requests,
                               args.clients, args.seed, True, args.time_limit,
                               warm_up=max(args.requests // 10, 1)))
    growth = (res["rss_end"] - res["rss_warm"]) / 2**20
    res["rss_growth_mib"] = growth
    failures = res["failures"]
    if growth > args.max_rss_growth_mib:
        failures.append(f"resident memory grew by {growth:.1f} MiB after warm-up")
    print(json.dumps({**res, "failures": failures[:20], "failure_count": len(failures)},
                     indent=1))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
