"""The adaptive policy's measured table and how it learns between calls (schedule.py).

Keyed (block, bucket, mode): ``samples`` are the calibration steps' seconds, ``observed`` the
costs folded in from decode steps after each call (``fold_costs``), ``accept`` the per-slot
acceptance counts pooled per (mode, law) over calls (``fold_accept``), ``calls`` and
``overhead`` the call plan's records (call_plan.py). Its owner is the Engine (``Engine.table``),
or whoever passes one to several engines (the api keeps one per model pair and device). A
schedule reads it once per call (``costs_now``, ``pool``), so choices within a call never
follow it. ``CostNoise``: the seeded distortion of every measured time, for tests.
"""

from __future__ import annotations

import math
import os
import random
import statistics
from typing import Any, Callable, Hashable

Key = tuple[int, int, str]           # (block, bucket, mode)

MAX_CALL_GAP = 8    # at most this many target-only calls between speculative ones (plan)
FIRST_CALL_GAP = 2  # target-only calls before the first speculative probe (then 4, 8, 8, ...)
MIN_STEPS = 3       # a call's steps of one (block, bucket) needed to move its table entry
TRACK = 0.5         # a measured table's default: each call moves an entry halfway to its steps
POOL_MIN = 8        # reached observations of a slot before the pooled prior replaces the chain
POOL_CAP = 256.0    # the pooled counts are scaled down past this many observations of slot 1

PERTURB_ENV = "DFLASH2RT_PERTURB_COSTS"


class CostNoise:
    """Seeded distortion of every time the adaptive schedule measures, for proving that tests
    and tools do not depend on the machine's speed: with ``DFLASH2RT_PERTURB_COSTS=SEED`` set,
    each (block, bucket, mode) entry's seconds are scaled by a factor drawn once from the seed
    (e^U(-2.5, 2.5): any entry may look 12x cheaper or dearer than another, so any block can
    win), each sample by a further jitter e^U(-0.5, 0.5), and a call's wall seconds (what the
    call plan learns from) by e^U(-1, 1). Choices stay lossless whatever the costs; only which
    blocks run changes. Runs report it in ``RunStats.cost_noise``."""

    def __init__(self, seed: str) -> None:
        self.seed = seed
        self._rng = random.Random(f"{seed}:samples")
        self._factors: dict[tuple, float] = {}

    def describe(self) -> str:
        return f"step costs perturbed ({PERTURB_ENV}={self.seed})"

    def step(self, seconds: float, block: int, bucket: int, mode: str) -> float:
        key = (block, bucket, mode)
        if key not in self._factors:
            self._factors[key] = math.exp(random.Random(f"{self.seed}:{key}").uniform(-2.5, 2.5))
        return seconds * self._factors[key] * math.exp(self._rng.uniform(-0.5, 0.5))

    def call(self, seconds: float) -> float:
        return seconds * math.exp(self._rng.uniform(-1.0, 1.0))


_NOISES: dict[str, CostNoise] = {}


def cost_noise() -> CostNoise | None:
    """The process's ``CostNoise`` for ``$DFLASH2RT_PERTURB_COSTS`` (None when unset)."""
    seed = os.environ.get(PERTURB_ENV, "").strip()
    return _NOISES.setdefault(seed, CostNoise(seed)) if seed else None


def bucket_of(rows: int) -> int:
    """The cost table's batch bucket: the next power of two ≥ rows (the graph buckets)."""
    return 1 << max(rows - 1, 0).bit_length()


