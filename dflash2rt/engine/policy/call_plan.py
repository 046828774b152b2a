"""The call plan of adaptive speculation: whether a whole call speculates at all.

``CallPlan`` is an object the adaptive policy holds (adaptive.py) over the policy's table
(``calls``: target-only calls since the last speculative one per (mode, law, bucket);
``overhead``: the seconds planned calls took beyond their projected steps). Its interface is
explicit: ``plan`` gets the call's key and a projection function (the schedule's ``project``,
over the table and pool the call decides with), ``fold`` gets the call's tokens and seconds, and
``replica`` gives a plan that repeats the last call's decision.
"""

from __future__ import annotations

from typing import Callable, Hashable, Sequence

from .table import FIRST_CALL_GAP, MAX_CALL_GAP, MeasuredTable

# ``plan``: a call speculates only if its projected rate over the whole call is this × the
# target-only call's. First set for the costs a speculative call pays besides its steps (a call
# projected slightly faster than target-only can run slower), which the overheads now measure;
# kept because timed rounds on a shared machine spread by more than 5 %
# (docs/benchmarks/adaptive.md).
PLAN_MARGIN = 1.05
# A call's projected seconds are at least this share of its steps' (an overhead folded from
# calls that beat their projection can be negative).
MIN_SHARE = 0.1

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
        context, and each probe re-scores every row. So a learning policy projects each kind's
        whole call: its tokens (the budgets) at the first step's projected rate (``project``:
        the finish scores of fresh requests from the pooled acceptance and the cost table), plus
        the seconds earlier planned calls of this key and kind took beyond their projected
        steps (``fold``; a kind with no record yet takes the other kind's: both prefill the
        same prompts). Where speculation's call does not project ``PLAN_MARGIN`` × the
        target-only call's rate, the call runs target-only; every (gap+1)-th such call
        speculates anyway, so the pool keeps learning (the gap starts at ``FIRST_CALL_GAP``
        and doubles up to ``MAX_CALL_GAP`` while speculation keeps losing; it resets once it
        wins). The overheads are added seconds, not rates scaled: the prefill costs both kinds
        alike and is a larger share of the faster kind's call, so scaling each kind's rate by
        what its calls realized counted the prefill against speculation. Like vLLM's
        speculative_disable_by_batch_size, a decision about whole calls, made from earlier
        calls only: every step stays lossless. Fixed tables and ``track=0`` never plan (their
        calls must repeat exactly)."""
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
        tokens = float(sum(max(int(n), 1) for n in remaining))
        mine = self.table.overhead.get((*key, "spec"))
        theirs = self.table.overhead.get((*key, "target-only"))
        over_spec = mine if mine is not None else theirs or 0.0
        over_only = theirs if theirs is not None else mine or 0.0
        call_spec = _call_rate(tokens, rate, over_spec)
        call_only = _call_rate(tokens, target_only, over_only)
        if call_spec > PLAN_MARGIN * call_only:
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
                f"costs project {call_only:.4g} tokens/s target-only against {call_spec:.4g} "
                f"at block {spec} over the call (steps at {target_only:.4g} and {rate:.4g} "
                f"tokens/s, plus {over_only:.3g} s and {over_spec:.3g} s as earlier calls took); "
                f"a speculative call after {gap - skipped - 1} more")

    def fold(self, tokens: float, seconds: float, project: Project, track: float) -> None:
        """The planned call's ``seconds`` beyond its ``tokens`` at the rate ``project`` gives
        its kind now that every cost it needed is timed, into ``table.overhead`` (``track``
        of the way)."""
        planned, self._planned = self._planned, None
        if planned is None or seconds <= 0:
            return
        key, rows, remaining, speculated = planned
        projected = project(rows, remaining)
        if projected is not None:
            kind = "spec" if speculated else "target-only"
            rate = projected[1 if speculated else 2]
            self.table.fold_overhead((*key, kind), seconds - tokens / max(rate, 1e-12), track)

    def forget(self) -> None:
        """Drop the current call's record (a call that learns nothing)."""
        self._planned = None

    def replica(self, table: MeasuredTable) -> "CallPlan":
        """A plan that answers every call as the current (last) call was planned."""
        return CallPlan(table, enabled=self.enabled, replay=self.last)


def _call_rate(tokens: float, rate: float, overhead: float) -> float:
    """Tokens per second of a call of ``tokens`` at ``rate`` a step plus ``overhead`` seconds
    (at least ``MIN_SHARE`` of the steps' seconds)."""
    steps = tokens / max(rate, 1e-12)
    return tokens / max(steps + overhead, MIN_SHARE * steps)
