"""The candidate selector: deterministic top-K, the lattice, greedy and sampled walks."""

from __future__ import annotations

import pytest
import torch

from dflash2rt.errors import InvalidInputError
from dflash2rt.ops import exact32, selector, verify as ops_verify
from dflash2rt.ops.batch import SamplingBatch
from dflash2rt.ops.draws import DrawSource
from dflash2rt.ops.selector import SelectorParams, select, topk_lowest_index, unary_scores


def _inputs(r=3, gamma=5, v=50, rank=4, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(r, gamma, v, generator=g).to(dtype)
    proj = torch.randn(r, gamma, rank, generator=g).to(dtype)
    a = torch.randn(v, rank, generator=g).to(dtype)
    b = torch.randn(v, rank, generator=g).to(dtype)
    anchor = torch.randint(0, v, (r,), generator=g)
    u = torch.rand(r, gamma, generator=g)
    return logits, proj, anchor, a, b, u


def test_topk_breaks_ties_by_lowest_index():
    x = torch.tensor([[1.0, 3.0, 3.0, 0.5, 3.0, 2.0, 3.0]])
    vals, ids = topk_lowest_index(x, 3)
    assert ids.tolist() == [[1, 2, 4]] and vals.tolist() == [[3.0, 3.0, 3.0]]
    vals, ids = topk_lowest_index(x, 6)
    assert ids.tolist() == [[1, 2, 4, 6, 5, 0]]


def test_zero_successor_codebook_walk_is_per_slot_argmax():
    logits, proj, anchor, a, _, u = _inputs()
    logits[0, 1, [3, 9]] = logits[0, 1].max() + 1  # a tie: the lower id must win
    zero = torch.zeros_like(a)
    params = SelectorParams(top_k=8, output_multiplier=0.3, softcap=2.0)
    out = select(logits, proj, anchor, a, zero, params, SamplingBatch.greedy_batch(3), u)
    assert torch.equal(out.draft, torch.argmax(logits, dim=-1))
    assert out.draft[0, 1] == 3
    assert torch.equal(out.q, torch.nn.functional.one_hot(torch.zeros_like(out.draft), 8).float())
    assert not bool(out.bad.any())


def test_greedy_walk_follows_the_lattice():
    logits, proj, anchor, a, b, u = _inputs(r=2, gamma=4, v=30, seed=3)
    params = SelectorParams(top_k=5, output_multiplier=0.7, softcap=None)
    out = select(logits, proj, anchor, a, b, params, SamplingBatch.greedy_batch(2), u)
    for r in range(2):
        prev = int(anchor[r])
        for e in range(4):
            cand = out.candidates[r, e]
            unary = unary_scores(logits[r, e, cand], params)
            row = [float(unary[c]) + float((a[prev] * proj[r, e] * b[int(cand[c])]).sum())
                   for c in range(5)]
            best = max(range(5), key=lambda c: (row[c], -c))
            assert int(out.draft[r, e]) == int(cand[best])
            prev = int(cand[best])


def test_sampled_walk_uses_inverse_cdf_and_reports_its_law():
    logits, proj, anchor, a, b, _ = _inputs(r=2, gamma=3, v=40, seed=5)
    params = SelectorParams(top_k=6, output_multiplier=1.0, softcap=5.0)
    sampling = SamplingBatch.build([0.8, 0.8], [0, 0], [1.0, 1.0])
    lo = select(logits, proj, anchor, a, b, params, sampling, torch.full((2, 3), 2.0 ** -24))
    assert torch.equal(lo.draft, lo.candidates[..., 0])
    hi = select(logits, proj, anchor, a, b, params, sampling, torch.full((2, 3), 1 - 2.0 ** -24))
    assert torch.equal(hi.draft, hi.candidates[..., -1])
    for out in (lo, hi):
        torch.testing.assert_close(out.q.sum(-1), torch.ones(2, 3))
        mass = (out.q * (out.candidates == out.draft.unsqueeze(-1))).sum(-1)
        assert bool((mass > 0).all())
    # q at slot 0 is softmax(row / T) of the anchor's lattice row.
    cand = lo.candidates[0, 0]
    row = unary_scores(logits[0, 0, cand], params) + (a[anchor[0]] * proj[0, 0] * b[cand]).sum(-1)
    torch.testing.assert_close(lo.q[0, 0], torch.softmax(row / 0.8, -1))


def test_masked_candidates_are_never_drawn():
    logits, proj, anchor, a, b, _ = _inputs(r=1, gamma=2, v=10, seed=2)
    logits[:, :, 3:] = float("-inf")  # only 3 finite logits, K = 5
    params = SelectorParams(top_k=5, softcap=3.0)
    out = select(logits, proj, anchor, a, b, params, SamplingBatch.build([1.0], [0], [1.0]),
                 torch.full((1, 2), 1 - 2.0 ** -24))
    assert bool((out.q[..., 3:] == 0).all())
    assert bool((out.draft < 3).all())


def test_mixed_batch_rows_equal_their_solo_runs():
    logits, proj, anchor, a, b, u = _inputs(r=3, gamma=4, v=25, seed=9)
    params = SelectorParams(top_k=4, output_multiplier=0.5)
    temps = [0.0, 1.3, 0.7]
    both = select(logits, proj, anchor, a, b, params, SamplingBatch.build(temps, [0] * 3,
                                                                          [1.0] * 3), u)
    for r in range(3):
        solo = select(logits[r:r + 1], proj[r:r + 1], anchor[r:r + 1], a, b, params,
                      SamplingBatch.build([temps[r]], [0], [1.0]), u[r:r + 1])
        assert torch.equal(solo.draft[0], both.draft[r])
        assert torch.equal(solo.q[0], both.q[r])


def test_nan_rows_are_flagged_and_bad_args_raise():
    logits, proj, anchor, a, b, u = _inputs(r=2, gamma=2, v=12)
    logits[1, 1, 4] = float("nan")
    out = select(logits, proj, anchor, a, b, SelectorParams(top_k=3),
                 SamplingBatch.greedy_batch(2), u)
    assert out.bad.tolist() == [False, True]
    with pytest.raises(InvalidInputError, match="top_k"):
        select(logits, proj, anchor, a, b, SelectorParams(top_k=13),
               SamplingBatch.greedy_batch(2), u)


def test_selector_and_sample_next_fp32_equal_fp64():
    g = torch.Generator().manual_seed(4)
    r, gamma, v, rank = 16, 4, 50, 3
    logits = torch.randn(r, gamma, v, generator=g)
    args = (logits, torch.randn(r, gamma, rank, generator=g),
            torch.randint(0, v, (r,), generator=g),
            torch.randn(v, rank, generator=g), torch.randn(v, rank, generator=g),
            selector.SelectorParams(6), SamplingBatch.build([0.9] * (r - 1) + [0.0], [0] * r,
                                                            [1.0] * r),
            torch.rand(r, gamma, generator=g))
    a, b = selector.select(*args, has_fp64=True), selector.select(*args, has_fp64=False)
    assert torch.equal(a.draft, b.draft) and torch.equal(a.q, b.q)
    u = torch.rand(r, generator=g)
    want = ops_verify.sample_next(logits[:, 0], args[6], u)
    with exact32.without_fp64():
        got = ops_verify.sample_next(logits[:, 0], args[6], u)
    assert torch.equal(want[0], got[0]) and torch.equal(want[1], got[1])


@pytest.mark.parametrize("mult,cap", [(1.0, None), (0.3, None), (1.0, 2.0), (2.5, 4.0),
                                      (0.05, 0.5)])
@pytest.mark.parametrize("temps", [(0.0, 0.0, 0.0), (0.8, 0.0, 1.7)])
def test_select_equals_the_float64_reference(mult, cap, temps):
    """Each output multiplier and softcap, greedy and mixed rows: drafts, candidates and q
    against the conformance suite's float64 reference (which computes the unary scores, the
    lattice and the walk on its own)."""
    from dflash2rt_conformance.reference import selector as ref

    logits, proj, anchor, a, b, u = _inputs(r=3, gamma=4, v=40, seed=int(mult * 10) + 7)
    params = SelectorParams(top_k=6, output_multiplier=mult, softcap=cap)
    sampling = SamplingBatch.build(list(temps), [0] * 3, [1.0] * 3)
    got = select(logits, proj, anchor, a, b, params, sampling, u)
    want = ref.select(logits.numpy(), proj.double().numpy(), anchor.numpy(),
                      a.double().numpy(), b.double().numpy(), 6, mult, cap, list(temps),
                      [t == 0 for t in temps], u.double().numpy())
    assert got.candidates.tolist() == want["candidates"].tolist()
    assert got.draft.tolist() == want["draft"].tolist()
    torch.testing.assert_close(got.q.double(), torch.from_numpy(want["q"]), atol=1e-5,
                               rtol=1e-4)


@pytest.mark.parametrize("bad", ["proj rows", "proj rank", "codebooks", "u_walk"])
def test_each_shape_mismatch_alone_is_refused(bad):
    logits, proj, anchor, a, b, u = _inputs(r=2, gamma=3, v=20)
    if bad == "proj rows":
        proj = proj[:, :2]
    elif bad == "proj rank":
        proj = proj[..., :3]
    elif bad == "codebooks":
        b = b[:, :3]
    else:
        u = u[:, :2]
    with pytest.raises(InvalidInputError, match="selector shapes disagree"):
        select(logits, proj, anchor, a, b, SelectorParams(top_k=4),
               SamplingBatch.greedy_batch(2), u)


@pytest.mark.parametrize("seed,nan", [(0, False), (1, False), (2, False), (0, True),
                                      (3, True)])
def test_the_constrained_walk_equals_the_float64_reference(seed, nan):
    """The walk under a token automaton (``ConstraintBatch.walk``), greedy and sampled rows:
    each slot's row masked with the state after the path so far (unmasked where nothing
    allowed has mass), drawn from, and returned as q, as the reference does. ``nan``: the
    first row's anchor has a NaN codebook row, so the rows whose walk reads it are flagged,
    and only those (their drafts are not compared)."""
    import numpy as np
    from dflash2rt_conformance.reference import selector as ref

    from dflash2rt.constraints import TokenAutomaton
    from dflash2rt.constraints.device import ConstraintBatch

    r, gamma, v, k, rank, states = 4, 5, 24, 6, 3, 4
    g = np.random.default_rng(seed)
    nxt = (np.arange(states)[:, None] + 1 + np.arange(v)[None, :]) % states
    table = np.where(g.random((states, v)) < 0.45, -1, nxt)
    table[:, 0] = 0                                      # never a dead end
    logits = g.normal(0.0, 2.0, (r, gamma, v))
    proj, (a, b) = g.normal(0.0, 1.0, (r, gamma, rank)), g.normal(0.0, 1.0, (2, v, rank))
    anchor, u = g.integers(0, v, r), g.uniform(0.02, 0.98, (r, gamma))
    temps = [0.0, 1.0, 0.6, 1.5]
    if nan:
        a[anchor[0]] = np.nan
    f32 = lambda x: torch.tensor(np.asarray(x), dtype=torch.float32)      # noqa: E731
    cb = ConstraintBatch.build([TokenAutomaton(table)] * r, v, "cpu")
    x = cb.draft_logits(f32(logits))
    out = select(x, f32(proj), torch.tensor(anchor), f32(a), f32(b), SelectorParams(k),
                 SamplingBatch.build(temps, [0] * r, [1.0] * r), f32(u), mask=cb.walk())
    want = ref.select(ref.draft_logits(logits, table, [0] * r), proj, anchor, a, b, k, 1.0,
                      None, temps, [t == 0 for t in temps], u, table=table, state=[0] * r)
    assert out.candidates.tolist() == want["candidates"].tolist()
    assert out.bad_lattice.tolist() == want["bad_lattice"].tolist()
    assert bool(want["bad_lattice"][0]) == nan
    good = ~want["bad_lattice"]
    assert out.draft[good].tolist() == want["draft"][good].tolist()
    torch.testing.assert_close(out.q[good].double(), torch.from_numpy(want["q"][good]),
                               atol=1e-5, rtol=1e-4)
    if nan:
        return
    forbidden = 0                                        # candidates the path's state bans
    for i in range(r):
        st = 0
        for e in range(gamma):
            forbidden += int((table[st, want["candidates"][i, e]] < 0).sum())
            st = max(int(table[st, want["draft"][i, e]]), 0)
    assert forbidden >= r * gamma                        # the case masks plenty


class _Drawer:
    """A walk drawer that takes the candidate after the plain draw's and flags the rows it is
    told to, recording the law rows it was given."""

    def __init__(self, flag_rows: set[int]) -> None:
        self.flag_rows, self.laws, self.picks = flag_rows, [], []

    def pick(self, slot, law, cand, plain, greedy):
        self.laws.append(law.clone())
        k = law.shape[1]
        pos = torch.where(greedy, plain, (plain + 1) % k)
        self.picks.append(pos.clone())
        bad = torch.tensor([i in self.flag_rows and slot == 1 for i in range(law.shape[0])])
        return pos, bad


class _AllowAll:
    """A walk mask that forbids nothing (the constrained walk's path, no constraint)."""

    def allowed(self, slot, cand):
        return torch.ones_like(cand, dtype=torch.bool)

    def advance(self, token):
        pass


@DrawSource.register
class _Source:
    """A draw source (``ops.draws.DrawSource``'s shape) with the drawer above."""

    def __init__(self, u, flag_rows):
        from dflash2rt.ops.batch import BlockNoise

        self.noise = BlockNoise(walk=u, accept=u, residual=u, bonus=u[:, 0])
        self.drawer = _Drawer(flag_rows)

    def walker(self, has_fp64=None):
        return self.drawer


@pytest.mark.parametrize("constrained", [False, True])
def test_a_keyed_walk_takes_its_drawer_s_picks_and_flags_row_by_row(constrained):
    """With a draw source (the watermark's keyed walk), sampled rows take the drawer's
    position at every slot, q is the law row it was shown, and exactly the rows it flags are
    flagged; greedy rows keep their argmax walk."""
    logits, proj, anchor, a, b, u = _inputs(r=3, gamma=3, v=30, seed=11)
    params = SelectorParams(top_k=5)
    sampling = SamplingBatch.build([0.9, 0.0, 1.2], [0] * 3, [1.0] * 3)
    source = _Source(u, flag_rows={2})
    mask = _AllowAll() if constrained else None
    keyed = select(logits, proj, anchor, a, b, params, sampling, source, mask=mask)
    plain = select(logits, proj, anchor, a, b, params, sampling, u, mask=mask)
    assert keyed.bad_lattice.tolist() == [False, False, True]
    assert torch.equal(keyed.draft[1], plain.draft[1])                  # greedy: unchanged
    assert len(source.drawer.laws) == 3
    for i in (0, 2):
        prev = int(anchor[i])
        for e in range(3):
            cand = keyed.candidates[i, e]
            row = unary_scores(logits[i, e, cand], params) \
                + (a[prev] * proj[i, e] * b[cand]).sum(-1)
            law = torch.softmax(row / sampling.temperature[i], -1)
            torch.testing.assert_close(keyed.q[i, e], law)
            torch.testing.assert_close(source.drawer.laws[e][i], law)
            assert keyed.draft[i, e] == cand[source.drawer.picks[e][i]]   # the drawer's pick
            prev = int(keyed.draft[i, e])
    assert not torch.equal(keyed.draft[0], plain.draft[0])               # the drawer's picks
