"""Is the bundled draft's sampled law shaped right? (docs/benchmarks/k-curve.md, "The draft's
law re-shaped"): the teacher-forced acceptance per slot of the law the engine draws from,
softmax(row / T), against a temperature factor β on the selector's scores and a nucleus cut of
its law (``dflash2rt.train.calibration``), on target-only continuations of the held-out
prompts at each temperature.

    .venv/bin/python scripts/draft_calibration.py [--prompts 24] [--max-new-tokens 128]
"""

from __future__ import annotations

import argparse

import torch

import dflash2rt
from dflash2rt.train.calibration import law_acceptance
from dflash2rt.train.k_curve import load_heldout

SCALES = (0.5, 0.7, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5)
NUCLEI = (0.8, 0.9, 0.95, 0.98, 0.99)
SETTINGS = ((1.0, 1.0), (0.7, 0.95))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="stdlib-code")
    ap.add_argument("--prompts", type=int, default=24)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--seed", type=int, default=7, help="the continuations' seed")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    pair, prompts, _ = load_heldout(a.model, a.prompts)
    shapes = [("scale", s) for s in SCALES] + [("nucleus", p) for p in NUCLEI]
    print("| T | law | τ (teacher-forced) | acceptance / slot | slots 1-7 |")
    print("| --- | --- | ---: | ---: | --- |")
    for temp, top_p in SETTINGS:
        outs = dflash2rt.run(pair, "cpu", prompts=prompts, spec=False, temperature=temp,
                             top_p=top_p, max_new_tokens=a.max_new_tokens, seed=a.seed).tokens
        r = law_acceptance(pair, prompts, outs, temp, top_p, shapes)
        name = f"T={temp:g}" + (f" top-p {top_p:g}" if top_p < 1 else "")
        mass = sum(r["mass"]) / len(r["mass"])
        print(f"| {name} | the target's law over the K candidates | {r['mass_tau']:.3f} | "
              f"{mass:.4f} | "
              f"{' '.join(f'{m:.3f}' for m in r['mass'])} |")
        for s in r["shapes"]:
            kind, v = s["shape"]
            law = ("the engine's, softmax(row / T)" if (kind, v) == ("scale", 1.0) else
                   f"softmax({v:g} · row / T)" if kind == "scale" else f"nucleus {v:g}")
            print(f"| {name} | {law} | {s['tau']:.3f} | {s['mean']:.4f} | "
                  f"{' '.join(f'{x:.3f}' for x in s['per_slot'])} |")
        print(f"<!-- {name}: {r['anchors']} anchors -->")


if __name__ == "__main__":
    main()
