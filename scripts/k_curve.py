"""τ, top-K mass and select / verify cost of a pair as the selector's K grows
(``dflash2rt.train.k_curve``; docs/benchmarks/k-curve.md): prints a markdown table.

    .venv/bin/python scripts/k_curve.py [--model stdlib-code] [--ks 16,32,64,128,full]
        [--prompts 24] [--max-new-tokens 64] [--full-vocab-prompts 4]
        [--temperatures 0,0.7,1] [--threads 1] [--cache FILE] [--json-out FILE]
    .venv/bin/python scripts/k_curve.py --table T0.json T07.json T1.json   # runs merged

0.7 in ``--temperatures`` is T = 0.7 with top-p 0.95 (as ``dflash2rt bench``); "full" in
``--ks`` is the whole vocabulary. Run it on an otherwise idle machine: the op timings are
ratios of interleaved rounds, the absolute milliseconds drift with the machine. On a busy one,
give ``--cache FILE`` (a command cut short resumes from it when run again), run one
temperature per command (``--temperatures 0``, then ``0.7``, then ``1``, each with its
``--json-out``) and merge them with ``--table``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from dflash2rt.train.k_curve import DEFAULT_KS, RunCache, k_curve, load_heldout, \
    markdown_table, merge
from dflash2rt.bench.measure import Temperature
from dflash2rt.bench.suite import parse_temperatures


def temperatures(text: str) -> tuple[Temperature, ...]:
    """``parse_temperatures``'s settings of ``text``, T = 0 only when listed."""
    listed = {float(x.partition(":")[0]) for x in text.split(",") if x.strip()}
    return tuple(t for t in parse_temperatures(text) if t.temperature != 0 or 0.0 in listed)


def summary(res: dict) -> str:
    sub = res["subset_prompts"]
    return (f"{res['prompts']} held-out prompts (mean {res['prompt_tokens_mean']:.0f} tokens)"
            + (f", the full vocabulary on the first {sub}" if sub < res["prompts"] else "")
            + f" x {res['max_new_tokens']} new tokens, block {res['block_size']}, batch 1, "
            f"{res['backend']} backend, {res['torch_threads']} torch threads; "
            f"{res['seconds']:.0f} s"
            + (f" ({' + '.join(f'{s:.0f}' for s in res['run_seconds'])})"
               if "run_seconds" in res else ""))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="stdlib-code",
                   help="bundled name or a directory with target/, draft/, heldout_prompts.json")
    p.add_argument("--backend", default="cpu")
    p.add_argument("--ks", default=",".join(map(str, DEFAULT_KS)),
                   help="candidate counts K, comma-separated ('full': the vocabulary); the "
                   "first is the timing ratios' reference")
    p.add_argument("--prompts", type=int, default=24, help="the first N held-out prompts "
                   "(the bundled pair has 24)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperatures", default="0,0.7,1",
                   help="0.7: top-p 0.95; v:p for top-p p")
    p.add_argument("--block-size", type=int, default=None, help="fixed block (default: the "
                   "draft's)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved op-timing rounds (0: none)")
    p.add_argument("--timing-steps", type=int, default=3,
                   help="select / verify calls recorded per K and temperature for the timing")
    p.add_argument("--full-vocab-prompts", type=int, default=4,
                   help="the full-vocabulary K (a far dearer select) decodes only the first N "
                   "of the prompts (0: all); every row then also gives its τ on those N")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (0: torch's default). 1 by default: on a CPU shared "
                   "with other work, two threads wait on each other whenever one is preempted "
                   "(the ops here ran 10-100x slower so)")
    p.add_argument("--cache", type=Path, default=None,
                   help="keep every engine run's result in this JSON file; run the same "
                   "command again with it to resume a run cut short")
    p.add_argument("--json-out", type=Path, default=None)
    p.add_argument("--table", type=Path, nargs="+", default=None, metavar="JSON",
                   help="print the table of saved --json-out files (runs of one setting at "
                   "other temperatures, merged) instead of running")
    args = p.parse_args(argv)
    if args.table:
        res = merge([json.loads(f.read_text(encoding="utf-8")) for f in args.table])
        print(markdown_table(res) + "\n\n" + summary(res))
        if args.json_out:
            args.json_out.write_text(json.dumps(res, indent=1) + "\n", encoding="utf-8")
        return 0
    if args.threads:
        torch.set_num_threads(args.threads)

    pair, prompts, _ = load_heldout(args.model, args.prompts)
    res = k_curve(pair, prompts, [k.strip() for k in args.ks.split(",") if k.strip()],
                  temperatures(args.temperatures), args.max_new_tokens, args.backend,
                  args.block_size, args.rounds, args.timing_steps,
                  full_vocab_prompts=args.full_vocab_prompts or None,
                  cache=RunCache(args.cache),
                  log=lambda m: print(m, file=sys.stderr, flush=True))
    print(markdown_table(res) + "\n\n" + summary(res))
    if args.json_out:
        args.json_out.write_text(json.dumps(res, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
