"""The adaptive schedule's call plan (schedule.py): whether a whole call speculates at all.

``CallPlan`` is a part of ``AdaptiveSchedule``: it reads the schedule's call state (``mode``,
``law``, ``track``, ``fixed``, ``table``, ``candidates``, the pool, ``cost`` and
``finish_scores``) and keeps ``last_plan``, ``_replay_plan`` (a replica's) and ``_planned``
(what ``end`` compares the call's realized rate with, ``_fold_plan``).
"""

from __future__ import annotations

from typing import Sequence

from .cost_table import FIRST_CALL_GAP, MAX_CALL_GAP, bucket_of


# ``plan``: a call speculates only if its first step projects this × the target-only rate, both
# projections scaled by what planned calls realized (``_fold_plan``). First set for the costs a
# speculative call pays besides its steps (a call projected slightly faster than target-only
# can run slower), which the realized scaling now measures; kept because timed rounds on a
# shared machine spread by more than 5 % (docs/benchmarks/adaptive.md).
PLAN_MARGIN = 1.05


class CallPlan:
    """``plan`` / ``project`` of an ``AdaptiveSchedule`` (module docstring)."""

    def plan(self, rows: int, remaining: Sequence[int]) -> str:
        """After ``begin``, before the call's prefill: "" to decode it speculatively (choosing
        each step), or why it runs as a plain target-only call. Speculation has fixed costs a
        call pays even if every step it takes is target-only: the prefill builds the draft's
        context of every prompt, target-only steps keep that context, and each probe re-scores
        every row. So a learning schedule (``track`` > 0) whose pooled acceptance for this
        (mode, law) and cost table at this bucket say that speculation does not pay at the
        call's first step (``project``: ``finish_scores`` of fresh requests, each mode's rate
        scaled by what earlier planned calls of this (mode, law, bucket) in that mode realized
        against their projection, whole calls timed (``end``): the fixed costs above, and a
        target-only step calibrated between other blocks' steps that runs faster in a run of
        them; speculation must still project ``PLAN_MARGIN`` × the target-only rate: the rounds
        of a noisy machine spread by more than that) runs the call target-only; every (gap+1)-th
        such call speculates anyway, so the pool keeps learning (the gap starts at
        ``FIRST_CALL_GAP`` and doubles up to ``MAX_CALL_GAP`` while speculation keeps losing; it
        resets once it wins: a probe right after the call that taught the plan to stop would
        re-measure what that call just measured). Like vLLM's speculative_disable_by_batch_size,
        a decision about whole calls, made from earlier calls only: every step stays lossless.
        Fixed tables and ``track=0`` never plan (their calls must repeat exactly)."""
        if self._replay_plan is not None:    # a replica: the plan of the call it copies
            return self._replay_plan
        self.last_plan = self._plan(rows, remaining)
        return self.last_plan

    def _plan(self, rows: int, remaining: Sequence[int]) -> str:
        if self.track == 0.0 or self.fixed or rows < 1:
            return ""
        mode, k = self.mode, bucket_of(rows)
        key = (mode, self.law, k)
        self._planned = (key, rows, list(remaining), True)    # ``end`` compares what it made
        projected = self.project(rows, remaining)
        if projected is None:
            return ""                        # nothing pooled or timed yet: speculate, learn
        spec, rate, target_only = projected
        real_spec = self.table.realized.get((*key, "spec"), 1.0)
        real_only = self.table.realized.get((*key, "target-only"), 1.0)
        if real_spec * rate > PLAN_MARGIN * real_only * target_only:
            self.table.calls.pop(key, None)
            return ""
        skipped, gap = self.table.calls.get(key, (0, FIRST_CALL_GAP))
        if skipped >= gap:                   # a speculative call keeps the pool current
            self.table.calls[key] = (0, min(2 * gap, MAX_CALL_GAP))
            return ""
        self.table.calls[key] = (skipped + 1, gap)
        self._planned = (key, rows, list(remaining), False)
        return (f"target-only call: at bucket {k} ({mode}) the pooled acceptance and measured "
                f"costs project {target_only:.4g} tokens/s target-only against {rate:.4g} "
                f"at block {spec}, calls realizing x{real_only:.3g} and x{real_spec:.3g} of "
                f"their projections; a speculative call after {gap - skipped - 1} more")

    def project(self, rows: int, remaining: Sequence[int]) -> tuple[int, float, float] | None:
        """A call's first-step projection for ``rows`` fresh requests with these budgets, from
        the pool and table it decides with: (best speculative block, its tokens/s, the
        target-only tokens/s) by ``finish_scores``; None before anything is pooled for the
        call's (mode, law) or while a candidate is untimed at its bucket."""
        k = bucket_of(rows)
        if not self._pool or self._pool[0] is None or self.candidates[-1] < 2 \
                or any(self.cost(b, k) is None for b in self.candidates):
            return None
        scores = self.finish_scores([object() for _ in range(rows)], remaining)
        spec = max((b for b in self.candidates if b > 1), key=lambda b: (scores[b], -b))
        return spec, scores[spec], scores[1]

    def _fold_plan(self, planned: tuple | None, tokens: float, seconds: float) -> None:
        """A planned call's realized rate (``tokens`` / ``seconds``) over the rate ``project``
        gives its kind now that every cost it needed is timed, into ``table.realized``."""
        if planned is None or seconds <= 0:
            return
        key, rows, remaining, speculated = planned
        projected = self.project(rows, remaining)
        if projected is not None:
            kind = "spec" if speculated else "target-only"
            self.table.fold_realized((*key, kind), tokens / seconds
                                     / projected[1 if speculated else 2], self.track)
