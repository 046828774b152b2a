"""Where a served token's CPU goes: a ``dflash2rt serve`` process driven by ``bench serve``'s
clients, with the CPU each side spent per output token.

- clients: this process's CPU while it drives (``time.process_time``);
- engine: the server's main thread (the engine loop and OpenMP's first thread);
- workers: the server's other threads over half the engine's (OpenMP's other threads);
- rest: every other thread of the server (uvicorn's event loop: the HTTP side).

    .venv/bin/python scripts/serve_cpu.py --flags=--no-spec --concurrency 1,16 --rounds 2
"""

from __future__ import annotations

import argparse
import os
import time

from dflash2rt.bundled import heldout, model_dir
from dflash2rt.serve.live import SpawnedServer
from dflash2rt.serve.load import drive

TICK = os.sysconf("SC_CLK_TCK")


def thread_cpu(pid: int) -> dict[int, float]:
    """Each thread's user + system seconds."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:                       # the thread ended meanwhile
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / TICK
    return out


def split(pid: int, before: dict[int, float], after: dict[int, float]) -> dict[str, float]:
    spent = {t: after[t] - before.get(t, 0.0) for t in after}
    engine = spent.pop(pid, 0.0)
    workers = sum(v for v in spent.values() if v > 0.5 * engine)
    return {"engine": engine, "workers": workers,
            "rest": sum(spent.values()) - workers}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="stdlib-code")
    ap.add_argument("--flags", default="--no-spec", help="the server's flags, space-separated")
    ap.add_argument("--concurrency", default="1,16")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    root = model_dir(args.model)
    prompts = [h["prompt"] for h in heldout(root)]
    levels = [int(c) for c in args.concurrency.split(",")]
    top = max(levels)
    with SpawnedServer([str(root), "--backend", "cpu", *args.flags.split(), "--max-num-seqs",
                        str(top), "--max-queue", str(top)]) as s:
        drive(s.base, s.model, prompts, 1, 2, args.max_tokens, 60)          # warm-up
        print("| concurrency | output tok/s | TPOT ms | µs of CPU a token: clients | engine "
              "thread | OpenMP workers | rest (HTTP) |\n| ---: | ---: | ---: | ---: | ---: "
              "| ---: | ---: |")
        for _ in range(args.rounds):
            for c in levels:
                a, c0 = thread_cpu(s.proc.pid), time.process_time()
                row = drive(s.base, s.model, prompts, c, args.requests, args.max_tokens, 60)
                c1, b = time.process_time(), thread_cpu(s.proc.pid)
                per = 1e6 / row["output_tokens"]
                sides = split(s.proc.pid, a, b)
                print(f"| {c} | {row['output_tokens_per_s']:.0f} | "
                      f"{row['tpot_ms']['mean']:.2f} | {per * (c1 - c0):.0f} | "
                      f"{per * sides['engine']:.0f} | {per * sides['workers']:.0f} | "
                      f"{per * sides['rest']:.0f} |", flush=True)


if __name__ == "__main__":
    main()