class MeasuredTable:
    """A measured cost table: calibration samples, the costs observed in decode steps and the
    pooled acceptance; shared by the schedules of one pair and device."""

    def __init__(self) -> None:
        self.samples: dict[Key, list[float]] = {}
        self.observed: dict[Key, float] = {}
        self.accept: dict[tuple, tuple[list[float], list[float]]] = {}   # (mode, law) → counts
        # (mode, law, bucket) → (target-only calls since the last speculative one, the gap)
        self.calls: dict[tuple, tuple[int, int]] = {}
        # (mode, law, bucket, "spec" | "target-only") → the seconds planned calls of that kind
        # took beyond their tokens at the rate projected for them (the prefill, host work,
        # the projection's error), tracked over calls (``fold_overhead``)
        self.overhead: dict[tuple, float] = {}

    def calibrated(self, key: Key) -> float | None:
        """The median of ``key``'s calibration samples (None: not calibrated)."""
        s = self.samples.get(key)
        return statistics.median(s) if s else None

    def costs_now(self, drift: bool = True) -> dict[Key, float]:
        """Every calibrated or observed entry's cost now: observed, else its calibration × its
        bucket's drift (the geometric mean of observed / calibrated over the bucket's observed
        entries; ``drift`` False: its calibration alone)."""
        cal = {k: c for k in self.samples if (c := self.calibrated(k)) is not None}
        if not drift:
            return {**cal, **self.observed}
        logs: dict[tuple[int, str], list[float]] = {}
        for key, c in self.observed.items():
            if key in cal and cal[key] > 0 and c > 0:
                logs.setdefault(key[1:], []).append(math.log(c / cal[key]))
        scale = {km: math.exp(sum(v) / len(v)) for km, v in logs.items()}
        return {**self.observed, **{key: self.observed.get(key, c * scale.get(key[1:], 1.0))
                                    for key, c in cal.items()}}

    def fold_costs(self, steps: dict[Key, list[float]], frozen: dict[Key, float],
                   track: float, first: bool = False) -> None:
        """A call's step seconds per key (``frozen``: the costs it decided with): each key
        with ``MIN_STEPS`` steps moves ``track`` of the way to the call's median step.
        ``first``: a key with no cost yet takes the median (a table never calibrated)."""
        for key, secs in sorted(steps.items()):
            base = self.observed.get(key, frozen.get(key))
            if base is None:                                    # calibrated in this call
                base = self.calibrated(key)
            if base is None and first and len(secs) >= MIN_STEPS:
                base = statistics.median(secs)
            if len(secs) < MIN_STEPS or base is None:
                continue
            self.observed[key] = base + track * (statistics.median(secs) - base)

    def fold_overhead(self, key: tuple, seconds: float, track: float) -> None:
        """A planned call's seconds beyond its projected steps: ``key``'s entry moves
        ``track`` of the way to it (the first call sets it); a non-finite value is ignored."""
        if not math.isfinite(seconds):
            return
        was = self.overhead.get(key)
        self.overhead[key] = seconds if was is None else was + track * (seconds - was)

    def pool(self, mode: str, law: Hashable) -> list[float | None]:
        """The pooled acceptance per slot for (mode, law); None where a slot has fewer than
        ``POOL_MIN`` observations."""
        acc, seen = self.accept.get((mode, law), ((), ()))
        return [a / n if n >= POOL_MIN else None for a, n in zip(acc, seen)]

    def fold_accept(self, mode: str, law: Hashable,
                    counts: tuple[list[float], list[float]]) -> None:
        """Add a call's per-slot (accepted, reached) counts to the (mode, law) pool, scaled
        down so that slot 1 keeps at most ``POOL_CAP`` observations."""
        acc, seen = self.accept.setdefault((mode, law), ([], []))
        for mine, pooled in zip(counts, (acc, seen)):
            pooled.extend([0.0] * (len(mine) - len(pooled)))
            for j, c in enumerate(mine):
                pooled[j] += c
        if seen and seen[0] > POOL_CAP:
            scale = POOL_CAP / seen[0]
            acc[:], seen[:] = [a * scale for a in acc], [n * scale for n in seen]

    def accept_copy(self) -> "MeasuredTable":
        """A new table holding a copy of this one's acceptance pool only."""
        out = MeasuredTable()
        out.accept = {k: (list(a), list(n)) for k, (a, n) in self.accept.items()}
        return out


# Listeners called with a schedule whenever one over a measured table (not a fixed one) begins a
# call (``add_measured_begin_listener``; schedule.py calls ``measured_begin``).
_MEASURED_BEGIN: list[Callable[[Any], None]] = []


def add_measured_begin_listener(listener: Callable[[Any], None]) -> Callable[[], None]:
    """Call ``listener(schedule)`` whenever a schedule over a measured table (not a fixed one)
    begins a call, i.e. whenever choices are about to come from this machine's timings (CI
    lists the tests that did so: tests/conftest.py). → a function that removes the listener
    (calling it twice is harmless)."""
    _MEASURED_BEGIN.append(listener)

    def remove() -> None:
        if listener in _MEASURED_BEGIN:
            _MEASURED_BEGIN.remove(listener)
    return remove


def measured_begin(schedule: Any) -> None:
    """Tell every listener that ``schedule`` begins a call over a measured table."""
    for listener in tuple(_MEASURED_BEGIN):
        listener(schedule)
