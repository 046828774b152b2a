"""The backend's select and verify calls recorded from an engine run, then timed side by side
(``train.k_curve``'s cost columns): interleaved rounds, each call's fastest repeat."""

from __future__ import annotations

import contextlib
import statistics
import time
from typing import Any, Iterator, Sequence

import torch

from ..backend import Backend


@contextlib.contextmanager
def recording_ops(backend: Backend, calls: dict[str, list], n: int) -> Iterator[None]:
    """Record the arguments of the backend's first ``n`` select and verify calls (tensors
    cloned: the engine updates some of its state in place) while the block runs."""
    def wrap(op: str):
        inner = getattr(backend, op)

        def call(*args, **kwargs):
            if len(calls[op]) < n:
                calls[op].append((tuple(a.clone() if isinstance(a, torch.Tensor) else a
                                        for a in args), dict(kwargs)))
            return inner(*args, **kwargs)
        return call

    had = {op: op in vars(backend) for op in ("select", "verify")}
    saved = {op: vars(backend).get(op) for op in had}
    for op in had:
        setattr(backend, op, wrap(op))
    try:
        yield
    finally:
        for op, present in had.items():
            if present:
                setattr(backend, op, saved[op])
            else:
                delattr(backend, op)


def rotated(items: Sequence, i: int) -> list:
    """``items`` rotated left by ``i`` (modulo their count)."""
    i %= max(len(items), 1)
    return list(items[i:]) + list(items[:i])


def time_ops(backend: Backend, captured: dict[int, dict[str, list]], rounds: int,
             min_s: float = 0.02, max_repeats: int = 20) -> dict[int, dict[str, Any]]:
    """Seconds per call of the recorded select / verify calls of every K, in ``rounds``
    interleaved rounds (each K once per round, the order rotated by round). In a round each
    recorded call runs enough times to fill ``min_s`` (at least twice, at most
    ``max_repeats``; once for a call over 0.1 s) and counts its fastest run, so that a
    preemption by another process does not count. → per K and op: the fastest round's seconds
    per call (``*_ms``; ``*_ms_median`` the median round's), its ratio to the first K's
    (``*_vs_first_k``), and the median over rounds of that ratio within a round
    (``*_vs_first_k_paired``: steadier under a slow drift of the machine, but not under
    another process's bursts on a shared one, which the fastest round leaves out; the unpaired
    ratio where no round timed the first K above 0 s)."""
    ks = list(captured)
    ops = ("select", "verify")
    secs: dict[int, dict[str, list[float]]] = {k: {op: [] for op in ops} for k in ks}
    reps: dict[tuple[int, str], int] = {}
    with torch.inference_mode(), backend.run_context():
        for k in ks:                                      # untimed pass: allocator, repeats
            for op in ops:
                calls = captured[k][op]
                t0 = time.perf_counter()
                for args, kwargs in calls:
                    getattr(backend, op)(*args, **kwargs)
                per = (time.perf_counter() - t0) / max(len(calls), 1)
                reps[k, op] = 1 if per > 0.1 else \
                    max(2, min(max_repeats, int(min_s / max(per, 1e-9))))
        for r in range(rounds):
            for k in rotated(ks, r):
                for op in ops:
                    calls = captured[k][op]
                    fn = getattr(backend, op)
                    total = 0.0
                    for args, kwargs in calls:
                        best = float("inf")
                        for _ in range(reps[k, op]):
                            t0 = time.perf_counter()
                            fn(*args, **kwargs)
                            best = min(best, time.perf_counter() - t0)
                        total += best
                    secs[k][op].append(total / max(len(calls), 1))
    ref = ks[0]
    out: dict[int, dict[str, Any]] = {}
    for k in ks:
        row: dict[str, Any] = {}
        for op in ops:
            row[f"{op}_ms"] = 1e3 * min(secs[k][op])
            row[f"{op}_ms_median"] = 1e3 * statistics.median(secs[k][op])
            row[f"{op}_vs_first_k"] = min(secs[k][op]) / max(min(secs[ref][op]), 1e-12)
            row[f"{op}_vs_first_k_paired"] = statistics.median(
                [a / b for a, b in zip(secs[k][op], secs[ref][op]) if b > 0]
                or [row[f"{op}_vs_first_k"]])
            row[f"{op}_ms_rounds"] = [1e3 * x for x in secs[k][op]]
            row[f"{op}_repeats"] = reps[k, op]
        out[k] = row
    return out
