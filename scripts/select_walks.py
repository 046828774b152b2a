"""Time the candidate selector's two walks side by side (docs/benchmarks/k-curve.md).

The whole-lattice walk builds every slot's [K, K] lattice and, sampled, the law of each of its
rows; the row walk (``ops.selector.ROW_WALK_MIN_K`` candidates on) scores and draws only the
row it reads at each slot. Both run on the same random inputs of the bundled pair's shapes
(vocabulary 2048, rank 128, 7 draft slots), interleaved round by round; each figure is the
fastest round's mean call, and the ratio is row walk / whole lattice.
"""

from __future__ import annotations

import argparse
import time

import torch

from dflash2rt.ops import selector
from dflash2rt.ops.batch import SamplingBatch
from dflash2rt.ops.selector import SelectorParams

WALKS = {"whole lattice": 10 ** 9, "row walk": 1}


def _inputs(r: int, gamma: int, v: int, rank: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(r, gamma, v, generator=g) * 3, torch.randn(r, gamma, rank, generator=g)
            * 0.3, torch.randint(0, v, (r,), generator=g), torch.randn(v, rank, generator=g)
            * 0.3, torch.randn(v, rank, generator=g) * 0.3, torch.rand(r, gamma, generator=g))


def time_walks(r: int, k: int, temperature: float, rounds: int, calls: int, v: int = 2048,
               rank: int = 128, gamma: int = 7) -> dict[str, float]:
    """Seconds per select call of each walk (the fastest of ``rounds`` interleaved rounds)."""
    logits, proj, anchor, a, b, u = _inputs(r, gamma, v, rank)
    sampling = SamplingBatch.build([temperature] * r, [0] * r, [1.0] * r)
    params = SelectorParams(k)
    best = dict.fromkeys(WALKS, float("inf"))
    for i in range(rounds + 1):                                  # round 0 warms up
        for name, bound in WALKS.items():
            selector.ROW_WALK_MIN_K = bound
            t0 = time.perf_counter()
            for _ in range(calls):
                selector.select(logits, proj, anchor, a, b, params, sampling, u)
            if i:
                best[name] = min(best[name], (time.perf_counter() - t0) / calls)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ks", default="16,64,128,2048")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--temperatures", default="0,1")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    shipped = selector.ROW_WALK_MIN_K
    print(f"select ms per call; the runtime takes the row walk from K = {shipped}")
    print("| batch | T | K | whole lattice ms | row walk ms | row / whole |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    try:
        for r in (int(x) for x in args.batches.split(",")):
            for t in (float(x) for x in args.temperatures.split(",")):
                for k in (int(x) for x in args.ks.split(",")):
                    calls = max(1, args.calls // (8 if k > 512 else 1))
                    s = time_walks(r, k, t, args.rounds, calls)
                    w, rw = s["whole lattice"], s["row walk"]
                    print(f"| {r} | {t:g} | {k} | {w * 1e3:.2f} | {rw * 1e3:.2f} | "
                          f"{rw / w:.2f} |", flush=True)
    finally:
        selector.ROW_WALK_MIN_K = shipped


if __name__ == "__main__":
    main()
