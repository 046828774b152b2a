"""``dflash2rt bench``: target-only vs fixed-block vs adaptive speculation vs transformers, at
T = 0, T = 0.7 / top-p 0.95 and T = 1, batch 1 and 8, side by side in one run, with the per-step
cost split from a separate synced profiling pass. ``dflash2rt bench TOOL``: the other
measurements (:mod:`.bench_tools`)."""

from __future__ import annotations

import argparse
import json
import sys

from . import bench_tools
from .run_cmd import DTYPES


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="benchmark spec vs target-only vs transformers generate()")
    p.add_argument("--backend", default=None)
    p.add_argument("--model", default="stdlib-code", help="bundled model name or a directory "
                   "with target/, draft/ and heldout_prompts.json")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32",
                   help="model dtype for every engine run and the transformers baseline")
    p.add_argument("--repeats", type=int, default=3, help="interleaved timed rounds per "
                   "configuration (every contender warmed up first)")
    p.add_argument("--prompts", type=int, default=8, help="held-out prompts for batch 1")
    p.add_argument("--blocks", default="2,4,8,16", help="block sizes for the sweep")
    p.add_argument("--no-hf", action="store_true", help="skip the transformers baseline")
    p.add_argument("--temperatures", default="0,0.7,1", help="temperatures of the rows (0.7: "
                   "top-p 0.95; V:P for top-p P); T = 0 always comes first")
    # JSON: ar_tokens_per_s / speedup_vs_ar are deprecated aliases of target_only_tokens_per_s /
    # speedup_vs_target_only, written for one more release.
    p.add_argument("--costs", action="store_true", help="the cost model instead: T_target, "
                   "T_draft, T_verify per block size, context and batch, bytes moved, bandwidth "
                   "fraction and the projected speedup (bench/costs.py)")
    p.add_argument("--contexts", default="128,2048,8192", help="--costs: context lengths")
    p.add_argument("--batches", default="1,8", help="--costs: batch sizes")
    p.add_argument("--reps", type=int, default=3, help="--costs: timed steps per block size "
                   "(medians; transformers' steps interleave with our target-only ones)")
    p.add_argument("--tau", type=float, default=None, help="--costs: the acceptance curve as τ at "
                   "block 16 (default: the bundled pair's measured τ at block 8)")
    p.add_argument("--json", action="store_true", help="print the results as JSON on stdout")
    p.add_argument("--json-out", default=None, metavar="FILE", help="also write the JSON to FILE")
    p.set_defaults(func=run)
    bench_tools.add_parsers(p.add_subparsers(
        dest="tool", metavar="TOOL", required=False,
        title="other measurements (dflash2rt bench TOOL --help)"))


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ..api import resolve_model
    from ..bench.suite import parse_temperatures, profile_table, rows_table, run_bench
    from ..registry import Registry

    backend = Registry.discover().select(args.backend).backend
    from ..bundled import model_dir

    path = model_dir(args.model)
    pair = resolve_model(path, backend.device, DTYPES[args.dtype])
    log = (lambda m: print(m, file=sys.stderr)) if args.json else print
    if args.costs:
        return _costs(args, pair, backend, log, path)
    res = run_bench(pair, path, backend, args.max_new_tokens, args.repeats,
                    tuple(int(b) for b in args.blocks.split(",")), args.prompts, not args.no_hf,
                    log, parse_temperatures(args.temperatures))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(res, indent=2) + "\n")
    if args.json:
        print(json.dumps(res, indent=2))
        return 0
    print("\n" + rows_table(res))
    print("\n" + profile_table(res["step_profile"]))
    tau_t1 = f", {res['tau_t1']:.2f} (T=1)" if res["tau_t1"] is not None else ""
    print(f"\ntau {res['tau']:.2f} (T=0){tau_t1}, batch 1, block "
          f"{res['block_size']}; speedup x{res['speedup_vs_target_only']:.2f} vs target-only, "
          + (f"x{res['speedup_vs_hf']:.2f} vs transformers; " if res["speedup_vs_hf"] else "")
          + f"efficiency {res['efficiency']:.2f}; greedy spec == target-only (every prompt, "
          f"fixed and adaptive, batch 1 and 8): {res['greedy_equal_all']}")
    print(f"transformers: {res['hf_baseline']}")
    print(f"graph capture / compile (untimed warm-up runs): "
          f"{sum(res['capture_s'].values()):.2f} s")
    return 0


def _costs(args: argparse.Namespace, pair, backend, log, path) -> int:
    from pathlib import Path

    from ..bench.costs import measure_costs, projected_table
    from ..engine.engine import Engine

    tau, tau_block = args.tau, 16
    if tau is None:                       # the bundled pair's measured acceptance at block 8
        from ..bundled import bundled_path

        report = json.loads((bundled_path("stdlib-code") / "train_report.json").read_text())
        tau, tau_block = report["eval_greedy"]["tau"], report["eval_greedy"]["block_size"]
    hf = None
    if not args.no_hf:
        from ..bench.hf_baseline import HFGreedy, hf_available

        why = hf_available()
        if why:
            raise SystemExit(f"--costs compares with transformers, which is unavailable ({why}); "
                             "pass --no-hf to measure ours alone")
        hf = HFGreedy(path / "target", pair.dtype, backend.device)
        Engine(pair, backend)                       # the model pass first (it may restack)
        shared = hf.share_weights(pair.target)      # one copy: the same memory for both
        log(f"transformers reads our {shared} weight tensors (shared, not copied)")
    res = measure_costs(pair, backend, blocks=[int(b) for b in args.blocks.split(",")],
                        contexts=[int(c) for c in args.contexts.split(",")],
                        batches=[int(b) for b in args.batches.split(",")], tau=tau,
                        tau_block=tau_block, reps=args.reps, hf=hf, log=log)
    res["transformers_weights"] = None if hf is None else f"shared: {shared} tensors"
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps(res, indent=2) if args.json else projected_table(res))
    return 0
