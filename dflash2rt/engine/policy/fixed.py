"""``FixedPolicy``: every step of a call takes one block size (``block_size=N``), or every step
is target-only (``spec=False``); nothing is measured or learned, so runs repeat exactly."""

from __future__ import annotations

from typing import Sequence

from . import Call, Live, Policy


class FixedPolicy(Policy):
    """Block ``block`` for every step of a speculative call (``spec``), else block 1 (the
    caches still keep room for ``block``, as the call was asked)."""

    def __init__(self, block: int, spec: bool = True) -> None:
        self.block, self.spec = block, spec

    def begin(self, requests: Sequence) -> Call:
        return Call(self.spec, self.block)

    def choose(self, live: Live) -> int:
        return self.block if self.spec else 1
