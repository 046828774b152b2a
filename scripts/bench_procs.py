"""Logit processors under speculation on the bundled pair, one process:

1. For each parameter alone and all together, greedy speculative decoding (adaptive and block 8)
   equals greedy target-only decoding on the held-out prompts, token for token.
2. The cost: tokens/s at T = 0.7 / top-p 0.95 with penalties + logit bias + min-p on vs off,
   target-only and adaptive speculation, batch 1 and 8, in interleaved rounds after a warm-up.

    .venv/bin/python scripts/bench_procs.py [--max-new 64] [--rounds 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

from dflash2rt.bench.measure import resolve_backend
from dflash2rt.bench.suite import heldout_prompts
from dflash2rt.bundled import bundled_path
from dflash2rt.engine.engine import Engine
from dflash2rt.engine.request import Request, SamplingParams
from dflash2rt.models.pair import load_pair

SETS = {
    "repetition_penalty": dict(repetition_penalty=1.3),
    "frequency_penalty": dict(frequency_penalty=0.7),
    "presence_penalty": dict(presence_penalty=0.9),
    "min_p": dict(min_p=0.2),
    "logit_bias": dict(logit_bias={10: 4.0, 11: -8.0, 32: 2.5, 100: -100.0}),
    "logprobs": dict(logprobs=5),
}
SETS["all"] = {k: v for d in SETS.values() for k, v in d.items()}
COST_ON = dict(repetition_penalty=1.1, frequency_penalty=0.3, presence_penalty=0.3,
               min_p=0.05, logit_bias={10: 2.0, 11: -2.0})


def _reqs(prompts, max_new: int, **kw) -> list[Request]:
    return [Request(tuple(p), SamplingParams(max_new_tokens=max_new, ignore_eos=True,
                                             seed=1000 + i, **kw))
            for i, p in enumerate(prompts)]


def greedy_checks(eng: Engine, prompts, max_new: int) -> dict:
    out = {}
    for name, kw in SETS.items():
        reqs = _reqs(prompts, max_new, **kw)
        want, _ = eng.generate(reqs, spec=False)
        row = {}
        for label, block in (("adaptive", None), ("block8", 8)):
            got, st = eng.generate(reqs, spec=True, block_size=block)
            row[label] = {"equal": [g.token_ids for g in got] == [w.token_ids for w in want],
                          "tau": round(st.tau, 3)}
            if kw.get("logprobs") is not None:
                row[label]["max_logprob_diff"] = max(
                    abs(a - b) for g, w in zip(got, want)
                    for a, b in zip(g.logprobs, w.logprobs))
        out[name] = row
        print(f"greedy {name}: " + ", ".join(f"{k} equal={v['equal']} tau {v['tau']}"
                                             for k, v in row.items()), file=sys.stderr)
    return out


def cost(eng: Engine, prompts, max_new: int, rounds: int) -> list[dict]:
    t07 = dict(temperature=0.7, top_p=0.95)
    configs = []
    for batch in (1, 8):
        groups = [prompts[i:i + batch] for i in range(0, len(prompts), batch)]
        for procs in (False, True):
            for spec in (False, True):
                kw = {**t07, **(COST_ON if procs else {})}
                configs.append(dict(batch=batch, procs=procs, spec=spec,
                                    batches=[_reqs(g, max_new, **kw) for g in groups]))

    def once(c) -> tuple[float, float]:
        toks = secs = committed = steps = 0
        for reqs in c["batches"]:
            _, st = eng.generate(reqs, spec=c["spec"], block_size=None)
            toks += st.generated
            secs += st.wall_s - st.capture_s - st.calibration_s
            committed += st.committed
            steps += st.request_steps
        return toks / secs, committed / max(steps, 1)

    for c in configs:                                     # warm-up (and calibration) first
        once(c)
    rates = {id(c): [] for c in configs}
    taus = {id(c): [] for c in configs}
    for _ in range(rounds):
        for c in configs:
            r, t = once(c)
            rates[id(c)].append(r)
            taus[id(c)].append(t)
    rows = []
    for c in configs:
        rows.append({"batch": c["batch"], "procs": c["procs"],
                     "mode": "adaptive spec" if c["spec"] else "target-only",
                     "tokens_per_s": statistics.median(rates[id(c)]),
                     "rounds": rates[id(c)], "tau": statistics.mean(taus[id(c)])})
    for r in rows:
        off = next(x for x in rows if x["batch"] == r["batch"] and x["mode"] == r["mode"]
                   and not x["procs"])
        r["on_over_off"] = r["tokens_per_s"] / off["tokens_per_s"]
        print(f"T=0.7 batch {r['batch']} {r['mode']:13s} procs {'on ' if r['procs'] else 'off'}"
              f" {r['tokens_per_s']:7.1f} tok/s  tau {r['tau']:.2f}  on/off x{r['on_over_off']:.2f}",
              file=sys.stderr)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    d = bundled_path("stdlib-code")
    pair = load_pair(d / "target", d / "draft")
    prompts = heldout_prompts(d, pair)[:args.prompts]
    with Engine(pair, resolve_backend(args.backend)) as eng:
        res = {"backend": eng.backend.name, "prompts": len(prompts), "max_new": args.max_new,
               "greedy": greedy_checks(eng, prompts, args.max_new),
               "cost_params": {k: (dict(v) if isinstance(v, dict) else v)
                               for k, v in COST_ON.items()},
               "cost": cost(eng, prompts, args.max_new, args.rounds)}
    text = json.dumps(res, indent=1, default=str)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            f.write(text)
    print(text)


if __name__ == "__main__":
    main()
