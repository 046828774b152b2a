"""``dflash2rt bench``: target-only vs fixed-block vs adaptive speculation vs transformers, at
T = 0, T = 0.7 / top-p 0.95 and T = 1, batch 1 and 8, side by side in one run, with the per-step
cost split from a separate synced profiling pass. ``dflash2rt bench TOOL``: the other
measurements (:mod:`.bench_tools`)."""

from __future__ import annotations

import argparse
import json
import sys

from . import bench_tools, serve_cmd
from .bench_tools import comma_numbers
from .run_cmd import DTYPES


def add_parser(sub: argparse._SubParsersAction) -> None:
    from ..synth.shapes import SHAPES, TOY_SHAPES

    p = sub.add_parser("bench", help="benchmark spec vs target-only vs transformers generate()")
    p.add_argument("--backend", default=None)
    p.add_argument("--model", default=None, help="bundled model name or a directory with "
                   "target/, draft/ and heldout_prompts.json (default: stdlib-code)")
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
    p.add_argument("--shape", default=None, choices=sorted(SHAPES) + sorted(TOY_SHAPES),
                   help="--costs, instead of --model: a synthetic pair "
                   "of this shape (dflash2rt synth's shapes) built in memory on the backend's "
                   "device in --dtype, seeded, with no checkpoint")
    p.add_argument("--layers", type=int, default=None, help="--shape: fewer target layers")
    p.add_argument("--draft-layers", type=int, default=None,
                   help="--shape: draft layers (default: the published 5)")
    p.add_argument("--seed", type=int, default=None, help="--shape: the weights' seed (default 0)")
    p.add_argument("--json", action="store_true", help="print the results as JSON on stdout")
    p.add_argument("--json-out", default=None, metavar="FILE", help="also write the JSON to FILE")
    p.set_defaults(func=run)
    tools = p.add_subparsers(dest="tool", metavar="TOOL", required=False,
                             title="other measurements (dflash2rt bench TOOL --help)")
    bench_tools.add_parsers(tools)
    serve_cmd.add_bench_parser(tools)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ..api import resolve_model
    from ..bench.suite import parse_temperatures, profile_table, rows_table, run_bench
    from ..registry import Registry

    _check_source(args)
    backend = Registry.discover().select(args.backend).backend
    from ..bundled import model_dir

    log = (lambda m: print(m, file=sys.stderr)) if args.json else print
    if args.costs:
        return _costs(args, backend, log)
    path = model_dir(args.model or "stdlib-code")
    pair = resolve_model(path, backend.device, DTYPES[args.dtype])
    res = run_bench(pair, path, backend, args.max_new_tokens, args.repeats,
                    tuple(comma_numbers("--blocks", args.blocks)), args.prompts, not args.no_hf,
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


def _check_source(args: argparse.Namespace) -> None:
    """--shape (and its --layers, --draft-layers, --seed) only with --costs, not with --model."""
    shaped = [f for f in ("layers", "draft_layers", "seed") if getattr(args, f) is not None]
    if args.shape is None and shaped:
        raise SystemExit(f"--{shaped[0].replace('_', '-')} sizes the in-memory pair of --shape; "
                         "pass --shape NAME with it")
    if args.shape is not None and not args.costs:
        raise SystemExit("--shape builds a pair for the cost model only: add --costs, or pass "
                         "a checkpoint with --model")
    if args.shape is not None and args.model is not None:
        raise SystemExit("--shape and --model are exclusive: the cost model runs on the "
                         "in-memory pair of --shape or on the checkpoint of --model")


def _pair(args: argparse.Namespace, backend, log):
    """(the pair, its target's config.json dict, where it came from) of --shape or --model."""
    if args.shape is not None:
        import time

        from ..synth.in_memory import build_pair

        t0, seed = time.perf_counter(), args.seed or 0
        pair, built = build_pair(args.shape, backend.device, DTYPES[args.dtype], seed,
                                 args.layers, args.draft_layers)
        source = (f"in memory, seeded (no checkpoint): {args.shape}, seed {seed}, "
                  f"{built['target_layers']} target layers, {built['draft_layers']} draft layers")
        log(f"pair {source}: built on {backend.device} in {args.dtype} in "
            f"{time.perf_counter() - t0:.1f} s")
        return pair, built["target_config"], source
    from ..api import resolve_model
    from ..bundled import model_dir
    from ..models.hf_loader import read_config

    path = model_dir(args.model or "stdlib-code")
    pair = resolve_model(path, backend.device, DTYPES[args.dtype])
    return pair, read_config(path / "target"), f"checkpoint: {path}"


def _costs(args: argparse.Namespace, backend, log) -> int:
    from pathlib import Path

    from ..bench.costs import measure_costs, projected_table
    from ..engine.engine import Engine

    if args.no_hf:
        hf_why = None
    else:
        from ..bench.hf_baseline import HFGreedy, hf_available

        hf_why = hf_available()
        if hf_why:
            raise SystemExit(f"--costs compares with transformers, which is unavailable "
                             f"({hf_why}); pass --no-hf to measure ours alone")
    pair, config, source = _pair(args, backend, log)
    tau, tau_block = args.tau, 16
    if tau is None:                       # the bundled pair's measured acceptance at block 8
        from ..bundled import bundled_path

        report = json.loads((bundled_path("stdlib-code") / "train_report.json").read_text())
        tau, tau_block = report["eval_greedy"]["tau"], report["eval_greedy"]["block_size"]
    hf = None
    if not args.no_hf:
        Engine(pair, backend)                       # the model pass first (it may restack)
        hf, shared = HFGreedy.on_weights(config, pair.target)   # one copy: the same memory
        log(f"transformers reads our {shared} weight tensors (shared, not copied)")
    res = measure_costs(pair, backend, blocks=comma_numbers("--blocks", args.blocks),
                        contexts=comma_numbers("--contexts", args.contexts),
                        batches=comma_numbers("--batches", args.batches), tau=tau,
                        tau_block=tau_block, reps=args.reps, hf=hf, log=log)
    res["pair"] = source
    res["transformers_weights"] = None if hf is None else \
        f"shared: {shared} tensors (its model built from the config on the meta device)"
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps(res, indent=2) if args.json else projected_table(res))
    return 0
