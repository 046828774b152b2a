"""The call plan of adaptive speculation: whether a whole call speculates at all.

``CallPlan`` is an object the adaptive policy holds (adaptive.py) over the policy's table
(``calls``: target-only calls since the last speculative one per (mode, law, bucket);
``realized``: what planned calls realized against their projection). Its interface is
explicit: ``plan`` gets the call's key and a projection function (the schedule's ``project``,
over the table and pool the call decides with), ``fold`` gets the call's realized rate, and
``replica`` gives a plan that repeats the last call's decision.
"""

from __future__ import annotations

from typing import Callable, Hashable, Sequence

from .table import FIRST_CALL_GAP, MAX_CALL_GAP, MeasuredTable

# ``plan``: a call speculates only if its first step projects this × the target-only rate, both
# projections scaled by what planned calls realized (``fold``). First set for the costs a
# speculative call pays besides its steps (a call projected slightly faster than target-only
# can run slower), which the realized scaling now measures; kept because timed rounds on a
# shared machine spread by more than 5 % (docs/benchmarks/adaptive.md).
PLAN_MARGIN = 1.05

# (rows, remaining) → (best speculative block, its tokens/s, the target-only tokens/s) or None
Project = Callable[[int, Sequence[int]], "tuple[int, float, float] | None"]


class CallPlan:
    """Whole calls target-only where speculation does not pay (``plan``). ``enabled`` False:
    every call speculates (the "call_plan" ablation); ``replay``: a replica's fixed answer."""

    def __init__(self, table: MeasuredTable, *, enabled: bool = True,
                 replay: str | None = None) -> None:
        self.table, self.enabled, self.replay = table, enabled, replay
        self.last = ""                       # what ``plan`` said for the current (last) call
        self._planned: tuple | None = None   # (key, rows, budgets, speculated): for ``fold``

    def plan(self, key: tuple[str, Hashable, int], rows: int, remaining: Sequence[int],
             project: Project, learning: bool) -> str:
        """Before a call's prefill: "" to decode it speculatively (choosing each step), or why
        it runs as a plain target-only call. ``key``: the call's (mode, law, bucket);
        ``learning``: the policy learns between calls (a measured table, ``track`` > 0).
        Speculation has fixed costs a call pays even if every step it takes is target-only:
        the prefill builds the draft's context of every prompt, target-only steps keep that
        context, and each probe re-scores every row. So a learning policy whose projection
        (``project``: the first step's finish scores of fresh requests from the pooled
        acceptance and the cost table, each kind's rate scaled by what earlier planned calls of
        this key realized against their projection, whole calls timed: ``fold``) does not give
        speculation ``PLAN_MARGIN`` × the target-only rate runs the call target-only; every
        (gap+1)-th such call speculates anyway, so the pool keeps learning (the gap starts at
        ``FIRST_CALL_GAP`` and doubles up to ``MAX_CALL_GAP`` while speculation keeps losing;
        it resets once it wins). Like vLLM's speculative_disable_by_batch_size, a decision
        about whole calls, made from earlier calls only: every step stays lossless. Fixed
        tables and ``track=0`` never plan (their calls must repeat exactly)."""
        self._planned = None
        if self.replay is not None:          # a replica: the plan of the call it copies
            return self.replay
        self.last = self._plan(key, rows, remaining, project, learning)
        return self.last

    def _plan(self, key: tuple[str, Hashable, int], rows: int, remaining: Sequence[int],
              project: Project, learning: bool) -> str:
        if not (learning and self.enabled) or rows < 1:
            return ""
        self._planned = (key, rows, list(remaining), True)    # ``fold`` compares what it made
        projected = project(rows, remaining)
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
        mode, _, k = key
        return (f"target-only call: at bucket {k} ({mode}) the pooled acceptance and measured "
                f"costs project {target_only:.4g} tokens/s target-only against {rate:.4g} "
                f"at block {spec}, calls realizing x{real_only:.3g} and x{real_spec:.3g} of "
                f"their projections; a speculative call after {gap - skipped - 1} more")

    def fold(self, tokens: float, seconds: float, project: Project, track: float) -> None:
        """The planned call's realized rate (``tokens`` / ``seconds``) over the rate
        ``project`` gives its kind now that every cost it needed is timed, into
        ``table.realized`` (``track`` of the way)."""
        planned, self._planned = self._planned, None
        if planned is None or seconds <= 0:
            return
        key, rows, remaining, speculated = planned
        projected = project(rows, remaining)
        if projected is not None:
            kind = "spec" if speculated else "target-only"
            self.table.fold_realized((*key, kind), tokens / seconds
                                     / projected[1 if speculated else 2], track)

    def forget(self) -> None:
        """Drop the current call's record (a call that learns nothing)."""
        self._planned = None

    def replica(self, table: MeasuredTable) -> "CallPlan":
        """A plan that answers every call as the current (last) call was planned."""
        return CallPlan(table, enabled=self.enabled, replay=self.last)
