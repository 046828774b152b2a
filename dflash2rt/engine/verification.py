"""A request's verification rule (``SamplingParams.verification``): "token", slot by slot
(``ops.verify``), or "block", the drafted block as a whole (``ops.block_verify``). Either
keeps the target's law; block verification keeps at least as many drafts in expectation. A
batch verifies each row by its own rule (the ``BlockVerify`` row extension), and what a rule
cannot do is refused before decoding, with what to change."""

from __future__ import annotations

from typing import Any, Sequence

from ..errors import InvalidInputError


def block_rows(requests: Sequence) -> int:
    """How many of ``requests`` (engine Requests) ask for block verification."""
    return sum(q.params.verification == "block" for q in requests)


def check_rule(requests: Sequence, spec: bool, watermark: Any = None) -> None:
    """Refuse block verification where it cannot apply: a target-only run (no drafts to
    verify) or a watermarked one (the watermark's keyed coins decide slot by slot)."""
    n = block_rows(requests)
    if n and not spec:
        raise InvalidInputError("verification='block' verifies speculative drafts, and this run "
                                "decodes target-only: leave it 'token', or speculate")
    if n and watermark is not None:
        raise InvalidInputError("verification='block' does not combine with the watermark (its "
                                "keyed coins decide slot by slot): leave it 'token' for "
                                "watermarked runs")
