"""What a second draft layer costs a speculative step (docs/benchmarks/k-curve.md, "More
training, another loss, one more layer"): the shipped one-layer draft against a two-layer draft
that predicts exactly as the shipped one (``draft_variants.grown``: the second layer's output
projections zero), so both decode the same tokens in the same steps and only the layer's work
differs. The synced profiling pass (``bench.profile.profile_steps``) of each, and of
target-only decoding, in interleaved rounds; milliseconds per step are the median round.

    .venv/bin/python scripts/draft_step_cost.py [--prompts 8] [--max-new-tokens 64]
        [--rounds 5] [--threads 1]

Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from draft_variants import BACKEND, grown  # noqa: E402

from dflash2rt.bench.profile import profile_steps  # noqa: E402
from dflash2rt.bundled import bundled_path  # noqa: E402
from dflash2rt.engine.engine import Engine  # noqa: E402
from dflash2rt.engine.request import Request, SamplingParams  # noqa: E402
from dflash2rt.models.pair import ModelPair, load_pair  # noqa: E402
from dflash2rt.train.recipe_config import RecipeConfig  # noqa: E402

PARTS = ("draft", "verify", "host", "step")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.set_flush_denormal(True)
    bp = bundled_path("stdlib-code")
    pair = load_pair(bp / "target", bp / "draft")
    two = grown(RecipeConfig(target_dir="stdlib-code"), pair.target, pair.draft)
    engines = {"1 layer (shipped)": Engine(pair, BACKEND),
               "2 layers": Engine(ModelPair(pair.target, two.eval().requires_grad_(False)),
                                  BACKEND)}
    prompts = [p["prompt_ids"] for p in
               json.loads((bp / "heldout_prompts.json").read_text())][:a.prompts]
    print("| T | decoding | τ | draft ms | verify ms | host ms | step ms | step / 1 layer |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for temp in (0.0, 1.0):
        batches = [[Request(tuple(ids), SamplingParams(
            max_new_tokens=a.max_new_tokens, temperature=temp, seed=1234 + i, ignore_eos=True),
            key=i)] for i, ids in enumerate(prompts)]
        runs = {**{n: (e, True) for n, e in engines.items()},
                "target-only": (engines["1 layer (shipped)"], False)}
        for e, spec in runs.values():                                   # warm-up
            profile_steps(e, batches, spec, 8 if spec else None)
        rows: dict[str, list[dict]] = {n: [] for n in runs}
        for _ in range(a.rounds):
            for n, (e, spec) in runs.items():
                rows[n].append(profile_steps(e, batches, spec, 8 if spec else None))
        one = rows["1 layer (shipped)"]
        for n, rs in rows.items():
            ms = {k: statistics.median(r[k] for r in rs) * 1e3 for k in PARTS}
            ratio = statistics.median(r["step"] / o["step"] for r, o in zip(rs, one))
            print(f"| {temp:g} | {n} | {rs[0]['tau']:.2f} | "
                  + " | ".join(f"{ms[k]:.2f}" for k in PARTS) + f" | {ratio:.2f} |", flush=True)


if __name__ == "__main__":
    main()
