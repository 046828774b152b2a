"""L1: constraint masks of the runtime (``dflash2rt.constraints``: a token automaton's state
gathered along the drafts on the device, applied by the engine before the backend's verify)
vs the float64 reference (``reference.constraints``), at block boundaries: verify row j must
be masked with the state after the committed tokens and d_1..d_j. In "every_row_moves", row
j's best raw token is allowed at row 0's state but forbidden at row j's, with the next draft
just below it: a runtime that masks every row with row 0's state rejects at slot 2. In
"forbidden_draft", a draft the mask forbids is rejected, and greedy verify emits the
reference's token there."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dflash2rt.constraints import TokenAutomaton
from dflash2rt.constraints.device import ConstraintBatch
from dflash2rt.ops.batch import BlockNoise, SamplingBatch
from dflash2rt_conformance.reference import constraints as ref

pytestmark = pytest.mark.dflash2rt_level("L1")

V, GAMMA, STATES = 37, 4, 8
COMMITTED = (5,)                          # the anchor, state 0 → 1
DRAFT = (20, 21, 22, 23)
TEMPT = 10                                # state k forbids TEMPT + k (and nothing else)


def _table(forbid_draft: int | None) -> np.ndarray:
    """State k → k + 1 (the last loops) on every token but TEMPT + k; with ``forbid_draft``,
    state 1 + that slot also forbids that slot's draft token."""
    t = np.tile(np.minimum(np.arange(STATES) + 1, STATES - 1)[:, None], (1, V))
    for k in range(STATES):
        t[k, TEMPT + k] = -1
    if forbid_draft is not None:
        t[1 + forbid_draft, DRAFT[forbid_draft]] = -1
    return t


def _logits() -> np.ndarray:
    """Row j: d_{j+1} (bonus row: 30) at 5.0, TEMPT + 1 + j (forbidden at row j's state,
    1 + j, allowed at row 0's) at 5.2; rows j >= 1: TEMPT + 1 at 4.0 (what greedy verify
    emits where a forbidden draft is rejected)."""
    x = np.random.default_rng(5).uniform(-2.0, 1.0, (GAMMA + 1, V))
    for j in range(GAMMA + 1):
        x[j, DRAFT[j] if j < GAMMA else 30] = 5.0
        x[j, TEMPT + 1 + j] = 5.2
        if j:
            x[j, TEMPT + 1] = 4.0
    return x


CASES = {"every_row_moves": None, "forbidden_draft": 2}


@pytest.mark.parametrize("case", list(CASES))
def test_constraint_rows_at_block_boundaries(case, backend, results):
    dev, table = backend.device, _table(CASES[case])
    raw = _logits()
    state = ref.walk(table, 0, COMMITTED)
    want = ref.block_rows(raw, table, state, DRAFT)
    cb = ConstraintBatch.build([TokenAutomaton(table)], V, dev)
    cb.commit_(torch.tensor([COMMITTED], device=dev), torch.tensor([len(COMMITTED)], device=dev))
    draft = torch.tensor([DRAFT], device=dev)
    got = cb.mask(torch.tensor(raw[None], dtype=torch.float32, device=dev), draft)[0]
    g = got.double().cpu().numpy()
    same_inf = np.isneginf(g) == np.isneginf(want)
    err = float(np.max(np.abs(np.where(np.isfinite(want), g - want, 0.0))))
    results.metric("L1", f"constraint rows {case} max |err|", err)
    assert same_inf.all() and err <= 1e-6, \
        f"[L1 constraint case={case}] masked rows differ from the reference (rows " \
        f"{sorted(set(np.argwhere(~same_inf)[:, 0].tolist()))} mask other tokens; max |err| " \
        f"{err:.3g}): row j must be masked with the state after d_1..d_j"
    ver = backend.verify(got[None], draft, draft.unsqueeze(-1),
                         torch.ones(1, GAMMA, 1, device=dev), SamplingBatch.greedy_batch(1, dev),
                         BlockNoise.unused(1, GAMMA, dev))
    best = [int(np.flatnonzero(r == r.max())[0]) for r in want]
    acc = next((j for j in range(GAMMA) if best[j] != DRAFT[j]), GAMMA)
    expect = list(DRAFT[:acc]) + [best[acc]]
    assert acc == (GAMMA if CASES[case] is None else CASES[case]), \
        f"[L1 constraint case={case}] the case does not reach the slot it is built for"
    tokens = [t for t in ver.tokens[0].tolist() if t >= 0]
    assert tokens == expect, f"[L1 constraint case={case}] greedy verify over masked rows " \
                             f"emitted {tokens}, the reference {expect} (row j must be masked " \
                             "with the state after d_1..d_j)"


