"""``dflash2rt synth``: write a pair with a published model's shapes and on-disk layout, random
weights (seeded)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:
    from ..synth.shapes import DRAFT_FORMATS, LAYOUTS, SHAPES, TOY_SHAPES

    p = sub.add_parser("synth", help="write a target + draft pair with a published model's "
                                     "shapes and layout (sharded safetensors + index, tokenizer), "
                                     "seeded random weights")
    p.add_argument("--shape", required=True, choices=sorted(SHAPES) + sorted(TOY_SHAPES),
                   help="a published shape, or a toy-* one (tests: the same layout, 64 wide)")
    p.add_argument("--out", required=True, type=Path, help="output directory (target/, draft/)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--layers", type=int, help="fewer target layers, same layout (tests)")
    p.add_argument("--draft-layers", type=int, help="draft layers (default: the published 5)")
    p.add_argument("--draft-format", choices=DRAFT_FORMATS, default="dflash2",
                   help="the draft's format (default dflash2)")
    p.add_argument("--layout", help="the format's layout: " + "; ".join(
        f"{f}: {', '.join(v)}" for f, v in LAYOUTS.items()) + " (default: the first)")
    p.add_argument("--draft-vocab", type=int,
                   help="speculators DFlash drafts: a reduced draft vocabulary of N target ids "
                        "(d2t / t2d)")
    p.add_argument("--shard-gb", type=float, default=4.0,
                   help="largest shard in GB (default 4, as published checkpoints)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import math

    from ..errors import InvalidInputError
    from ..synth import synthesize
    from ..synth.write import GB

    if not (math.isfinite(args.shard_gb) and args.shard_gb > 0):
        raise InvalidInputError(f"--shard-gb must be a size in GB > 0, got {args.shard_gb}")
    summary = synthesize(args.shape, args.out, args.seed, args.layers, args.draft_layers,
                         max_shard_bytes=int(args.shard_gb * GB), draft_format=args.draft_format,
                         draft_vocab=args.draft_vocab, layout=args.layout)
    print(json.dumps(summary, indent=2))
    return 0
