"""Adaptive block-size schedules for the exact lattice laws (L0 on the reference, L3 on a
backend): each step's block size b (γ = b − 1 draft slots; b = 1 is a target-only step, one
token drawn from the target row with the bonus stream) is a deterministic function of the
past — ``schedule(history, ctx, peek) -> b`` in 1..bmax, where ``history`` holds (block,
accepted) of every earlier step (accepted = 0 for a target-only step) and ``ctx`` the committed
tokens. ``peek`` is the current step's slot-0 acceptance coin: a lossless schedule never reads
it (``mutants.peeking_schedule`` does, and the law tests must catch it). Each step is lossless
given everything before it, so any such schedule keeps the joint law equal to the target's
(docs/verification.md, "Conditions the proof needs").
"""

from __future__ import annotations

import zlib
from typing import Callable

Schedule = Callable[[tuple, tuple, float], int]

# A fixed cost table (seconds of one step by block size; block 1 = one target row): the
# cost-model schedule below and ``dflash2rt.engine.policy.schedule.AdaptiveSchedule`` read it instead
# of measured times, so the schedule is a deterministic function of the accept history.
COSTS = {1: 1.0, 2: 1.25, 3: 1.5, 4: 1.75, 5: 2.0, 6: 2.25, 7: 2.5, 8: 2.75}


def accept_driven(bmax: int) -> Schedule:
    """Previous step's accept length: full block first; no draft accepted → target-only next;
    all accepted → one slot more; else accepted + 1 slots; after a target-only step → 2."""
    def schedule(history: tuple, ctx: tuple, peek: float) -> int:
        if not history:
            return bmax
        block, acc = history[-1]
        if block == 1:
            return min(2, bmax)
        if acc == 0:
            return 1
        return min(bmax, block + 1 if acc == block - 1 else acc + 1)
    return schedule


def prefix_driven(bmax: int) -> Schedule:
    """The committed prefix (last token and length) picks the block, 1 included."""
    def schedule(history: tuple, ctx: tuple, peek: float) -> int:
        return 1 + (3 * ctx[-1] + len(ctx) + len(history)) % bmax
    return schedule


def hashed(bmax: int) -> Schedule:
    """An adversarial function of the whole past (accept history and prefix)."""
    def schedule(history: tuple, ctx: tuple, peek: float) -> int:
        return 1 + zlib.crc32(repr(("h", history, ctx)).encode()) % bmax
    return schedule


def slot_rates(history: tuple, bmax: int) -> list[float]:
    """Per-slot acceptance estimates from the history: slot j was tried in every step with
    block − 1 > j whose first j drafts were accepted; Laplace (accepted + 1) / (tried + 2)."""
    tried, hit = [0] * bmax, [0] * bmax
    for block, acc in history:
        for j in range(min(acc + 1, block - 1)):
            tried[j] += 1
            hit[j] += j < acc
    return [(h + 1) / (t + 2) for h, t in zip(hit, tried)]


def cost_model(bmax: int, costs: dict | None = None) -> Schedule:
    """Expected tokens per second from per-slot acceptance and a fixed cost table: block b
    yields 1 + Σ_{j<b−1} Π_{i≤j} α_i tokens; the best ratio wins (lowest b on ties)."""
    costs = costs or COSTS

    def schedule(history: tuple, ctx: tuple, peek: float) -> int:
        rates, best, best_b = slot_rates(history, bmax), -1.0, 1
        for b in range(1, bmax + 1):
            tokens, run = 1.0, 1.0
            for j in range(b - 1):
                run *= rates[j]
                tokens += run
            if tokens / costs[b] > best + 1e-12:
                best, best_b = tokens / costs[b], b
        return best_b
    return schedule


SCHEDULES = {
    "accept-driven": (accept_driven, "previous accept length (0 → a target-only step)"),
    "prefix-driven": (prefix_driven, "committed prefix: last token and length"),
    "hashed": (hashed, "a hash of the whole accept history and prefix"),
    "cost-model": (cost_model, "per-slot acceptance and a fixed cost table"),
}
