"""Op micro-benchmarks: latency of conv / selector / verify at the model's shapes, and the
achieved memory bandwidth against the device's peak where it is known."""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Sequence

import torch

from ..backend import Backend
from ..bench.measure import sync
from ..ops.batch import BlockNoise, SamplingBatch
from ..ops.selector import SelectorParams


def peak_bandwidth(device_name: str, vendors: Sequence[Any] | None = None) -> float | None:
    """Peak DRAM bandwidth (GB/s) of ``device_name`` from the first GPU vendor that lists it
    (``GpuVendor.peak_gbps``, declared by the installed plugins); None when none does."""
    if vendors is None:
        from ..registry import Registry

        vendors = Registry.discover().vendors
    return next((gbps for v in vendors if (gbps := v.peak_bandwidth(device_name))), None)


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
