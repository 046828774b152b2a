"""``dflash2rt train``: train the stdlib-code target / DFlash2 draft pair from one seed, on the CPU."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train a small target and its DFlash2 draft on the Python "
                                     "standard library's source (the bundled pair's recipe)")
    p.add_argument("--out", required=True, type=Path, help="output directory (target/, draft/, ...)")
    p.add_argument("--seed", type=int, default=0, help="the one seed of the whole run (default 0)")
    p.add_argument("--minutes", type=float, default=None,
                   help="scale step and data counts to a budget of about this many minutes on "
                        "2 CPU cores (default: the recipe's fixed counts; their time: "
                        "docs/benchmarks/bundled-pair.md); the counts never depend on the clock, so a run is "
                        "reproducible")
    p.add_argument("--threads", type=int, default=2, help="torch threads (results depend on it)")
    p.add_argument("--target-steps", type=int, help="target training steps")
    p.add_argument("--draft-steps", type=int, help="draft distillation steps")
    p.add_argument("--gen-prompts", type=int, help="prompts the target continues for distillation")
    p.add_argument("--draft-layers", type=int, help="draft decoder layers")
    p.add_argument("--block-size", type=int, help="draft block size (default 8)")
    p.add_argument("--selector-top-k", type=int, help="the selector's candidates per draft "
                   "slot, K (default 16): its K-way loss is trained over them")
    p.add_argument("--target", default=None, metavar="DIR_OR_NAME",
                   help="distil a draft for this existing target instead of training one: a "
                        "target directory made by this recipe, or a bundled pair's name "
                        "(its target/); the tokenizer must be the recipe's")
    p.add_argument("--logit-scale", type=float,
                   help="factor on the trained target's logits in the shipped target (default 2.75; "
                        "1 ships the trained model as is)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..train.recipe import run_recipe, target_dir
    from ..train.recipe_config import RecipeConfig

    cfg = RecipeConfig(seed=args.seed, threads=args.threads)
    if args.minutes is not None:
        cfg = cfg.scaled(args.minutes)
    over = {k: v for k, v in (("target_steps", args.target_steps), ("draft_steps", args.draft_steps),
                              ("gen_prompts", args.gen_prompts),
                              ("target_logit_scale", args.logit_scale)) if v is not None}
    shape = {k: v for k, v in (("layers", args.draft_layers), ("block_size", args.block_size),
                               ("selector_top_k", args.selector_top_k)) if v is not None}
    if shape:
        over["draft"] = dataclasses.replace(cfg.draft, **shape)
    if args.target is not None:
        target_dir(args.target)                     # an unknown name fails before any work
        over["target_dir"] = args.target
    cfg = dataclasses.replace(cfg, **over)
    report = run_recipe(args.out, cfg)
    summary = {k: report[k] for k in ("seconds", "total_seconds", "bytes")}
    summary["tau_t0"] = report["eval_greedy"]["tau"]
    summary["tau_t07_p095"] = report["eval_t07_p095"]["tau"]
    summary["tau_t1"] = report["eval_t1"]["tau"]
    summary["topk_mass"] = {k: report[k]["topk_mass"]
                            for k in ("eval_greedy", "eval_t07_p095", "eval_t1")}
    summary["speedup"] = report["eval_greedy"]["speedup_vs_target_only"]
    summary["spec_step_cost_vs_target_only"] = \
        report["eval_summary"]["spec_step_cost_vs_target_only"]
    print(json.dumps(summary, indent=2))
    return 0
