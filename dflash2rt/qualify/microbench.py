"""Op micro-benchmarks: latency of conv / selector / verify at the model's shapes, and the
achieved memory bandwidth against the device's peak where it is known."""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import torch

from ..backend import Backend
from ..bench.measure import sync
from ..ops.batch import BlockNoise, SamplingBatch
from ..ops.selector import SelectorParams

# Peak DRAM bandwidth (GB/s) by device-name substring, from vendor data sheets.
PEAK_GBPS = {"H200": 4800.0, "H100": 3350.0, "A100": 2039.0, "L40S": 864.0, "MI300X": 5300.0,
             "MI250X": 3277.0, "Max 1550": 3277.0, "Arc A770": 560.0}


def peak_bandwidth(device_name: str) -> float | None:
    return next((v for k, v in PEAK_GBPS.items() if k in device_name), None)


def _time(fn: Callable[[], Any], device: torch.device, reps: int) -> float:
    fn()
    sync(device)
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync(device)
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def op_benchmarks(backend: Backend, shapes: dict[str, int], batches: tuple[int, ...],
                  device_name: str, reps: int = 10) -> list[dict[str, Any]]:
    """shapes: hidden, vocab, block, taps, groups, top_k, rank (from the model's configs)."""
    dev, dt = backend.device, torch.float32
    h, v, b = shapes["hidden"], shapes["vocab"], shapes["block"]
    tk, g, k, rank = shapes["taps"], shapes["groups"], shapes["top_k"], shapes["rank"]
    gamma, peak, rows = b - 1, peak_bandwidth(device_name), []
    gen = torch.Generator().manual_seed(0)
    rnd = lambda *s: torch.randn(*s, generator=gen).to(dev, dt)  # noqa: E731
    for r in batches:
        n = r * b
        x, base, delta = rnd(n, h), rnd(tk, h), rnd(n, tk, g)
        logits, proj, cb = rnd(r, gamma, v), rnd(r, gamma, rank), rnd(v, rank)
        anchor = torch.zeros(r, dtype=torch.int64, device=dev)
        vlogits = rnd(r, gamma + 1, v)
        noise = BlockNoise.draw(torch.zeros(r, dtype=torch.int64, device=dev),
                                torch.zeros(r, dtype=torch.int64, device=dev),
                                torch.zeros(r, dtype=torch.int64, device=dev), gamma)
        params = SelectorParams(k, 1.0, None)
        cases = {
            "conv": (lambda: backend.conv_prepare(x, base, delta, b),
                     4 * (2 * n * h + tk * h + n * tk * g)),
            "select": (lambda: backend.select(logits, proj, anchor, cb, cb, params,
                                              SamplingBatch.greedy_batch(r, dev), noise.walk),
                       4 * r * gamma * (v + 2 * k * rank)),
        }
        for mode, temp in (("greedy", 0.0), ("sampled", 1.0)):
            sampling = SamplingBatch.build([temp] * r, [0] * r, [1.0] * r, dev)
            sel = backend.select(logits, proj, anchor, cb, cb, params, sampling, noise.walk)
            cases[f"verify_{mode}"] = (
                lambda s=sampling, q=sel: backend.verify(vlogits, q.draft, q.candidates, q.q, s,
                                                         noise, check=False),
                4 * r * (gamma + 1) * v * (1 if temp == 0 else 3))
        for op, (fn, nbytes) in cases.items():
            sec = _time(fn, dev, reps)
            gbps = nbytes / sec / 1e9
            rows.append({"op": op, "batch": r, "latency_us": sec * 1e6, "bytes": nbytes,
                         "achieved_gbps": gbps, "peak_gbps": peak,
                         "fraction_of_peak": gbps / peak if peak else None})
    return rows
