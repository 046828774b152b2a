"""The decode loop's pieces: a run's steppers per block size, one decode step (the bodies, the
step's one device→host transfer, the host work), and the adaptive schedule's calibration steps.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from typing import Callable

import numpy as np

from ..backend import Fallbacks
from ..constraints.host import block_masks
from ..ops.procs import unpack_logprobs
from .graphed import GraphStats, Stepper, graph_delta
from .output import Collector
from .cost_table import CostNoise
from .schedule import AdaptiveSchedule, bucket_of
from .state import BatchState
from .stats import RunStats
from .step import raise_flags

CALIBRATION_KEY = 1 << 62      # calibration steps draw uniforms under keys no real step uses


class Steppers:
    """A run's Stepper per block size (1: a target-only step), made by ``make`` on first use;
    each one's capture seconds and graph counters are taken then, so the run reports its part.
    Graph stats keep their names across block sizes ("verify greedy"): per bucket, replays and
    eager runs are summed over the blocks, captured / verified hold for every block, and
    refused is the first refusal (calibration steps' replays are counted too)."""

    def __init__(self, make: Callable[[int], Stepper]) -> None:
        self.make = make
        self.used: dict[int, tuple[Stepper, float, GraphStats]] = {}

    def __getitem__(self, block: int) -> Stepper:
        if block not in self.used:
            s = self.make(block)
            self.used[block] = (s, s.capture_s, s.graph_stats())
        return self.used[block][0]

    def capture_s(self) -> float:
        return sum(s.capture_s - c0 for s, c0, _ in self.used.values())

    def graphs(self) -> GraphStats:
        out: GraphStats = {}
        for b, (s, _, g0) in sorted(self.used.items()):
            for name, buckets in graph_delta(g0, s.graph_stats()).items():
                for size, d in buckets.items():
                    was = out.setdefault(name, {}).get(size)
                    out[name][size] = d if was is None else {
                        "captured": was["captured"] and d["captured"],
                        "verified": was["verified"] and d["verified"],
                        "fresh": d["fresh"] if was["fresh"] is None else (
                            was["fresh"] if d["fresh"] is None else was["fresh"] and d["fresh"]),
                        "replays": was["replays"] + d["replays"],
                        "eager": was["eager"] + d["eager"], "refused": was["refused"] or d["refused"]}
        return out


def decode_step(stepper: Stepper, block: int, st: BatchState, stats: RunStats, out: Collector,
                fallbacks: Fallbacks, check: Callable[[list], None] | None = None
                ) -> tuple[BatchState, list[int], float]:
    """One decode step: the step's bodies (step.py), the one device→host transfer, then the
    host work: raise on bad flags, emit accepted tokens, mirror lengths, drop finished.
    ``check``: called with the step's host rows right after the transfer (``Engine.step_check``).
    → (the batch left, drafts accepted per row of ``st``, the step's seconds without capture)."""
    t0, cap0, bucket = time.perf_counter(), stepper.capture_s, bucket_of(st.size)
    res = stepper.step(st, fallbacks.report, stats.time,   # eager bodies time themselves
                       between=verify_masks(st, out, stats, block))
    st.lens.copy_(res.lens)
    st.anchor.copy_(res.anchor)
    if st.procs is not None:             # the committed tokens' counts, on the device
        st.procs.commit_(res.tokens, res.accept_len + 1)
    if st.wm is not None:                # the committed positions' watermark contexts
        st.wm.commit_(res.tokens, res.accept_len + 1)
    if st.constraint is not None:        # the constraint states, on the device
        st.constraint.commit_(res.tokens, res.accept_len + 1)
    t1 = time.perf_counter()
    host = res.for_host().tolist()       # the step's one device→host sync: [R, 2 + B]
    stats.syncs += 1
    if check is not None:
        check(host)
    if stepper.adapter is not None:      # launch + the wait for the graphs at the sync
        t1 = time.perf_counter()
        stats.time["graphs"] += t1 - t0
    raise_flags([h[1] for h in host], st.rows)
    stats.steps += 1
    accepted = [h[0] for h in host]
    stats.record_accepts(accepted, block)
    b = res.tokens.shape[1]
    for i, h in enumerate(host):
        lp = None
        if st.procs is not None and st.procs.logprobs is not None:
            lp = unpack_logprobs(h[2 + b:], b, st.procs.logprobs, st.procs.wants[i])[:h[0] + 1]
        out.add(st.rows[i], h[2:3 + h[0]], lp)
        st.host_lens[i] += h[0] + 1
    st = drop_finished(st, out)
    host_masks(st, out, stats)
    end = time.perf_counter()
    stats.time["host"] += end - t1
    seconds = end - t0 - (stepper.capture_s - cap0)
    stats.record_step_time(block, bucket, seconds)
    return st, accepted, seconds


def calibrate(steppers: Steppers, st: BatchState, sched: AdaptiveSchedule, stats: RunStats,
              fallbacks: Fallbacks, out: Collector | None = None,
              noise: CostNoise | None = None) -> None:
    """Time the candidates the schedule lacks at this batch's bucket and at every smaller bucket
    (the batch's first rows: a prefix of its slots, so nothing moves), so that a choice never
    depends on which buckets earlier runs happened to time: steps whose results are discarded
    (the batch state stays as it is; cache rows past the committed lengths are scratch), under
    other RNG keys, in rounds over the candidates, each timed to its sync, capture excluded.
    Each timed step follows an untimed one of the same block: a step right after another block
    size runs on what that one left in the caches (a target-only step right after speculative
    steps runs slower than in a run of them), and the schedule decides between runs of steps,
    not single ones; what a single switch costs, the calls' observed steps teach the table.
    ``noise``: the timings go to the schedule distorted (``CostNoise``; the run's stats keep the
    real ones)."""
    scratch: dict[str, float] = collections.defaultdict(float)
    k = bucket_of(st.size)
    while k >= 1:
        if sched.calibrate(k):
            rows = st if k >= st.size else st.keep(list(range(k)))
            probe = dataclasses.replace(rows, key=rows.key ^ CALIBRATION_KEY)
            while todo := sched.calibrate(k):  # rounds: a machine's drift hits all alike
                for b in todo:
                    s = steppers[b]
                    between = None if out is None else verify_masks(probe, out, stats, b, False)
                    for timed in (False, True):      # warm, then timed (docstring)
                        t0, cap0 = time.perf_counter(), s.capture_s
                        s.step(probe, fallbacks.report, scratch, between).for_host().tolist()
                        seconds = time.perf_counter() - t0 - (s.capture_s - cap0)
                        if timed:
                            sched.measure(b, k, seconds if noise is None
                                          else noise.step(seconds, b, k, sched.mode))
                        stats.calibration_steps += 1
                        stats.calibration_s += seconds
        k //= 2


def drop_finished(st: BatchState, out: Collector) -> BatchState:
    alive = [i for i, row in enumerate(st.rows) if not out.done(row)]
    return st if len(alive) == st.size else st.keep(alive)


def verify_masks(st: BatchState, out: Collector, stats: RunStats, block: int,
                 count: bool = True) -> Callable[[dict], None] | None:
    """Generic constraint hooks in a speculative step: a ``Stepper.step`` callback that copies
    the step's drafts to the host (one more device→host round trip, counted in ``syncs`` and
    ``constraint_host_masks``) and sets every verify row's mask, row j with the hook's state
    after d_1..d_j (``constraints.host.block_masks``); None when the batch has no such hook.
    ``count`` False: a calibration step's (its syncs are not the run's decode syncs)."""
    c = st.constraint
    if block < 2 or c is None or c.host_mask is None:
        return None

    def between(drafted: dict) -> None:
        drafts = drafted["draft"].tolist()                  # the extra round trip
        if count:
            stats.syncs += 1
            stats.constraint_host_masks += 1
        masks = np.ones((st.size, block, c.host_mask.shape[1]), bool)
        for i, row in enumerate(st.rows):
            tracker = out.trackers.get(row)
            if tracker is not None and not tracker.table:
                masks[i] = block_masks(tracker, drafts[i])
        c.set_host_block_(masks)
    return between


def host_masks(st: BatchState, out: Collector, stats: RunStats) -> None:
    """Generic constraint hooks: their masks for the next token (a target-only step's row, a
    speculative step's row 0), built
    on the host from the tokens it already has, copied to the device — one host round trip per
    step, counted in ``stats.constraint_host_masks``. Token automata need none of this."""
    if st.size and st.constraint is not None and st.constraint.host_mask is not None:
        st.constraint.set_host_masks_([out.next_mask(row) for row in st.rows])
        stats.constraint_host_masks += 1