WALK_R, WALK_GAMMA, WALK_K, WALK_RANK, WALK_STATES = 4, 6, 6, 3, 5
WALK_TEMPS = (0.0, 1.0, 0.7, 1.6)


def _walk_table() -> np.ndarray:
    """State s forbids about 40% of the tokens (its own draw) and moves to (s + 1 + t) mod S
    on an allowed token t, so the allowed candidates change along every path."""
    g = np.random.default_rng(11)
    t = (np.arange(WALK_STATES)[:, None] + 1 + np.arange(V)[None, :]) % WALK_STATES
    return np.where(g.random((WALK_STATES, V)) < 0.4, -1, t)


def test_draft_walk_follows_the_constraint(backend, results):
    """The draft side under a constraint (``engine.stages.draft_logits`` then the selector walk
    with ``ConstraintBatch.walk``) vs the float64 reference: slot 0's candidates come from
    the committed state's allowed tokens, and at each slot the walk reads its lattice row with
    what the state after the path so far forbids at −inf and draws from that masked law, which
    is the q it returns. A walk that masks with another slot's state, draws from the unmasked
    row, or returns the unmasked law as q differs from the reference (greedy and sampled
    rows)."""
    _draft_walk(backend, results, None)


def test_draft_walk_with_rows_limited_to_their_own_count(backend, results):
    """The same with requests' own candidate counts (``engine.candidates.limit`` after the
    constraint's masks): a row's candidates past its count are −inf, and where every allowed
    candidate is one of those the walk reads its row unmasked, as where all are forbidden."""
    unmasked = _draft_walk(backend, results, (2, None, 1, 3))
    assert unmasked >= 1, "the case never leaves a slot whose allowed candidates are all −inf"


