"""Watermark evidence (``dflash2rt bench watermark``), as JSON.

* Detection power: documents generated with the watermark (keys rotating over ``keys``), at
  each temperature; for each length L (new tokens) the detection rate at 1% FPR and the median
  p-value of the first L tokens.
* False positives: unwatermarked texts (held-out text chunks and the unwatermarked generations
  of the same prompts), each scored under ``keys`` keys of its own (fresh per text); the
  empirical rate at nominal 1% and 0.1% with its binomial standard error. Fresh keys per text
  make the scores independent across texts: generated code repeats whole lines across
  documents, so under one shared key texts that share (context, token) pairs score alike, and
  the binomial standard error would understate the spread (docs/benchmarks/watermark.md).
* Cost: τ and tokens/s with the watermark on vs off (same prompts, seeds and block policy),
  side by side; detector throughput in tokens/s."""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from ..engine.engine import Engine
from ..engine.request import Request, SamplingParams
from ..watermark import WatermarkKey, detect


@dataclass
class WatermarkBenchConfig:
    lengths: Sequence[int] = (32, 64, 128, 256)
    temperatures: Sequence[float] = (1.0, 0.7)
    null_texts: int = 1000           # unwatermarked texts, each scored under ``keys`` fresh keys
    keys: int = 5
    batch: int = 16
    block_size: int | None = None    # None: adaptive
    seed: int = 0


class _DetectorClock:
    """Tokens and seconds spent in ``detect``."""

    def __init__(self) -> None:
        self.tokens, self.seconds = 0, 0.0

    def p_value(self, key: WatermarkKey, tokens: Sequence[int]) -> float:
        t0 = time.perf_counter()
        p = detect(key, tokens).p_value
        self.seconds += time.perf_counter() - t0
        self.tokens += len(tokens)
        return p


def _keys(n: int, seed: int) -> list[WatermarkKey]:
    g = np.random.default_rng(seed)
    return [WatermarkKey(g.bytes(32)) for _ in range(n)]


def _generate(engine: Engine, prompts, temp: float, new: int, keys, batch: int,
              block: int | None, seed: int):
    """Each prompt under its key (prompt i: keys[i % len(keys)], None: unwatermarked) in
    batches of one key → (token lists, [(tau, generated, wall_s)] per batch)."""
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


def _cost(runs) -> dict[str, float]:
    gen, wall = sum(r[1] for r in runs), sum(r[2] for r in runs)
    taus = [r[0] for r in runs]
    return {"tau_mean": statistics.fmean(taus), "tokens": gen, "wall_s": wall,
            "tokens_per_s": gen / wall if wall else math.nan}


def _rate(hits: int, n: int) -> dict[str, float]:
    p = hits / n if n else math.nan
    return {"rate": p, "hits": hits, "n": n,
            "std_err": math.sqrt(p * (1 - p) / n) if n else math.nan}


def _detection(marked: list[list[int]], keys: list[WatermarkKey], lengths: Sequence[int],
               clock: _DetectorClock) -> dict[str, dict[str, float]]:
    """Per length: detection rate at 1% FPR, median p-value, share of repeated contexts."""
    per_len = {}
    for n in lengths:
        pv = [clock.p_value(keys[i % len(keys)], toks[:n]) for i, toks in enumerate(marked)]
        per_len[str(n)] = {"detection_rate_at_1pct": sum(p <= 0.01 for p in pv) / len(pv),
                           "median_p_value": float(np.median(pv)),
                           "repeated_share": float(np.mean(
                               [detect(keys[0], t[:n]).repeated_skipped / max(1, len(t[:n]))
                                for t in marked]))}
    return per_len


def fill_nulls(nulls: list[list[int]], heldout_ids: Iterable[list[int]], new: int,
               count: int) -> None:
    """Top ``nulls`` up to ``count`` texts with consecutive chunks of ``new`` tokens of the
    held-out texts."""
    for ids in heldout_ids:
        for s in range(0, len(ids) - new + 1, new):
            if len(nulls) >= count:
                return
            nulls.append(ids[s:s + new])
        if len(nulls) >= count:
            return


def _false_positives(nulls: list[list[int]], cfg: WatermarkBenchConfig,
                     clock: _DetectorClock) -> dict[str, Any]:
    """Every null text under ``cfg.keys`` fresh keys of its own: the rates at 1% and 0.1%."""
    hits1 = hits01 = scored = 0
    null_keys = np.random.default_rng(cfg.seed + 29)
    for toks in nulls:
        for key in _keys(cfg.keys, int(null_keys.integers(2**62))):    # fresh per text
            p = clock.p_value(key, toks)
            scored += 1
            hits1 += p <= 0.01
            hits01 += p <= 0.001
    return {"texts": len(nulls), "scored": scored, "at_1pct": _rate(hits1, scored),
            "at_0.1pct": _rate(hits01, scored)}


def watermark_bench(engine: Engine, prompts: list[list[int]], heldout_ids: Iterable[list[int]],
                    cfg: WatermarkBenchConfig, log: Callable[[str], None] = print
                    ) -> dict[str, Any]:
    """The report (module docstring). ``prompts``: the documents' prompts (token ids);
    ``heldout_ids``: held-out texts as token ids (read lazily), the first null texts."""
    keys = _keys(cfg.keys, cfg.seed + 17)
    new = max(cfg.lengths)
    report: dict[str, Any] = {"docs": len(prompts), "keys": cfg.keys,
                              "lengths": list(cfg.lengths), "block_size": cfg.block_size,
                              "detection": {}, "cost": {}}
    clock = _DetectorClock()
    nulls: list[list[int]] = []
    for temp in cfg.temperatures:
        marked, on = _generate(engine, prompts, temp, new, keys, cfg.batch, cfg.block_size,
                               cfg.seed)
        plain, off = _generate(engine, prompts, temp, new, [None], cfg.batch, cfg.block_size,
                               cfg.seed)
        nulls += plain
        report["cost"][str(temp)] = {"watermark_on": _cost(on), "watermark_off": _cost(off)}
        report["detection"][str(temp)] = _detection(marked, keys, cfg.lengths, clock)
        log(f"T={temp}: {report['detection'][str(temp)]}; cost {report['cost'][str(temp)]}")
    # Null texts: the plain generations, then held-out chunks of max(lengths) tokens.
    fill_nulls(nulls, heldout_ids, new, cfg.null_texts)
    report["false_positives"] = _false_positives(nulls, cfg, clock)
    report["detector_tokens_per_s"] = clock.tokens / clock.seconds if clock.seconds else math.nan
    return report
