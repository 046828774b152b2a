"""Constraint masks in float64: a token automaton's table ``next`` [S, V] (−1: forbidden)
walked along tokens, and the masked row (forbidden tokens at −inf, before temperature). A
state with no allowed token (dead end), or the state −1 after a forbidden token, leaves the row
unmasked: the runtime returns nothing a row at such a state emits (the request ends at the
dead end; a forbidden draft is rejected before the rows after it matter)."""

from __future__ import annotations

from typing import Sequence

import numpy as np


def walk(table: np.ndarray, state: int, tokens: Sequence[int]) -> int:
    """The state after ``tokens`` from ``state`` (−1 once a token is forbidden)."""
    for t in tokens:
        if state < 0:
            return -1
        state = int(table[state, int(t)])
    return state


def mask_row(logits: np.ndarray, table: np.ndarray, state: int) -> np.ndarray:
    """Raw (or processed) logits [V] → float64 logits with what ``state`` forbids at −inf."""
    x = np.array(logits, dtype=np.float64)
    if state < 0 or not (table[state] >= 0).any():
        return x
    return np.where(table[state] >= 0, x, -np.inf)


def block_rows(logits: np.ndarray, table: np.ndarray, state: int, draft: Sequence[int]
               ) -> np.ndarray:
    """Verify rows [γ+1, V] over [anchor, d_1..d_γ] from the committed ``state``: row j
    masked with the state after d_1..d_j."""
    return np.stack([mask_row(logits[j], table, walk(table, state, draft[:j]))
                     for j in range(logits.shape[0])])