def _draft_walk(backend, results, counts) -> int:
    """The draft walk vs the reference (``counts``: the rows' own candidate counts, None: the
    selector's K) → the slots where the walk read its row unmasked with allowed candidates
    there (all of them −inf)."""
    from dflash2rt.engine import candidates
    from dflash2rt.ops import selector as ops_selector
    from dflash2rt.ops.selector import SelectorParams
    from dflash2rt_conformance.reference import selector as ref_sel

    dev, table = backend.device, _walk_table()
    g = np.random.default_rng(12)
    logits = g.normal(0.0, 2.0, (WALK_R, WALK_GAMMA, V))
    proj = g.normal(0.0, 1.0, (WALK_R, WALK_GAMMA, WALK_RANK))
    a, b = g.normal(0.0, 1.0, (2, V, WALK_RANK))
    anchor = g.integers(0, V, WALK_R)
    u = g.uniform(0.02, 0.98, (WALK_R, WALK_GAMMA))
    cb, state = _committed_batch(table, g, dev)

    def t(x, dt=torch.float32):
        return torch.tensor(np.asarray(x), dtype=torch.float64).to(dt).to(dev)
    x = cb.draft_logits(t(logits))
    want_x = ref_sel.draft_logits(logits, table, state)
    k = WALK_K
    if counts is not None:
        per_row = torch.tensor([c or 0 for c in counts], dtype=torch.int64, device=dev)
        k, x = candidates.limit(x, counts, per_row, WALK_K)
        want_x = ref_sel.limit(want_x, [c or WALK_K for c in counts])
    sampling = SamplingBatch.build(list(WALK_TEMPS), [0] * WALK_R, [1.0] * WALK_R, dev)
    args = (t(proj), t(anchor, torch.int64), t(a), t(b), SelectorParams(k), sampling, t(u))
    with backend.run_context():
        out = ops_selector.select(x, *args, backend.has_fp64, mask=cb.walk())
    want = ref_sel.select(want_x, proj, anchor, a, b, k, 1.0, None, list(WALK_TEMPS),
                          [tt == 0 for tt in WALK_TEMPS], u, table=table, state=state)
    got_q = out.q.double().cpu().numpy()
    err = float(np.max(np.abs(got_q - want["q"])))
    case = "draft_walk" if counts is None else "draft_walk_own_counts"
    results.metric("L1", f"constraint {case} max |q err|", err)
    assert (out.candidates.cpu().numpy() == want["candidates"]).all(), \
        f"[L1 constraint case={case}] candidate sets differ from the reference (slot 0 " \
        "from the committed state's allowed tokens, later slots from the automaton's)"
    assert (out.draft.cpu().numpy() == want["draft"]).all() and err <= 1e-5, \
        f"[L1 constraint case={case}] drafts {out.draft.cpu().tolist()} vs reference " \
        f"{want['draft'].tolist()}, max |q err| {err:.3g}: the walk must draw from the row " \
        "masked with the state after the path so far, and return that law as q"
    assert not out.bad_lattice.any() and not want["bad_lattice"].any(), \
        f"[L1 constraint case={case}] a walked row flagged as not a law"
    forbidden, unmasked = _forbidden_slots(table, state, want, want_x)
    assert forbidden >= WALK_R * WALK_GAMMA // 2, "the case masks too little to test the walk"
    return unmasked


def _committed_batch(table: np.ndarray, g: np.random.Generator, dev) -> tuple:
    """Each row's committed tokens (lengths 1, 2, 0, 3, allowed tokens drawn from ``g``
    from the start state) in a ConstraintBatch → (the batch, the reference state per row); the
    batch's states must equal the reference's."""
    committed = []
    for length in (1, 2, 0, 3):                     # allowed tokens from the start state
        c, st = [], 0
        for _ in range(length):
            c.append(int(g.choice(np.flatnonzero(table[st] >= 0))))
            st = int(table[st, c[-1]])
        committed.append(tuple(c))
    cb = ConstraintBatch.build([TokenAutomaton(table)] * WALK_R, V, dev)
    n = max(len(c) for c in committed)
    toks = torch.tensor([list(c) + [0] * (n - len(c)) for c in committed], device=dev)
    cb.commit_(toks, torch.tensor([len(c) for c in committed], device=dev))
    state = [ref.walk(table, 0, c) for c in committed]
    assert (cb.state.cpu().numpy() - 1).tolist() == state, \
        "committed states differ (see the L1 row cases; the batch table's state 0 is free)"
    return cb, state


def _forbidden_slots(table: np.ndarray, state: list[int], want: dict,
                    x: np.ndarray) -> tuple[int, int]:
    """How many (row, slot) pairs of the reference walk offer a forbidden candidate, and at how
    many every allowed candidate is −inf in the draft logits ``x``; a draft never takes a
    forbidden candidate while an allowed one above −inf is there."""
    forbidden = unmasked = 0
    for i in range(WALK_R):                # the case reaches forbidden candidates on most slots
        s = state[i]
        for e in range(WALK_GAMMA):
            if s < 0:                      # past a slot whose candidates were all forbidden
                break
            cand = want["candidates"][i, e]
            ok = table[s][cand] >= 0
            live = ok & (x[i, e, cand] > -np.inf)
            forbidden += int(not ok.all())
            unmasked += int(ok.any() and not live.any())
            s = ref.walk(table, s, (int(want["draft"][i, e]),))
            assert s >= 0 or not live.any(), f"[L1 constraint case=draft_walk] draft " \
                f"{want['draft'][i]} takes a forbidden candidate at slot {e} beside allowed ones"
    return forbidden, unmasked
