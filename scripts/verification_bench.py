"""Token against block verification (``SamplingParams.verification``) side by side: throughput
× target-only and τ at batch 1 and 8 and T = 0, 0.7 / top-p 0.95 and 1 on the pair's held-out
prompts, fixed block and adaptive (docs/benchmarks/k-curve.md, "Block verification").

    .venv/bin/python scripts/verification_bench.py [--model stdlib-code] [--batches 1,8]
        [--prompts 8] [--max-new-tokens 48] [--repeats 3] [--block 8]
    .venv/bin/python scripts/verification_bench.py --paired-tau 1,2,3 [--max-new-tokens 128]
    .venv/bin/python scripts/verification_bench.py --expected 1,2,3 [--max-new-tokens 128]

``--expected SEEDS`` instead: each rule's expected τ on the very same draft paths (token
decoding of every held-out prompt under each seed; at each step, the expected kept drafts of
either rule over the acceptance uniforms, the path and the target's laws fixed), at T = 0.7 /
top-p 0.95 and T = 1: the comparison without the spread of sampling.
``--paired-tau SEEDS`` instead: τ of every held-out prompt decoded alone under each rule, at
T = 0.7 / top-p 0.95 and T = 1, fixed block, under each seed (prompt i, seed s: 1000 s + i),
and the mean paired difference (block − token) with its standard error.

Every contender decodes on its own Engine (its own measured table), warmed up before any is
timed, then timed in interleaved rounds (``bench.measure.measure``); × target-only is the median
of the rounds' paired ratios. Batch 1 decodes the first ``--prompts`` prompts one at a time;
batch 8, one batch of the first 8. Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from candidates_bench import batched, bench_arguments, compare, print_table  # noqa: E402

from dflash2rt import get_backend  # noqa: E402
from dflash2rt.bench.measure import TEMPERATURES, Temperature  # noqa: E402
from dflash2rt.engine.engine import Engine  # noqa: E402
from dflash2rt.engine.request import Request, SamplingParams  # noqa: E402
from dflash2rt.ops import block_verify, verify as ops_verify  # noqa: E402
from dflash2rt.ops.sampling import target_probs  # noqa: E402
from dflash2rt.train.k_curve import load_heldout  # noqa: E402

RULES = ("token", "block")


def with_rule(reqs, rule: str):
    return [dataclasses.replace(q, params=dataclasses.replace(q.params, verification=rule))
            for q in reqs]


def row(pair, backend, prompts, batch: int, t: Temperature, block: int, max_new: int,
        repeats: int) -> list[tuple[str, float | None, float]]:
    """→ [(contender, × target-only, τ)] for one batch size and temperature."""
    specs = [("target-only", False, None, "token")]
    specs += [(f"block {block}, {rule}", True, block, rule) for rule in RULES]
    specs += [(f"adaptive, {rule}", True, None, rule) for rule in RULES]
    return compare(pair, backend, batched(prompts, batch, max_new, t), specs, repeats, with_rule)


def paired_tau(pair, backend, prompts, seeds, block: int, max_new: int) -> None:
    engine = Engine(pair, backend)
    print("| T | τ token | τ block | block − token ± standard error | block / token | pairs |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for t in TEMPERATURES[1:]:
        taus: dict[str, list[float]] = {rule: [] for rule in RULES}
        for seed in seeds:
            for i, p in enumerate(prompts):
                for rule in RULES:
                    q = Request(tuple(p), SamplingParams(
                        max_new_tokens=max_new, temperature=t.temperature, top_p=t.top_p,
                        seed=1000 * seed + i, ignore_eos=True, verification=rule), key=i)
                    taus[rule].append(engine.generate([q], block_size=block)[1].tau)
        d = [b - a for a, b in zip(taus["token"], taus["block"])]
        se = statistics.stdev(d) / len(d) ** 0.5
        tok, blk = statistics.fmean(taus["token"]), statistics.fmean(taus["block"])
        print(f"| {t.label} | {tok:.3f} | {blk:.3f} | {statistics.fmean(d):+.3f} ± {se:.3f} | "
              f"{blk / tok:.3f} | {len(d)} |", flush=True)


class ExpectedKept:
    """While active, every sampled row the cpu backend verifies adds, for the draft path it
    was given, the expected number of drafts each rule keeps (over the acceptance uniforms;
    the path and the target's laws fixed): token Σ_i Π_{j≤i} min(1, p_j(d_j) / q_j(d_j)),
    block Σ_t t · h_t · Π_{j>t} (1 − h_j). Both on the same paths: a paired comparison without
    the spread of the acceptance draws."""

    def __init__(self) -> None:
        self.token, self.block, self.rows = 0.0, 0.0, 0

    def __enter__(self) -> "ExpectedKept":
        self.inner = ops_verify.verify

        def verify(logits, draft, candidates, q, sampling, noise, *args, **kw):
            if sampling.any_sampled:
                self.add(logits, draft, candidates, q, sampling)
            return self.inner(logits, draft, candidates, q, sampling, noise, *args, **kw)

        ops_verify.verify = verify
        return self

    def __exit__(self, *exc) -> None:
        ops_verify.verify = self.inner

    def add(self, logits, draft, candidates, q, sampling) -> None:
        r, rows, _ = logits.shape
        gamma = rows - 1
        p = target_probs(logits, sampling.temperature, sampling.top_k, sampling.top_p,
                         top_k_max=sampling.top_k_max, top_p_rows=sampling.top_p_rows,
                         min_p=sampling.min_p).double()
        p_d = p[:, :gamma].gather(-1, draft.unsqueeze(-1)).squeeze(-1)
        q_d = ops_verify.draft_mass(draft, candidates, q)
        token = torch.cumprod(torch.clamp(p_d / q_d, max=1.0), dim=1).sum(dim=1)
        h = block_verify.keep_probs(block_verify.keep_weights(p_d, q_d), p,
                                    *block_verify.distinct(candidates, q))
        miss = torch.cat([torch.flip(torch.cumprod(torch.flip(1 - h, [1]), 1), [1])[:, 1:],
                          torch.ones(r, 1, dtype=torch.float64)], dim=1)   # Π_{j>t} (1 − h_j)
        block = (torch.arange(1, gamma + 1) * h * miss).sum(dim=1)
        keep = ~sampling.greedy
        self.token += float(token[keep].sum())
        self.block += float(block[keep].sum())
        self.rows += int(keep.sum())


def expected_tau(pair, backend, prompts, seeds, block: int, max_new: int) -> None:
    engine = Engine(pair, backend)
    print("| T | expected τ, token | expected τ, block | block / token | steps |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for t in TEMPERATURES[1:]:
        with ExpectedKept() as e:
            for seed in seeds:
                for i, p in enumerate(prompts):
                    q = Request(tuple(p), SamplingParams(
                        max_new_tokens=max_new, temperature=t.temperature, top_p=t.top_p,
                        seed=1000 * seed + i, ignore_eos=True), key=i)
                    engine.generate([q], block_size=block)
        tok, blk = 1 + e.token / e.rows, 1 + e.block / e.rows
        print(f"| {t.label} | {tok:.3f} | {blk:.3f} | {blk / tok:.3f} | {e.rows} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    bench_arguments(ap, "τ per prompt and seed under each rule, paired, instead")
    ap.add_argument("--expected", default=None, metavar="SEEDS",
                    help="each rule's expected τ on the same draft paths (token decoding), "
                         "instead")
    a = ap.parse_args()
    backend = get_backend("cpu")
    if a.expected:
        pair, prompts, _ = load_heldout(a.model)
        expected_tau(pair, backend, prompts, [int(x) for x in a.expected.split(",")], a.block,
                     a.max_new_tokens)
        return
    if a.paired_tau:
        pair, prompts, _ = load_heldout(a.model)
        paired_tau(pair, backend, prompts, [int(x) for x in a.paired_tau.split(",")], a.block,
                   a.max_new_tokens)
        return
    pair, prompts, _ = load_heldout(a.model, a.prompts)
    print_table(a.batches, lambda batch, t: row(pair, backend, prompts, batch, t, a.block,
                                                a.max_new_tokens, a.repeats))


if __name__ == "__main__":
    main()
