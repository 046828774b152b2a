"""``AdaptivePolicy``: adaptive speculation behind the engine's policy interface. It holds the
per-step rule (``schedule``: an ``AdaptiveSchedule``, schedule.py), the call plan
(``call_plan``: a ``CallPlan``, call_plan.py) and the measured table they share, which its
owner passes in (``table``: the Engine's, or one the api keeps per model pair and device);
it calibrates a new batch bucket through the Live batch's probe (the Runner's discarded steps)
and distorts what it learns from under ``DFLASH2RT_PERTURB_COSTS`` (``CostNoise``). ``agree``
passes every decision (the plan, what to calibrate, each block) through a function: a
tensor-parallel run makes them rank 0's (distributed/consensus.py). ``without`` switches
mechanisms off for an ablation (docs/adaptive.md).
"""

from __future__ import annotations

from typing import Any, Callable, Hashable, Iterable, Mapping, Sequence

from . import Call, Live, Policy
from .call_plan import CallPlan
from .schedule import AdaptiveSchedule, default_candidates
from .table import CostNoise, MeasuredTable, bucket_of, cost_noise


def law_of(requests: Sequence) -> Hashable:
    """What a batch's acceptance depends on besides the pair: its requests' shared
    (temperature, top_p, top_k), with their candidate count where they set one
    (``SamplingParams.num_candidates``) and "block" where they verify as a block, else "mixed"
    (the acceptance pool's key)."""
    laws = {(q.params.temperature, q.params.top_p, q.params.top_k)
            + (() if q.params.num_candidates is None else (q.params.num_candidates,))
            + (("block",) if q.params.verification == "block" and q.params.temperature > 0
               else ())
            for q in requests}
    return laws.pop() if len(laws) == 1 else "mixed"


def mode_of(requests: Sequence) -> str:
    """"sampled" if any request samples, else "greedy" (as SamplingBatch.any_sampled); where
    requests set candidate counts, the counts too ("sampled, candidates 32 trained"), since
    the select width they make costs a step more or less, and block verification, whose
    verify runs the torch ops (the measured table's key)."""
    mode = "sampled" if any(q.params.temperature > 0 for q in requests) else "greedy"
    if any(q.params.verification == "block" for q in requests):
        mode += ", block verification"                 # the torch-ops verify: its own cost
    asked = {q.params.num_candidates for q in requests}
    if asked == {None}:
        return mode
    named = [str(k) for k in sorted(asked - {None})] + (["trained"] if None in asked else [])
    return f"{mode}, candidates {' '.join(named)}"


