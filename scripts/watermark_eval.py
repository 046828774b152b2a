"""Watermark evidence on the bundled pair, as JSON.

* Detection power: N documents generated with the watermark (prompts cut from held-out corpus
  files, keys rotating over ``--keys``), at each temperature; for each length L (new tokens) the
  detection rate at 1% FPR and the median p-value of the first L tokens.
* False positives: >= ``--null-texts`` unwatermarked texts — held-out corpus chunks and the
  unwatermarked generations of the same prompts — each scored under ``--keys`` keys of its own
  (fresh per text); the empirical rate at nominal 1% and 0.1% (with its binomial standard
  error). Fresh keys per text make the scores independent across texts: generated code repeats
  whole lines across documents, so under one shared key texts that share (context, token) pairs
  score alike, and the binomial standard error would understate the spread
  (docs/benchmarks/watermark.md).
* Cost: tau and tokens/s with the watermark on vs off (same prompts, seeds and block policy),
  side by side; detector throughput in tokens/s.

Full size (the lead runs it): ``--docs 200 --null-texts 1000``. A smoke run:
``python scripts/watermark_eval.py --docs 4 --lengths 32,64 --null-texts 20 --keys 2 --out x``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time

import numpy as np

from dflash2rt.api import resolve_model
from dflash2rt.engine.engine import Engine
from dflash2rt.engine.request import Request, SamplingParams
from dflash2rt.registry import Registry
from dflash2rt.train.corpus import cut_prompts, load_corpus
from dflash2rt.watermark import WatermarkKey, detect


def _keys(n: int, seed: int) -> list[WatermarkKey]:
    g = np.random.default_rng(seed)
    return [WatermarkKey(g.bytes(32)) for _ in range(n)]


def _generate(engine, prompts, temp, new, keys, batch, block, seed):
    """Each prompt under its key (prompt i: keys[i % len(keys)], None: unwatermarked) in
    batches of one key → (token lists, [(tau, tokens/s, generated, wall_s)] per batch)."""
    out: list[list[int] | None] = [None] * len(prompts)
    runs = []
    for k, key in enumerate(keys):
        idx = [i for i in range(len(prompts)) if i % len(keys) == k]
        for s in range(0, len(idx), batch):
            part = idx[s:s + batch]
            reqs = [Request(tuple(prompts[i]), SamplingParams(
                max_new_tokens=new, temperature=temp, seed=seed + i, ignore_eos=True))
                for i in part]
            res, st = engine.generate(reqs, block_size=block, watermark=key)
            for i, o in zip(part, res):
                out[i] = list(o.token_ids)
            runs.append((st.tau, st.generated, st.wall_s))
    return out, runs


def _cost(runs) -> dict:
    gen, wall = sum(r[1] for r in runs), sum(r[2] for r in runs)
    taus = [r[0] for r in runs]
    return {"tau_mean": statistics.fmean(taus), "tokens": gen, "wall_s": wall,
            "tokens_per_s": gen / wall if wall else math.nan}


def _rate(hits: int, n: int) -> dict:
    p = hits / n if n else math.nan
    return {"rate": p, "hits": hits, "n": n,
            "std_err": math.sqrt(p * (1 - p) / n) if n else math.nan}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default=None)
    ap.add_argument("--model", default="stdlib-code")
    ap.add_argument("--docs", type=int, default=200, help="watermarked documents per temperature")
    ap.add_argument("--lengths", default="32,64,128,256")
    ap.add_argument("--temperatures", default="1.0,0.7")
    ap.add_argument("--null-texts", type=int, default=1000,
                    help="unwatermarked texts (corpus chunks + generations), each under every key")
    ap.add_argument("--keys", type=int, default=5)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--block-size", type=int, default=None, help="fixed block (default adaptive)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    lengths = [int(x) for x in args.lengths.split(",")]
    temps = [float(x) for x in args.temperatures.split(",")]
    backend = Registry.discover().select(args.backend).backend
    pair = resolve_model(args.model, backend.device)
    engine = Engine(pair, backend)
    corpus = load_corpus()
    prompts = [p["prompt_ids"] for p in cut_prompts(corpus.heldout, pair.tokenizer.encode,
                                                    args.docs, 16, 64, args.seed)]
    keys = _keys(args.keys, args.seed + 17)
    new = max(lengths)
    report: dict = {"model": pair.name, "backend": backend.name, "docs": args.docs,
                    "keys": args.keys, "lengths": lengths, "block_size": args.block_size,
                    "detection": {}, "cost": {}}
    nulls: list[list[int]] = []
    det_tokens, det_s = 0, 0.0
    for temp in temps:
        marked, on = _generate(engine, prompts, temp, new, keys, args.batch, args.block_size,
                               args.seed)
        plain, off = _generate(engine, prompts, temp, new, [None], args.batch, args.block_size,
                               args.seed)
        nulls += plain
        report["cost"][str(temp)] = {"watermark_on": _cost(on), "watermark_off": _cost(off)}
        per_len = {}
        for n in lengths:
            pv = []
            for i, toks in enumerate(marked):
                t0 = time.perf_counter()
                pv.append(detect(keys[i % len(keys)], toks[:n]).p_value)
                det_s += time.perf_counter() - t0
                det_tokens += len(toks[:n])
            per_len[str(n)] = {"detection_rate_at_1pct": sum(p <= 0.01 for p in pv) / len(pv),
                               "median_p_value": float(np.median(pv)),
                               "repeated_share": float(np.mean(
                                   [detect(keys[0], t[:n]).repeated_skipped / max(1, len(t[:n]))
                                    for t in marked]))}
        report["detection"][str(temp)] = per_len
        print(f"T={temp}: {per_len}; cost {report['cost'][str(temp)]}", file=sys.stderr)
    # Null texts: held-out corpus chunks of max(lengths) tokens, then the plain generations.
    for _, text in corpus.heldout:
        ids = pair.tokenizer.encode(text)
        for s in range(0, len(ids) - new + 1, new):
            if len(nulls) >= args.null_texts:
                break
            nulls.append(ids[s:s + new])
        if len(nulls) >= args.null_texts:
            break
    hits1 = hits01 = scored = 0
    null_keys = np.random.default_rng(args.seed + 29)
    for toks in nulls:
        for key in _keys(args.keys, int(null_keys.integers(2**62))):    # fresh per text
            t0 = time.perf_counter()
            p = detect(key, toks).p_value
            det_s += time.perf_counter() - t0
            det_tokens += len(toks)
            scored += 1
            hits1 += p <= 0.01
            hits01 += p <= 0.001
    report["false_positives"] = {"texts": len(nulls), "scored": scored,
                                 "at_1pct": _rate(hits1, scored),
                                 "at_0.1pct": _rate(hits01, scored)}
    report["detector_tokens_per_s"] = det_tokens / det_s if det_s else math.nan
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    print(json.dumps(report["false_positives"]), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
