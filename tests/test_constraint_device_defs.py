"""``constraints.device`` against each request's own automaton walked in Python: the batch
table's states, the verify-row masks, the draft masks, commits, row selection and the
selector walk's mask, in batches that mix automata of different sizes and start states (one
of them twice), unconstrained rows and generic host hooks, with a difference in every row.

The reference reads only ``TokenAutomaton.next`` / ``start`` of each request, never the batch
table: a row's state is its automaton's state, or "free" (nothing masked) for an
unconstrained or generic row, after a forbidden token, and at a dead end (no token allowed).
Masked logits are compared exactly: an allowed entry keeps its value, a forbidden one is -inf.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from dflash2rt.constraints import TokenAutomaton
from dflash2rt.constraints.device import (ConstraintBatch, block_states, mask_rows,
                                          step_states)

V = 9
FREE = None


def _automaton(g: random.Random, states: int, start: int, unused: int) -> TokenAutomaton:
    """A random table with forbidden entries everywhere, the last state a dead end and token
    ``unused`` allowed nowhere."""
    t = np.array([[g.randrange(states) if g.random() < 0.55 else -1 for _ in range(V)]
                  for _ in range(states)])
    t[-1] = -1
    used = [v for v in range(V) if v != unused]
    for s in range(states - 1):
        t[s, g.choice(used)] = g.randrange(states)           # every other state is live
    t[start, g.choice(used)] = states - 1                    # the dead end is reachable
    t[:, unused] = -1
    return TokenAutomaton(t, start)


def _batch(seed: int):
    """[A (start 2), None, hook, B (start 0), A again]: different offsets in one table."""
    g = random.Random(seed)
    a, b = _automaton(g, 5, 2, 3), _automaton(g, 4, 0, 6)
    hook = object()                                          # a generic hook: not a table
    return g, [a, None, hook, b, a]


def _allowed(c, s) -> np.ndarray:
    """What the device masks at a reference state: everything when free or dead."""
    if not isinstance(c, TokenAutomaton) or s is FREE or not (c.next[s] >= 0).any():
        return np.ones(V, bool)
    return c.next[s] >= 0


def _step(c, s, tok: int):
    if not isinstance(c, TokenAutomaton) or s is FREE or tok < 0 or c.next[s, tok] < 0:
        return FREE
    return int(c.next[s, tok])


def _start(c):
    return c.start if isinstance(c, TokenAutomaton) else FREE


def _masked(logits: torch.Tensor, allowed: np.ndarray) -> torch.Tensor:
    return torch.where(torch.from_numpy(allowed), logits, torch.tensor(-torch.inf))


def _drafts(g: random.Random, cons, states, gamma: int) -> torch.Tensor:
    """Mostly allowed drafts, so the walks go deep; now and then a forbidden one."""
    out = []
    for c, s in zip(cons, states):
        row = []
        for _ in range(gamma):
            ok = np.flatnonzero(_allowed(c, s) & (c.next[s] >= 0)) \
                if isinstance(c, TokenAutomaton) and s is not FREE else np.arange(V)
            t = int(g.choice(list(ok))) if len(ok) and g.random() < 0.85 else g.randrange(V)
            row.append(t)
            s = _step(c, s, t)
        out.append(row)
    return torch.tensor(out, dtype=torch.int64)


def test_step_states_each_condition_alone():
    """-1 when the state is -1 (alone), the token is -1 (alone) or forbidden; else the table."""
    table = torch.tensor([[0, 0, 0], [2, -1, 1], [1, 2, -1]], dtype=torch.int32)
    state = torch.tensor([1, 1, 1, -1, -1, 2, 2, 0, 2])
    token = torch.tensor([0, 1, 2, 0, -1, -1, 1, 2, 2])
    want = [2, -1, 1, -1, -1, -1, 2, 0, -1]
    assert step_states(table, state, token).tolist() == want
    # every (state, token) of a random table against a plain lookup
    g = torch.Generator().manual_seed(0)
    t = torch.randint(-1, 6, (6, V), generator=g, dtype=torch.int32)
    s = torch.arange(-1, 6).repeat_interleave(V + 1)
    k = torch.arange(-1, V).repeat(7)
    got = step_states(t, s, k).tolist()
    assert got == [-1 if a < 0 or b < 0 else int(t[a, b]) for a, b in zip(s.tolist(),
                                                                       k.tolist())]


def test_mask_rows_masks_exactly_what_each_rows_state_forbids():
    g = torch.Generator().manual_seed(1)
    allow = torch.rand(4, V, generator=g) < 0.5
    allow[0] = True                                   # state 0: the batch's free state
    states = torch.tensor([[0, 3, -1], [2, 2, 1]])
    logits = torch.randn(2, 3, V, generator=g)
    out = mask_rows(logits, allow, states)
    for r in range(2):
        for j in range(3):
            s = int(states[r, j])
            ok = torch.ones(V, dtype=torch.bool) if s < 0 else allow[s]
            want = torch.where(ok, logits[r, j], torch.tensor(-torch.inf))
            assert torch.equal(out[r, j], want), (r, j)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("gamma", [0, 1, 4])
def test_verify_rows_are_masked_by_each_requests_own_walk(seed, gamma):
    g, cons = _batch(seed)
    cb = ConstraintBatch.build(cons, V, "cpu")
    # walk the committed states somewhere first (commit_ against the reference walk)
    toks = _drafts(g, cons, [_start(c) for c in cons], 3)
    n = torch.tensor([3, 1, 2, 0, 2])
    cb.commit_(toks, n)
    states = []
    for r, c in enumerate(cons):
        s = _start(c)
        for t in toks[r, :int(n[r])].tolist():
            s = _step(c, s, t)
        states.append(s)
    draft = _drafts(g, cons, states, gamma)
    logits = torch.randn(len(cons), gamma + 1, V, generator=torch.Generator().manual_seed(seed))
    cb.host_mask.fill_(True)
    if gamma:
        cb.set_host_block_(np.ones((len(cons), gamma + 1, V), bool))
    out = cb.mask(logits, draft if gamma else None)
    for r, c in enumerate(cons):
        s = states[r]
        for j in range(gamma + 1):
            assert torch.equal(out[r, j], _masked(logits[r, j], _allowed(c, s))), (r, j, s)
            if j < gamma:
                s = _step(c, s, int(draft[r, j]))
    bs = block_states(cb.table, cb.state, draft if gamma else None)
    assert bs.shape == (len(cons), gamma + 1)


def test_generic_rows_take_the_host_masks_next_token_and_verify_rows():
    g, cons = _batch(7)
    cb = ConstraintBatch.build(cons, V, "cpu")
    assert cb.generic == (False, False, True, False, False)
    hook_next = np.zeros(V, bool)
    hook_next[[1, 4]] = True
    cb.set_host_masks_([None, None, hook_next, None, None])
    want_host = np.ones((5, V), bool)
    want_host[2] = hook_next
    np.testing.assert_array_equal(cb.host_mask.numpy(), want_host)
    logits = torch.randn(5, 1, V, generator=torch.Generator().manual_seed(7))
    out = cb.mask(logits)                                     # one row: the next-token masks
    for r, c in enumerate(cons):
        want = want_host[r] & _allowed(c, _start(c))
        assert torch.equal(out[r, 0], _masked(logits[r, 0], want)), r
    # verify rows: the host block, used once, of exactly the logits' shape
    gamma = 2
    draft = _drafts(g, cons, [_start(c) for c in cons], gamma)
    block = np.ones((5, gamma + 1, V), bool)
    block[2] = np.array([[v % (j + 2) == 0 for v in range(V)] for j in range(gamma + 1)])
    logits = torch.randn(5, gamma + 1, V, generator=torch.Generator().manual_seed(8))
    cb.set_host_block_(block)
    out = cb.mask(logits, draft)
    for r, c in enumerate(cons):
        s = _start(c)
        for j in range(gamma + 1):
            want = block[r, j] & _allowed(c, s)
            assert torch.equal(out[r, j], _masked(logits[r, j], want)), (r, j)
            if j < gamma:
                s = _step(c, s, int(draft[r, j]))
    with pytest.raises(AssertionError, match="host masks"):   # used up: not there any more
        cb.mask(logits, draft)
    cb.set_host_block_(block[:, :2])                         # there, but of another shape
    with pytest.raises(AssertionError, match="host masks"):
        cb.mask(logits, draft)


def test_a_batch_without_generic_rows_has_no_host_mask_and_needs_no_host_block():
    g, cons = _batch(3)
    cons[2] = None
    cb = ConstraintBatch.build(cons, V, "cpu")
    assert cb.host_mask is None and cb.generic == (False,) * 5
    draft = _drafts(g, cons, [_start(c) for c in cons], 2)
    logits = torch.randn(5, 3, V, generator=torch.Generator().manual_seed(3))
    out = cb.mask(logits, draft)                              # no host block set: no error
    for r, c in enumerate(cons):
        assert torch.equal(out[r, 0], _masked(logits[r, 0], _allowed(c, _start(c))))
    assert ConstraintBatch.build([None, None], V, "cpu") is None


def _ever(c) -> np.ndarray:
    """Tokens allowed at some state of the automaton (every token: free and generic rows)."""
    if not isinstance(c, TokenAutomaton):
        return np.ones(V, bool)
    out = np.zeros(V, bool)
    for s in range(c.num_states):
        out |= c.next[s] >= 0
    return out


def test_draft_slots_are_masked_by_the_committed_state_then_by_ever():
    g, cons = _batch(11)
    cb = ConstraintBatch.build(cons, V, "cpu")
    hook_next = np.zeros(V, bool)
    hook_next[[0, 5, 8]] = True
    cb.set_host_masks_([None, None, hook_next, None, None])
    logits = torch.randn(5, 4, V, generator=torch.Generator().manual_seed(11))
    out = cb.draft_logits(logits)
    for r, c in enumerate(cons):
        first = _allowed(c, _start(c)) & (hook_next if r == 2 else True)
        assert torch.equal(out[r, 0], _masked(logits[r, 0], first)), r
        for j in range(1, 4):
            assert torch.equal(out[r, j], _masked(logits[r, j], _ever(c))), (r, j)
    assert not _ever(cons[0])[3] and not _ever(cons[3])[6]          # ever masks something
    # a row left with no allowed token at slot 0 stays unmasked there
    cb.set_host_masks_([None, None, np.zeros(V, bool), None, None])
    out = cb.draft_logits(logits)
    assert torch.equal(out[2, 0], logits[2, 0])


def test_ever_of_a_token_set_and_a_committed_state_past_a_forbidden_token():
    """A token set's every transition goes to its state 0: ``ever`` is still its ids. A row
    whose committed state is -1 (a forbidden token committed) masks nothing at slot 0."""
    g, cons = _batch(13)
    cons[1] = TokenAutomaton.token_set([2, 5], V)
    cb = ConstraintBatch.build(cons, V, "cpu")
    np.testing.assert_array_equal(cb.ever.numpy(), np.stack([_ever(c) for c in cons]))
    assert cb.ever[1].tolist() == [v in (2, 5) for v in range(V)]
    a = cons[0]
    bad = int(np.flatnonzero(a.next[a.start] < 0)[0])
    cb.commit_(torch.tensor([[bad], [2], [0], [0], [0]]), torch.tensor([1, 1, 0, 0, 0]))
    assert int(cb.state[0]) == -1
    cb.set_host_masks_([None] * 5)
    logits = torch.randn(5, 2, V, generator=torch.Generator().manual_seed(13))
    out = cb.draft_logits(logits)
    assert torch.equal(out[0, 0], logits[0, 0])
    assert torch.equal(out[1, 0], _masked(logits[1, 0], np.isin(np.arange(V), [2, 5])))
    out = cb.mask(logits[:, :1])
    assert torch.equal(out[0, 0], logits[0, 0])
    walk = cb.walk()
    assert walk.allowed(0, torch.arange(V).repeat(5, 1))[0].all()


def test_take_keeps_each_selected_rows_state_masks_and_flags():
    g, cons = _batch(5)
    cb = ConstraintBatch.build(cons, V, "cpu")
    masks = [None, None, np.arange(V) % 2 == 0, None, None]
    cb.set_host_masks_(masks)
    cb.commit_(_drafts(g, cons, [_start(c) for c in cons], 2), torch.tensor([2, 2, 2, 2, 1]))
    idx = [4, 2, 0]
    sub = cb.take(idx)
    assert sub.state.tolist() == [int(cb.state[i]) for i in idx]
    assert sub.generic == (False, True, False)
    assert torch.equal(sub.host_mask, cb.host_mask[idx])
    assert torch.equal(sub.ever, cb.ever[idx]) and sub.host_block == {}
    logits = torch.randn(3, 1, V, generator=torch.Generator().manual_seed(5))
    full = cb.mask(torch.zeros(5, 1, V).index_copy_(0, torch.tensor(idx), logits))
    assert torch.equal(sub.mask(logits), full[idx])


def test_the_selector_walk_masks_candidates_by_the_state_along_its_path():
    g, cons = _batch(9)
    cb = ConstraintBatch.build(cons, V, "cpu")
    walk = cb.walk()
    states = [_start(c) for c in cons]
    for slot in range(4):
        cand = torch.tensor([g.sample(range(V), 4) for _ in cons])
        got = walk.allowed(slot, cand)
        for r, c in enumerate(cons):
            ok = _allowed(c, states[r])
            assert got[r].tolist() == [bool(ok[k]) for k in cand[r].tolist()], (slot, r)
        pick = torch.tensor([int(cand[r, g.randrange(4)]) for r in range(len(cons))])
        walk.advance(pick)
        states = [_step(c, s, int(t)) for c, s, t in zip(cons, states, pick)]
    assert cb.state.tolist() == ConstraintBatch.build(cons, V, "cpu").state.tolist()