class AdaptivePolicy(Policy):
    """Each step's block from acceptance and cost (module docstring). ``candidates``,
    ``costs`` (a fixed table; None: measured), ``table``, ``without`` and ``options`` (prior,
    prior_weight, decay, probe, max_probe, reps, track) make its ``AdaptiveSchedule``."""

    def __init__(self, candidates: Sequence[int], costs: Mapping | None = None, *,
                 table: MeasuredTable | None = None, without: Iterable[str] = frozenset(),
                 agree: Callable[[Any], Any] | None = None, **options: Any) -> None:
        schedule = AdaptiveSchedule(candidates, costs, table=table, without=without, **options)
        self._attach(schedule, CallPlan(schedule.table, enabled="call_plan" not in without),
                     agree)

    @classmethod
    def of(cls, schedule: AdaptiveSchedule, call_plan: CallPlan | None = None,
           agree: Callable[[Any], Any] | None = None) -> "AdaptivePolicy":
        """A policy over a schedule made by hand (and a call plan over its table)."""
        out = cls.__new__(cls)
        out._attach(schedule, call_plan or CallPlan(
            schedule.table, enabled="call_plan" not in schedule.without), agree)
        return out

    @classmethod
    def measured(cls, draft_block: int, table: MeasuredTable, **kw: Any) -> "AdaptivePolicy":
        """The engine's default: the draft's default candidates over a measured ``table``."""
        return cls(default_candidates(draft_block), table=table, **kw)

    def _attach(self, schedule: AdaptiveSchedule, call_plan: CallPlan,
                agree: Callable[[Any], Any] | None) -> None:
        self.schedule, self.call_plan = schedule, call_plan
        self.agree: Callable[[Any], Any] = agree or (lambda value: value)
        self.noise: CostNoise | None = None
        self.target_only_call = False

    @property
    def table(self) -> MeasuredTable:
        return self.schedule.table

    @property
    def without(self) -> frozenset:
        return self.schedule.without

    # ---- the policy interface ----------------------------------------------------------------
    def begin(self, requests: Sequence) -> Call:
        """A call of ``requests``: ``start`` with their mode, law and budgets, and the timings
        distorted under ``DFLASH2RT_PERTURB_COSTS`` for a measured table."""
        return self.start(mode_of(requests), law_of(requests), len(requests),
                          [q.params.max_new_tokens for q in requests], self._call_noise())

    def _call_noise(self) -> CostNoise | None:
        """What distorts a call's timings: ``DFLASH2RT_PERTURB_COSTS``'s, over a measured
        table only."""
        return None if self.schedule.fixed else cost_noise()

    def start(self, mode: str, law: Hashable, rows: int, remaining: Sequence[int],
              noise: CostNoise | None = None) -> Call:
        """``begin`` by hand: a call of ``rows`` requests in ``mode`` under ``law`` with these
        token budgets: the schedule's state for the call, then its plan. ``noise``: what
        distorts the timings the call learns from (None: nothing)."""
        s = self.schedule
        s.begin(mode, law)
        plan = self.agree(self.call_plan.plan((mode, law, bucket_of(rows)), rows, remaining,
                                              s.project, s.track != 0.0 and not s.fixed))
        self.noise = noise
        self.target_only_call = bool(plan)
        return Call(not plan, 1 if plan else max(s.candidates), True, plan,
                    "" if self.noise is None else self.noise.describe())

    def choose(self, live: Live) -> int:
        """Calibrate the buckets the table lacks (``calibrate``), then the schedule's choice
        from the past only (a call planned target-only: 1)."""
        if self.target_only_call:
            return 1
        self.calibrate(live)
        return self.agree(self.schedule.choose(live.rows, live.remaining))

    def observe(self, rows: Sequence[int], block: int, accepted: Sequence[int],
                seconds: float | None = None) -> None:
        if self.target_only_call:
            return
        s = self.schedule
        if seconds is not None and self.noise is not None:
            seconds = self.noise.step(seconds, block, bucket_of(len(rows)), s.mode)
        s.observe(rows, block, accepted, seconds)

    def end(self, tokens: int | None = None, seconds: float | None = None) -> None:
        """Fold the call into the table (``AdaptiveSchedule.end``) and the call plan's
        overheads: ``tokens`` in wall ``seconds`` (prefill and host work included,
        calibration excluded; None: what the observed decode steps made)."""
        if seconds is not None and self.noise is not None:
            seconds = self.noise.call(seconds)
        s = self.schedule
        made = s.end()
        if s.track == 0.0:
            self.call_plan.forget()
            return
        self.call_plan.fold(made[0] if tokens is None else tokens,
                            made[1] if seconds is None else seconds, s.project, s.track)

    @property
    def costs(self) -> dict[tuple[int, int], float]:
        return self.schedule.costs

    # ---- calibration -------------------------------------------------------------------------
    def calibrate(self, live: Live) -> None:
        """Time the candidates the table lacks at this batch's bucket and at every smaller
        bucket (the batch's first rows: a prefix of its slots, so nothing moves), so that a
        choice never depends on which buckets earlier runs happened to time: discarded steps
        (``live.probe``), in rounds over the candidates (a machine's drift hits all alike),
        each timed to its sync after an untimed step of the same block: a step right after
        another block size runs on what that one left in the caches, and the schedule decides
        between runs of steps, not single ones (what a single switch costs, the calls'
        observed steps teach the table)."""
        s, k = self.schedule, bucket_of(len(live.rows))
        while k >= 1:
            if self.agree(s.calibrate(k)):
                time_step = live.probe(k)
                while todo := self.agree(s.calibrate(k)):
                    for b in todo:
                        time_step(b)                                  # warm, untimed
                        seconds = time_step(b)
                        s.measure(b, k, seconds if self.noise is None
                                  else self.noise.step(seconds, b, k, s.mode))
            k //= 2

    def calibrate_ahead(self, requests: Sequence, live: Live) -> None:
        """``calibrate`` before any call, over ``live`` (a batch of ``requests`` made for it):
        the schedule set to their mode and law as ``begin`` sets it, and the timings distorted
        as a call's are, without planning a call (a server times its table at start-up)."""
        self.schedule.begin(mode_of(requests), law_of(requests))
        self.noise = self._call_noise()
        self.calibrate(live)

    def replica(self) -> "AdaptivePolicy":
        """A policy that decides as this one's current (or last) call did and learns nothing
        (``AdaptiveSchedule.replica``), every call planned as that call was: another engine
        given it chooses the same blocks from the same outcomes (graphs vs eager)."""
        schedule = self.schedule.replica()
        return AdaptivePolicy.of(schedule, self.call_plan.replica(schedule.table))
