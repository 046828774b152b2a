"""τ of a pair on its held-out prompts at the draft's fixed block size, as the recipe's
evaluation measures it (``dflash2rt.train.evaluate.measure``: batch 1, every prompt alone, spec
warmed up then timed; target-only too at T = 0, with the greedy equality check), at T = 0,
0.7 / top-p 0.95 and 1, with the top-K mass beside each τ and the engine's per-slot acceptance.

    .venv/bin/python scripts/eval_heldout.py [--model stdlib-code | DIR] [--new 128] [--json F]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from dflash2rt.bundled import bundled_path
from dflash2rt.models.pair import load_pair
from dflash2rt.train.evaluate import measure
from dflash2rt.train.recipe import EVAL_SETTINGS


def per_slot(hist: list[int], block: int) -> list[float]:
    """Accept histogram (hist[a]: steps that accepted a drafts) → P(slot i accepted | reached),
    slots 1 .. block - 1."""
    hist = list(hist) + [0] * (block - len(hist))
    reach = [sum(hist[i:]) for i in range(len(hist))]          # steps that reached slot i + 1
    return [reach[i + 1] / reach[i] if reach[i] else 0.0 for i in range(len(hist) - 1)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="stdlib-code", help="bundled name or a directory with "
                    "target/, draft/ and heldout_prompts.json")
    ap.add_argument("--new", type=int, default=128, help="new tokens per prompt")
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args()
    root = Path(args.model) if Path(args.model).is_dir() else bundled_path(args.model)
    pair = load_pair(root / "target", root / "draft")
    held = json.loads((root / "heldout_prompts.json").read_text(encoding="utf-8"))
    ids = [h["prompt_ids"] for h in held]
    out = {}
    for key, temp, top_p in EVAL_SETTINGS:
        r = measure(pair, args.backend, ids, args.new, temp, baseline=temp == 0, top_p=top_p)
        out[key] = r
        print(f"T={temp:g} top-p {top_p:g}: tau {r['tau']:.3f} at block {r['block_size']} "
              f"(steps per block {r['steps_per_block']}), top-K mass {r['topk_mass']:.3f}"
              + (f", greedy mismatches {r['greedy_mismatches']}" if temp == 0 else "")
              + "; per slot " + " ".join(f"{a:.3f}" for a in
                                         per_slot(r["accept_hist"], r["block_size"])),
              flush=True)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
