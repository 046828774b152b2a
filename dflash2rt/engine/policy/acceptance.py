"""A request's acceptance estimates α_1 .. α_n from its own (decayed) per-slot counts and the
acceptance pooled over earlier calls (``AdaptiveSchedule.alphas`` picks the estimator; the
schedule keeps the counts and the pool). Both are pure functions of those numbers."""

from __future__ import annotations

from typing import Sequence

# Pseudo-observations of the prior per mode (``chained``). Greedy acceptance is a function of the
# context, so a request's own recent outcomes say where it is predictable (runs of boilerplate):
# a light prior. A sampled slot is accepted by a coin as well, so a request's last few outcomes
# are mostly that noise: the pooled law weighs more (with a light prior a sampled request falls
# back to target-only steps after chance rejections). Evidence: docs/benchmarks/adaptive.md.
PRIOR_WEIGHT = {"greedy": 1.0, "sampled": 4.0}
# Once a pool exists, a request's α is the pooled per-slot profile times one factor of its own
# (``scaled``): its accepted drafts over those the profile expected of the slots it reached, both
# counted with ``ROW_WEIGHT`` expected acceptances of prior (a factor of 1). A rejection then
# lowers every slot a little instead of one slot a lot: a greedy rejection says where the text
# is hard, not which slot is weak, and the finish rule prices a batch by its slowest rows, so
# per-slot estimates halved by one chance rejection drove batches to target-only steps.
# Evidence: docs/benchmarks/adaptive.md.
ROW_WEIGHT = 12.0
ALPHA_CAP = 0.99    # a scaled α stays below 1 (a row that accepts everything keeps some doubt)

Pool = Sequence["float | None"]


def scaled(acc: Sequence[float], seen: Sequence[float], pool: Pool, slots: int,
           prior: float) -> list[float]:
    """The pooled profile (``pool``, whose slot 1 is known; past its last known slot each slot
    takes the previous one's) times the row's factor (accepted ``acc`` and reached ``seen``
    counts per slot, ``ROW_WEIGHT``), capped at ``ALPHA_CAP``."""
    profile, a = [], prior
    for j in range(max(slots, len(seen))):
        a = pool[j] if j < len(pool) and pool[j] is not None else a
        profile.append(a)
    factor = (sum(acc) + ROW_WEIGHT) / (sum(n * p for n, p in zip(seen, profile)) + ROW_WEIGHT)
    return [min(p * factor, ALPHA_CAP) for p in profile[:slots]]


def chained(acc: Sequence[float], seen: Sequence[float], pool: Pool, slots: int, prior: float,
            weight: float) -> list[float]:
    """Each slot's own counts over ``weight`` pseudo-observations at a prior: the pooled slot's
    acceptance where there is one, else the previous slot's estimate (slot 1: ``prior``). A
    chain that keeps breaking early never reaches the deep slots, so a fixed prior would keep
    them optimistic; chained, an unreached slot is expected to do as the last slot seen did."""
    out, a = [], prior
    for j in range(slots):
        hit, n = (acc[j], seen[j]) if j < len(acc) else (0.0, 0.0)
        pooled = pool[j] if j < len(pool) else None
        a = (hit + (a if pooled is None else pooled) * weight) / (n + weight)
        out.append(a)
    return out
