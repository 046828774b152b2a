"""Throughput and τ at each candidate count (``SamplingParams.num_candidates``) side by side,
× target-only, at batch 1 and 8 and T = 0, 0.7 / top-p 0.95 and 1 on the pair's held-out
prompts (docs/benchmarks/k-curve.md): what the default (the draft's trained count) gives against
wider candidate sets, fixed block and adaptive.

    .venv/bin/python scripts/candidates_bench.py [--model stdlib-code] [--counts 32,64]
        [--batches 1,8] [--prompts 8] [--max-new-tokens 48] [--repeats 3] [--block 8]
    .venv/bin/python scripts/candidates_bench.py --paired-tau 1,2,3,4,5,6 [--counts 32,64]

``--paired-tau SEEDS`` (e.g. ``1,2,3,4,5,6``) instead: τ of every held-out prompt decoded alone
at each count, T = 0.7 / top-p 0.95 and T = 1, block 8, 64 tokens, under each seed (prompt i,
seed s: 1000 s + i), and each count's mean paired difference to the trained count with its
standard error: whether a count's τ lead is more than the spread of sampling.

Every contender decodes on its own Engine (its own measured table), warmed up before any is
timed, then timed in interleaved rounds (``bench.measure.measure``); × target-only is the median
of the rounds' paired ratios. Batch 1 decodes the first ``--prompts`` prompts one at a time;
batch 8, one batch of the first 8. Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics

from dflash2rt import get_backend
from dflash2rt.bench.ablation import batch_prompts
from dflash2rt.bench.measure import (TEMPERATURES, Temperature, engine_contender, measure,
                                     seeded_requests)
from dflash2rt.bench.rows import paired_ratio
from dflash2rt.engine.engine import Engine
from dflash2rt.engine.request import Request, SamplingParams
from dflash2rt.engine.stages import selector_params
from dflash2rt.train.k_curve import load_heldout


def with_count(reqs, count):
    return [dataclasses.replace(q, params=dataclasses.replace(q.params, num_candidates=count))
            for q in reqs]


def batched(prompts, batch: int, max_new: int, t: Temperature) -> list[list[Request]]:
    """The seeded requests of one batch size: one batch of them, or (batch 1) one each."""
    reqs = seeded_requests(batch_prompts(prompts, batch, len(prompts)), max_new, t)
    return [reqs] if batch > 1 else [[q] for q in reqs]


def compare(pair, backend, batches, specs, repeats: int, adjust
            ) -> list[tuple[str, float | None, float]]:
    """specs [(contender, spec, block, setting)], the first target-only; ``adjust(requests,
    setting)`` the requests a contender decodes → [(contender, × target-only, τ)]."""
    contenders = [engine_contender(name, Engine(pair, backend),
                                   [adjust(b, setting) for b in batches], spec, blk)
                  for name, spec, blk, setting in specs]
    res = measure(contenders, repeats)
    base = res[specs[0][0]].rates
    out = []
    for name, *_ in specs:
        m = res[name]
        tau = statistics.fmean(s.tau for s in m.stats) if m.stats else 1.0
        out.append((name, paired_ratio(m.rates, base), tau))
    return out


def row(pair, backend, prompts, batch: int, t: Temperature, counts, block: int, max_new: int,
        repeats: int) -> list[tuple[str, float | None, float]]:
    """→ [(contender, × target-only, τ)] for one batch size and temperature."""
    trained = selector_params(pair).top_k
    specs = [("target-only", False, None, None)]
    for k in (None, *counts):
        name = f"K={trained} (default)" if k is None else f"K={k}"
        specs.append((f"block {block}, {name}", True, block, k))
    specs.append((f"adaptive, K={trained} (default)", True, None, None))
    return compare(pair, backend, batched(prompts, batch, max_new, t), specs, repeats,
                   with_count)


def paired_tau(pair, backend, prompts, seeds, counts, block: int) -> None:
    engine = Engine(pair, backend)
    trained = selector_params(pair).top_k
    print("| T | K | τ | τ at K = %d | paired difference ± standard error | pairs |" % trained)
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for t in TEMPERATURES[1:]:
        taus: dict = {k: [] for k in (None, *counts)}
        for seed in seeds:
            for k in taus:
                for i, p in enumerate(prompts):
                    q = Request(tuple(p), SamplingParams(
                        max_new_tokens=64, temperature=t.temperature, top_p=t.top_p,
                        seed=1000 * seed + i, ignore_eos=True, num_candidates=k), key=i)
                    taus[k].append(engine.generate([q], block_size=block)[1].tau)
        base = taus[None]
        for k in counts:
            d = [a - b for a, b in zip(taus[k], base)]
            se = statistics.stdev(d) / len(d) ** 0.5
            print(f"| {t.label} | {k} | {statistics.fmean(taus[k]):.2f} | "
                  f"{statistics.fmean(base):.2f} | {statistics.fmean(d):+.2f} ± {se:.2f} | "
                  f"{len(d)} |", flush=True)


def bench_arguments(ap: argparse.ArgumentParser, paired: str) -> None:
    """The options this bench and its siblings share; ``paired``: what --paired-tau does."""
    ap.add_argument("--model", default="stdlib-code")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--block", type=int, default=8)
    ap.add_argument("--paired-tau", default=None, metavar="SEEDS", help=paired)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--counts", default="32,64", help="counts beside the trained one")
    bench_arguments(ap, "τ per prompt and seed, paired against the trained count, instead")
    a = ap.parse_args()
    backend = get_backend("cpu")
    counts = [int(x) for x in a.counts.split(",") if x]
    if a.paired_tau:
        pair, prompts, _ = load_heldout(a.model)
        paired_tau(pair, backend, prompts, [int(x) for x in a.paired_tau.split(",")], counts,
                   a.block)
        return
    pair, prompts, _ = load_heldout(a.model, a.prompts)
    print_table(a.batches, lambda batch, t: row(pair, backend, prompts, batch, t, counts,
                                                a.block, a.max_new_tokens, a.repeats))


def print_table(batches: str, rows_of) -> None:
    """The markdown table of ``rows_of(batch, temperature)`` for each batch size and
    temperature."""
    print("| batch | T | contender | × target-only | τ |")
    print("| ---: | --- | --- | ---: | ---: |")
    for batch in (int(x) for x in batches.split(",")):
        for t in TEMPERATURES:
            for name, ratio, tau in rows_of(batch, t):
                shown = "–" if ratio is None else f"{ratio:.2f}"
                print(f"| {batch} | {t.label} | {name} | {shown} | {tau:.2f} |", flush=True)


if __name__ == "__main__":
    main()
