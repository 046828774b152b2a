"""What the ranks of a tensor-parallel run agree on besides the tensors.

Every rank runs the whole engine (replicated draft, selector, verify, sampling) on identical
tensors with the same counter-based noise, so their tokens agree without any broadcast of
decisions. The one input that is not identical is time: the adaptive schedule chooses from
measured step costs, which differ per rank. Every rank's adaptive policy takes ``RankZero`` as
its ``agree``: each of its decisions (the call plan, calibration rounds, block size per step) is
broadcast from rank 0 over the host group. Ranks other than 0 still keep their own table (they
observe and measure); it never decides.

``StepCheck`` (debug mode, ``tp_check``): after prefill and after every decode step, each rank
hashes what the step committed (accepted counts, flags, tokens, packed logprobs) and the ranks
compare the hashes with one all-reduce; any disagreement raises on every rank.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch
import torch.distributed as dist

from ..errors import DistributedError
from .group import TPGroup


def broadcast_from_main(value: Any, tp: TPGroup) -> Any:
    """Rank 0's ``value`` on every rank (a pickled object over the host group)."""
    box = [value]
    dist.broadcast_object_list(box, src=0, group=tp.host_group)
    return box[0]


class RankZero:
    """An adaptive policy's ``agree``: every decision is rank 0's (module docstring)."""

    def __init__(self, tp: TPGroup) -> None:
        self.tp = tp

    def __call__(self, value: Any) -> Any:
        return broadcast_from_main(value, self.tp)


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
