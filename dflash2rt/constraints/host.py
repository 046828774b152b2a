"""The host's walk of a request's constraint along the tokens it commits: where it reaches a
dead end (the request finishes there: "constraint" when the output is complete there,
"constraint_unsatisfiable" when it is not, ``ConstraintTracker.complete``), a check that every
returned token was allowed, and a generic hook's mask for the next token. It runs on the
step's host copy of the tokens, so it costs no device→host transfer."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..errors import ConstraintError
from .automaton import TokenAutomaton


def checked_mask(mask: object, vocab: int) -> np.ndarray:
    """A hook's ``allowed(state)`` as bool [V]; a ConstraintError when it is not one."""
    try:
        m = np.asarray(mask.cpu() if hasattr(mask, "cpu") else mask)
    except Exception as exc:  # an arbitrary object from user code
        raise ConstraintError(f"constraint allowed(state) must return a bool array of "
                              f"{vocab} entries, got {type(mask).__name__}") from exc
    if m.dtype != np.bool_ or m.shape != (vocab,):
        raise ConstraintError(f"constraint allowed(state) must return a bool array of shape "
                              f"({vocab},) (the target's vocabulary), got dtype {m.dtype} "
                              f"shape {m.shape}")
    return m


class ConstraintTracker:
    """One request's constraint state on the host; ``vocab``: the target's vocabulary."""

    def __init__(self, constraint, vocab: int) -> None:
        self.c, self.vocab = constraint, vocab
        self.table = isinstance(constraint, TokenAutomaton)
        self.state = constraint.initial()
        self.mask = self.allowed(self.state)
        if not self.mask.any():
            raise ConstraintError("the constraint's initial state allows no token")

    def allowed(self, state) -> np.ndarray:
        """The mask of tokens the constraint allows in ``state``, bool [V] (checked)."""
        return self.c.allowed(state) if self.table else checked_mask(self.c.allowed(state),
                                                                     self.vocab)

    def complete(self) -> bool:
        """Whether the hook says the output so far is complete (``accepting(state)``; a hook
        without that method cannot say, and a dead end there counts as not complete)."""
        accepting = getattr(self.c, "accepting", None)
        return bool(accepting(self.state)) if callable(accepting) else False

    def feed(self, tokens: Sequence[int]) -> int | None:
        """Advance by ``tokens``; → k when the state after ``tokens[:k]`` is a dead end (the
        tokens after it are not walked), else None. A token the state forbids raises: the
        engine masks every row, so that is a bug, never an output."""
        for k, t in enumerate(tokens):
            if not self.mask[t]:
                raise ConstraintError(f"token {t} was emitted but the constraint forbids it "
                                      f"(state {self.state!r}): an engine bug, please report")
            self.state = self.c.advance(self.state, int(t))
            self.mask = self.allowed(self.state)
            if not self.mask.any():
                return k + 1
        return None


def block_masks(tracker: ConstraintTracker, drafts: Sequence[int]) -> np.ndarray:
    """A generic hook's masks for the verify rows of a speculative step, bool [γ+1, V]: row j
    with the state after the committed tokens and d_1..d_j (``advance`` must return a new
    state, not change its argument). Rows from a forbidden draft on (it is rejected there:
    what they emit is never kept) and dead-end rows (the host finishes the request at the
    token that reached them) are left all True, as the device tables leave them."""
    v = tracker.vocab
    out = np.ones((len(drafts) + 1, v), bool)
    state, mask = tracker.state, tracker.mask
    for j in range(len(drafts) + 1):
        if not mask.any():
            break
        out[j] = mask
        if j == len(drafts) or not mask[drafts[j]]:
            break
        state = tracker.c.advance(state, int(drafts[j]))
        mask = tracker.allowed(state)
    return out
