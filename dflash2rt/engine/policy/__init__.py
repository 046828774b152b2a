"""Block-size policies: what the engine's one decode loop asks before, during and after a call.

A ``Policy`` is ``begin`` (a call's requests → its ``Call``: speculative or not, the largest
block a step may take, an adaptive call's plan), ``choose`` (the next step's block from the
``Live`` batch), ``observe`` (a finished step's accepted drafts and seconds) and ``end`` (the
call's tokens and wall seconds). ``FixedPolicy`` (fixed.py) always answers one block;
``AdaptivePolicy`` (adaptive.py) composes the per-step rule (schedule.py), the call plan
(call_plan.py), calibration through the Runner, and the measured table (table.py) its owner
passes in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence


@dataclass(frozen=True)
class Call:
    """What a policy's ``begin`` decided for a call."""

    spec: bool                 # speculative steps (False: every step target-only)
    room: int                  # the largest block a step may take (the caches keep room)
    adaptive: bool = False     # blocks chosen per step (or a whole call planned target-only)
    plan: str = ""             # why an adaptive call runs target-only ("": it speculates)
    cost_noise: str = ""       # the distortion of the timings it learns from ("": none)


@dataclass(frozen=True)
class Live:
    """The live batch as a policy sees it before a step."""

    rows: list[int]            # the live requests' indices
    remaining: list[int]       # each one's token budget left (host-known)
    # bucket k → a function timing one discarded step of block b on the batch's first k rows
    # (nothing of the batch changes; RNG keys apart): calibration, through the Runner
    probe: Callable[[int], Callable[[int], float]]


class Policy:
    """The interface the engine's loop uses (module docstring); the base does nothing."""

    def begin(self, requests: Sequence) -> Call:
        raise NotImplementedError

    def choose(self, live: Live) -> int:
        raise NotImplementedError

    def observe(self, rows: Sequence[int], block: int, accepted: Sequence[int],
                seconds: float) -> None:
        """A finished step: ``accepted[i]`` drafts of ``rows[i]``, its ``seconds``."""

    def end(self, tokens: int | None = None, seconds: float | None = None) -> None:
        """The call is done: its returned ``tokens`` and wall ``seconds`` (calibration out)."""

    @property
    def costs(self) -> dict[tuple[int, int], float]:
        """The cost table the current (last) call decided with: (block, bucket) → seconds."""
        return {}
