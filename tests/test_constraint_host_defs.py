"""``constraints.host``: a generic hook's verify-row masks (``block_masks``) and the tracker's
``complete``, against their documented definitions written out in the test.

``block_masks(tracker, drafts)`` is bool [γ+1, V]: row j is the hook's mask in the state after
the committed tokens and d_1..d_j; from the first row whose draft is forbidden onwards the rows
after it are all True (that draft is rejected there), and a dead-end row (no token allowed) is
all True with every row after it. The hook here keeps its state as the tuple of tokens so far
and draws each state's mask from a seeded generator of that tuple, so row j's expected mask is
computed from ``committed + drafts[:j]`` alone, with no walk shared with the code.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from dflash2rt.constraints.host import ConstraintTracker, block_masks

V = 11


class _PrefixHook:
    """State: the tuple of tokens so far. Mask: seeded by the tuple; no token at all in the
    states whose length is in ``dead_at``."""

    def __init__(self, seed: int, dead_at: tuple[int, ...] = ()) -> None:
        self.seed, self.dead_at, self.calls = seed, dead_at, 0

    def initial(self) -> tuple:
        return ()

    def allowed(self, state: tuple) -> np.ndarray:
        self.calls += 1
        if len(state) in self.dead_at:
            return np.zeros(V, bool)
        g = random.Random(f"{self.seed}/{state}")
        m = np.array([g.random() < 0.6 for _ in range(V)])
        m[g.randrange(V)] = True
        return m

    def advance(self, state: tuple, token: int) -> tuple:
        return state + (int(token),)


def _expected(hook: _PrefixHook, committed: tuple, drafts: list[int]) -> np.ndarray:
    """Row by row from the definition: each row's state is ``committed + drafts[:j]``."""
    rows = np.ones((len(drafts) + 1, V), bool)
    for j in range(len(drafts) + 1):
        if any(not hook.allowed(committed + tuple(drafts[:i]))[drafts[i]] for i in range(j)):
            break                                         # a forbidden draft before row j
        m = hook.allowed(committed + tuple(drafts[:j]))
        if not m.any():
            break                                         # a dead end: this row and the rest
        rows[j] = m
    return rows


def _drafts(hook: _PrefixHook, committed: tuple, g: random.Random, n: int,
            bad_at: int | None) -> list[int]:
    """n drafts, each allowed where it is drafted except the one at ``bad_at``."""
    out: list[int] = []
    for j in range(n):
        m = hook.allowed(committed + tuple(out))
        pick = np.flatnonzero(~m if j == bad_at else m)
        out.append(int(g.choice(list(pick))) if len(pick) else g.randrange(V))
    return out


@pytest.mark.parametrize("gamma", [0, 1, 2, 5])
def test_verify_row_masks_follow_the_drafts_row_by_row(gamma):
    g, seen_bad = random.Random(gamma), set()
    for case in range(40):
        dead = (g.randint(1, gamma + 2),) if case % 3 == 0 else ()
        hook = _PrefixHook(case, dead)
        tracker = ConstraintTracker(hook, V)
        committed = tracker.state
        for t in _drafts(hook, (), g, g.randint(0, 2), None):
            if tracker.feed([t]) is not None:
                break
            committed = tracker.state
        if not tracker.mask.any():
            continue
        bad_at = g.choice([None, *range(gamma)]) if gamma else None
        drafts = _drafts(hook, committed, g, gamma, bad_at)
        got = block_masks(tracker, drafts)
        assert got.shape == (gamma + 1, V) and got.dtype == np.bool_
        np.testing.assert_array_equal(got, _expected(hook, committed, drafts), err_msg=str(
            (case, committed, drafts, bad_at, dead)))
        assert tracker.state == committed                     # the tracker is not advanced
        seen_bad.add(bad_at)
    assert None in seen_bad and (gamma == 0 or len(seen_bad) > 1)


def _table_hook(rows: dict[tuple, list[int]]) -> _PrefixHook:
    """A hook whose masks are given per state (any state not listed: every token)."""
    hook = _PrefixHook(0)

    def allowed(state):
        m = np.zeros(V, bool) if state in rows else np.ones(V, bool)
        m[rows.get(state, [])] = True
        return m
    hook.allowed = allowed
    return hook


def test_each_cut_alone_a_forbidden_draft_a_dead_end_and_the_last_row():
    a, b, c = [0, 1], [2, 3], [4]
    hook = _table_hook({(): a, (0,): b, (0, 2): c, (0, 2, 4): []})
    t = ConstraintTracker(hook, V)

    def row(ids):
        m = np.zeros(V, bool)
        m[ids] = True
        return m
    ones = np.ones(V, bool)
    # every draft allowed: one row per state, the last row's mask too
    np.testing.assert_array_equal(block_masks(t, [0, 2]), [row(a), row(b), row(c)])
    # a forbidden first, middle or last draft: the rows after it are all True
    np.testing.assert_array_equal(block_masks(t, [5, 2]), [row(a), ones, ones])
    np.testing.assert_array_equal(block_masks(t, [0, 5]), [row(a), row(b), ones])
    np.testing.assert_array_equal(block_masks(t, [0, 2, 9]), [row(a), row(b), row(c), ones])
    # a dead end reached by the drafts: that row and the ones after it are all True
    np.testing.assert_array_equal(block_masks(t, [0, 2, 4]), [row(a), row(b), row(c), ones])
    np.testing.assert_array_equal(block_masks(t, [0, 2, 4, 1]),
                                  [row(a), row(b), row(c), ones, ones])
    # no drafts: the committed state's mask alone
    np.testing.assert_array_equal(block_masks(t, []), [row(a)])
    assert t.state == ()


class _NoAccepting:
    def initial(self):
        return 0

    def allowed(self, state):
        return np.ones(V, bool)

    def advance(self, state, token):
        return state + 1


class _Accepting(_NoAccepting):
    def accepting(self, state):
        return state == 2


class _AcceptingNotCallable(_NoAccepting):
    accepting = True


def test_complete_is_the_hooks_accepting_and_false_when_it_cannot_say():
    t = ConstraintTracker(_Accepting(), V)
    got = []
    for _ in range(4):
        got.append(t.complete())
        t.feed([0])
    assert got == [False, False, True, False]
    for hook in (_NoAccepting(), _AcceptingNotCallable()):
        t = ConstraintTracker(hook, V)
        assert t.complete() is False
        t.feed([1, 2])
        assert t.complete() is False
