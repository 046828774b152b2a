"""The steps a request needs to finish its tokens, from its slots' acceptance estimates: the
arithmetic of the adaptive schedule's finish rule (schedule.py).

A step at block b commits X tokens, X = k with P(commit k) = Π_{i<k} α_i · (1 − α_k) (k < b,
all b drafts accepted: X = b); ``BlockLaw`` holds that law, E[X] and Var[X]; ``finish_steps`` the
expected steps for a row's last n tokens (exactly for the last ``TAIL`` · b); ``finish_spread``
adds their standard deviation (renewal CLT); ``order_z`` places a batch's rows at the expected
order statistics, since a batch waits for its slowest row; ``finish_rates`` scores each block
by the batch's projected time to finish.
"""

from __future__ import annotations

import functools
import math
import operator
import statistics
from typing import Callable, Mapping, Sequence

TAIL = 4            # finish rule: the last TAIL · block tokens of a row count steps exactly


def expected_of(alphas: Sequence[float], block: int) -> float:
    """E[committed tokens | block] from the slots' α: 1 + Σ_j Π_{i≤j} α_i (j < block)."""
    total, run = 1.0, 1.0
    for a in alphas[:block - 1]:
        run *= a
        total += run
    return total


class BlockLaw:
    """What one row's slot estimates imply at one block size: P(commit k) for k = 1 .. block,
    E[X] and Var[X] of the tokens X a step commits, and (built as far as asked) the exact
    expected steps S(m) to finish the last m ≤ ``TAIL`` · block tokens."""

    __slots__ = ("block", "commit", "mean", "var", "_tail")

    def __init__(self, alphas: Sequence[float], block: int) -> None:
        self.block, self.commit, self.mean, self.var = _moments(alphas, (block,))[0]
        self._tail: list[float] | None = None

    @classmethod
    def family(cls, alphas: Sequence[float], blocks: Sequence[int]) -> dict[int, "BlockLaw"]:
        """``BlockLaw(alphas, b)`` for every b in ``blocks`` from one pass over the slots (the
        schedule builds them for every row after every speculative step)."""
        out = {}
        for b, commit, mean, var in _moments(alphas, blocks):
            law = out[b] = cls.__new__(cls)
            law.block, law.commit, law.mean, law.var, law._tail = b, commit, mean, var, None
        return out

    def steps(self, n: int) -> float:
        """Expected steps for the last ``n`` tokens (``finish_steps``)."""
        if n > TAIL * self.block:
            return float(math.ceil(n / self.mean))
        if self._tail is None:
            self._tail = [0.0]
        commit, steps = self.commit, self._tail
        for m in range(len(steps), n + 1):           # extended as far as asked
            k = min(self.block, m - 1)         # S(m - k), k = 1 .. k: steps[m-1] .. steps[m-k]
            steps.append(1.0 + sum(map(operator.mul, commit[:k], reversed(steps[m - k:m]))))
        return steps[n]

    def spread(self, n: int) -> tuple[float, float]:
        """(mean, standard deviation) of the steps for the last ``n`` tokens (``finish_spread``)."""
        if self.block < 2:
            return float(n), 0.0
        return self.steps(n), math.sqrt(n * self.var / self.mean ** 3)


def _moments(alphas: Sequence[float], blocks: Sequence[int]
             ) -> list[tuple[int, list[float], float, float]]:
    """(block, P(commit k) for k = 1 .. block, E[X], Var[X]) per block, from one pass over the
    slots: a smaller block's law is a prefix of the largest one's with the rest of the mass on
    its last entry. E[X] is summed as ``expected_of`` sums it, Σ k·P(k) and Σ k²·P(k) in the
    order of k, so each block's law does not depend on the other blocks asked for."""
    commit, runs, means, s1, s2 = [], [1.0], [1.0], [0.0], [0.0]
    run, total, e1, e2 = 1.0, 1.0, 0.0, 0.0
    for k in range(1, max(blocks)):
        p = run * (1.0 - alphas[k - 1])
        commit.append(p)
        e1 += k * p
        e2 += k * k * p
        s1.append(e1)
        s2.append(e2)
        run *= alphas[k - 1]
        runs.append(run)
        total += run
        means.append(total)
    out = []
    for b in blocks:
        m1, m2 = s1[b - 1] + b * runs[b - 1], s2[b - 1] + b * b * runs[b - 1]
        out.append((b, commit[:b - 1] + [runs[b - 1]], means[b - 1], max(m2 - m1 * m1, 0.0)))
    return out


def finish_steps(alphas: Sequence[float], block: int, n: int) -> float:
    """Steps a row needs for its last ``n`` tokens if every step used ``block`` (slots' α:
    ``alphas``, at least ``block`` − 1 of them): ⌈n / E[block]⌉ while n is large; for the
    last ``TAIL`` · block tokens the expected count exactly,
    S(n) = 1 + Σ_k P(commit k)·S(n − k) (a step commits min(k, n); S(0) = 0, so only k < n
    add), so that a block that may finish the row in one step is not ranked like one that
    cannot."""
    return BlockLaw(alphas, block).steps(n)


def finish_spread(alphas: Sequence[float], block: int, n: int) -> tuple[float, float]:
    """(mean, standard deviation) of the steps a row needs for its last ``n`` tokens at
    ``block``: the mean ``finish_steps``; the spread by the renewal CLT, √(n·Var[X] / E[X]³)
    with X the tokens one step commits (0 for target-only steps, which commit exactly one)."""
    return BlockLaw(alphas, block).spread(n)


@functools.lru_cache(maxsize=64)
def order_z(rows: int) -> tuple[float, ...]:
    """The expected order statistics of ``rows`` standard normals, ascending (Blom's
    approximation; (0.0,) for one row): the batch waits for its slowest row, and a row's
    steps to finish are random, so the last row to finish needs more steps than the mean."""
    if rows < 2:
        return (0.0,) * rows
    nd = statistics.NormalDist()
    return tuple(nd.inv_cdf((i - 0.375) / (rows + 0.25)) for i in range(1, rows + 1))


def finish_rates(laws: Sequence[Mapping[int, BlockLaw]], left: Sequence[int],
                 candidates: Sequence[int], tail_cost: Callable[[int, int], float]
                 ) -> dict[int, float]:
    """The finish rule's score per candidate block b: the batch's remaining tokens Σ left over
    the projected seconds to finish them if every step kept b. Row r (its ``BlockLaw`` per
    block, ``left[r]`` tokens to go) needs mean + sd · z steps, z its place among the batch's
    expected order statistics (``order_z``); sorted, the batch pays ``tail_cost(b, live)`` for
    each step while ``live`` rows still need one."""
    total = float(sum(left))
    z = order_z(len(left))
    out = {}
    for b in candidates:
        mean_sd = sorted(law[b].spread(n) for law, n in zip(laws, left))
        need = sorted(m + sd * zi for (m, sd), zi in zip(mean_sd, z))
        seconds, done = 0.0, 0.0
        for i, n in enumerate(need):
            if n > done:
                seconds += (n - done) * tail_cost(b, len(need) - i)
                done = n
        out[b] = total / max(seconds, 1e-12)
    return out
