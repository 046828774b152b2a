"""The block of each server step: one fixed block (>= 2; 1 for target-only decoding), or
adaptive: the engine's ``AdaptivePolicy`` (engine/policy/) over "epochs", each from the step
that finds the batch non-empty to the step that leaves it empty (a policy call of
``Engine.generate`` is one batch to completion; in a server the batch of one epoch changes as
requests join and leave, and each joining row's acceptance is learnt as it steps).
Calibration steps run through the Runner on a copy of the batch under other RNG keys, as the
engine's do. A fixed block keeps a seeded request's tokens independent of its batch; adaptive
keeps greedy requests' tokens so (speculation is lossless), not seeded sampled ones (they
follow the blocks chosen, which depend on the batch).

A server's adaptive policy decides by the rate rule: the tokens a step is expected to make
over its cost. The engine's default, the finish rule, projects the time until the batch's
slowest row is done, which is what a static batch costs; a server refills each row as it
finishes, so the time to empty the current batch is not what its clients wait on, and the
finish rule's price on a straggler row held speculation back where it paid. Nor does it plan
whole epochs target-only, as the engine's call plan plans whole calls: a call plan weighs
speculation's fixed costs (the draft context a prefill builds) by what earlier calls took
beyond their steps, whole calls timed; a server's joins build that context whatever the epoch
does, and an epoch's wall time holds what arrivals leave idle and the joins' prefills, so it
is not a call's, and planned epochs went target-only where block 8 paid. The
table is calibrated before the first request (``calibrate_ahead``) at every batch bucket the
slots allow, greedy and sampled, so no request's steps wait on calibration. ``before_join``
settles the draft context the Runner defers over target-only steps before rows join
(``Runner.settle``)."""

from __future__ import annotations

import dataclasses
import time
from typing import Sequence

from ..engine.engine import CALIBRATION_KEY, Engine
from ..engine.policy import Live
from ..engine.policy.adaptive import AdaptivePolicy
from ..engine.runner import Step
from ..engine.state import BatchState
from ..engine.stats import RunStats

EPOCH_ROWS = 1024         # rows an adaptive epoch takes before it ends at the next join
RULE = frozenset({"finish_rule", "call_plan"})   # the rate rule, step by step (docstring)


class Blocks:
    """``block``: a fixed block, or None for adaptive (``engine.policy``, made over the
    engine's measured table if the engine has none, as ``Engine.generate`` makes it)."""

    def __init__(self, engine: Engine, block: int | None, stats: RunStats) -> None:
        self.engine, self.fixed, self.stats = engine, block, stats
        self.policy: AdaptivePolicy | None = None
        if block is None:
            if engine.policy is None:
                engine.policy = AdaptivePolicy.measured(engine.pair.draft.cfg.block_size,
                                                        engine.table, without=RULE)
            self.policy = engine.policy
            self.candidates: tuple[int, ...] = tuple(self.policy.schedule.candidates)
        else:
            self.candidates = (block,)
        self.room = max(self.candidates)
        self.spec = self.room > 1
        self._epoch: tuple[float, float, int] | None = None   # start, calibration_s, generated
        self._joined = 0                                       # rows the epoch has taken
        self.epochs = 0                                        # adaptive epochs begun

    @property
    def adaptive(self) -> bool:
        return self.policy is not None

    def choose(self, st: BatchState, requests: Sequence, remaining: Sequence[int]) -> int:
        """The next step's block for batch ``st`` of ``requests`` (in row order), with each
        row's token budget left; an adaptive epoch begins here when none is open."""
        if self.policy is None:
            return self.fixed
        if self._epoch is None:
            self.policy.begin(requests)
            self._epoch = (time.perf_counter(), self.stats.calibration_s, self.stats.generated)
            self._joined = len(requests)
            self.epochs += 1
        return self.policy.choose(Live(list(st.rows), list(remaining),
                                       lambda k: self._probe(st, k)))

    def calibrate_ahead(self, st: BatchState, requests: Sequence) -> None:
        """Time every candidate at each bucket up to ``st``'s rows, in the mode of
        ``requests`` (placeholders the scheduler prefilled into ``st``, discarded after), as
        the first step of a batch of that size would (``AdaptivePolicy.calibrate``)."""
        if self.policy is not None:
            self.policy.calibrate_ahead(requests, Live(list(st.rows), [1] * st.size,
                                                       lambda k: self._probe(st, k)))

    def observe(self, step: Step, seconds: float) -> None:
        if self.policy is not None:
            self.policy.observe(step.rows, step.block, step.accepted,
                                seconds + step.catch_up_s)

    def before_join(self, st: BatchState | None, joining: int) -> None:
        """``joining`` rows are about to join ``st`` (None: an empty batch). An adaptive run's
        target-only steps defer the draft's context K/V of the positions they commit, which
        the Runner projects for every row at its next speculative step, over as many
        positions as there were such steps; a joining row has none deferred (its prefill
        wrote them), so the deferred context is projected now, and the count starts again
        from the join. An epoch that has taken ``EPOCH_ROWS`` rows ends here (the next step
        begins another): the policy keeps estimates per row of a call, and a batch that
        never empties would otherwise keep them for every request it ever served."""
        runner = self.engine.runner
        if self.policy is None:
            return
        self._joined += joining
        if self._joined > EPOCH_ROWS:
            self.idle()
        pending, seconds = runner.settle(st)
        self.stats.time["catch_up"] += seconds
        self.stats.draft_deferred += pending

    def idle(self) -> None:
        """The batch is empty (or the epoch full): an adaptive epoch ends (its tokens and
        seconds into the table's call plan)."""
        if self.policy is not None and self._epoch is not None:
            t0, calib0, made0 = self._epoch
            self._epoch = None
            self.policy.end(self.stats.generated - made0, time.perf_counter() - t0
                            - (self.stats.calibration_s - calib0))

    def _probe(self, st: BatchState, k: int):
        """Timing of discarded steps on the batch's first ``k`` rows (``Live.probe``)."""
        rows = st if k >= st.size else st.keep(list(range(k)))
        probe = dataclasses.replace(rows, key=rows.key ^ CALIBRATION_KEY)

        def time_step(block: int) -> float:
            seconds = self.engine.runner.trial(probe, block)
            self.stats.calibration_steps += 1
            self.stats.calibration_s += seconds
            return seconds
        return time_step
