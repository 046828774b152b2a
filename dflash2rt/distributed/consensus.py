"""What the ranks of a tensor-parallel run agree on besides the tensors.

Every rank runs the whole engine (replicated draft, selector, verify, sampling) on identical
tensors with the same counter-based noise, so their tokens agree without any broadcast of
decisions. The one input that is not identical is time: the adaptive schedule chooses from
measured step costs, which differ per rank. ``RankZeroSchedule`` makes every rank follow
rank 0's choices (block size per step, calibration rounds, the call plan): each is broadcast
from rank 0 over the host group, once per decision. Ranks other than 0 still keep their own
table (they observe and measure); it never decides.

``StepCheck`` (debug mode, ``tp_check``): after prefill and after every decode step, each rank
hashes what the step committed (accepted counts, flags, tokens, packed logprobs) and the ranks
compare the hashes with one all-reduce; any disagreement raises on every rank.
"""

from __future__ import annotations

import hashlib
from typing import Any, Hashable, Sequence

import torch
import torch.distributed as dist

from ..errors import DistributedError
from .group import TPGroup


def broadcast_from_main(value: Any, tp: TPGroup) -> Any:
    """Rank 0's ``value`` on every rank (a pickled object over the host group)."""
    box = [value]
    dist.broadcast_object_list(box, src=0, group=tp.host_group)
    return box[0]


class RankZeroSchedule:
    """An AdaptiveSchedule whose decisions are rank 0's on every rank (module docstring);
    everything else is the wrapped schedule's."""

    def __init__(self, inner, tp: TPGroup) -> None:
        self.inner, self.tp = inner, tp

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def plan(self, *args, **kw) -> str:
        return broadcast_from_main(self.inner.plan(*args, **kw), self.tp)

    def calibrate(self, bucket: int) -> list[int]:
        return broadcast_from_main(self.inner.calibrate(bucket), self.tp)

    def choose(self, rows: Sequence[Hashable], remaining: Sequence[int] | None = None) -> int:
        return broadcast_from_main(self.inner.choose(rows, remaining), self.tp)


def digest(host: list) -> int:
    """A 62-bit hash of a step's host rows (stable across processes, unlike ``hash``)."""
    return int.from_bytes(hashlib.blake2b(repr(host).encode(), digest_size=8).digest(),
                          "little") >> 2


class StepCheck:
    """``Engine.step_check`` of a tensor-parallel run in debug mode (module docstring)."""

    def __init__(self, tp: TPGroup) -> None:
        self.tp, self.steps = tp, 0

    def __call__(self, host: list) -> None:
        h = digest(host)
        both = torch.tensor([h, -h], dtype=torch.int64)
        dist.all_reduce(both, op=dist.ReduceOp.MAX, group=self.tp.host_group)  # [max, -min]
        if int(both[0]) != -int(both[1]):
            raise DistributedError(
                f"ranks disagree on the tokens committed at step {self.steps} (rank "
                f"{self.tp.rank}'s hash {h:#x}, the ranks' range {-int(both[1]):#x}.."
                f"{int(both[0]):#x}): the ranks' tensors or decisions differ")
        self.steps += 1
