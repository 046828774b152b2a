"""``kernels.verify`` (under the interpreter) against chain speculative sampling written anew as
float64 loops over plain Python lists: greedy rows take the longest prefix of drafts equal to
each row's first maximum, then that maximum; sampled rows accept d_j while u_j · q_j(d_j) <
p_j(d_j), then draw by inverse CDF from (p - q)+ at the first rejection (from p where that mass
is 0, from p_γ after a full block); -1 where the law's mass is not finite and positive. The
flags: ``bad_q`` for a sampled row whose q is NaN / inf / negative anywhere or gives a draft no
mass, ``bad`` for a row of logits whose maximum is not finite, or a sampled row with a law and
nothing drawn."""

from __future__ import annotations

import math

import pytest
import torch

from dflash2rt.errors import InvalidInputError, NonFiniteLogitsError
from dflash2rt.ops.batch import BlockNoise, SamplingBatch
from dflash2rt.plugin_kit import interpreting
from dflash2rt.watermark import WatermarkKey, values
from dflash2rt.watermark import generate as wmgen
from dflash2rt.watermark.sampler import WatermarkUnsupportedError

pytest.importorskip("triton", reason="triton is not installed (pip install 'dflash2rt[triton]')")
if not interpreting():
    pytest.skip("TRITON_INTERPRET is off in this process (a GPU is present, see conftest.py)",
                allow_module_level=True)
from dflash2rt.kernels import verify  # noqa: E402
from dflash2rt.kernels.tuning import Tuning  # noqa: E402

INF = math.inf
KEY = WatermarkKey(bytes(range(32)))


def first_max(row):
    best, at = -INF, 0
    for i, x in enumerate(row):
        if x > best:
            best, at = x, i
    return at


def draw(law, u):
    """Inverse CDF: the number of prefix sums <= u · total, capped at the last positive id;
    -1 where the total is not finite and positive."""
    total = math.fsum(law)
    if not 0.0 < total < INF:
        return -1
    target, cdf, count = u * total, 0.0, 0
    for w in law:
        cdf += w
        count += cdf <= target
    return min(count, max(i for i, w in enumerate(law) if w > 0))


def gumbel_min(law, e):
    """The keyed draw: the lowest id of the least E_i / w_i over w_i > 0; -1 unless every
    w is finite and non-negative and one is positive."""
    if not all(0.0 <= w < INF for w in law) or not any(w > 0 for w in law):
        return -1
    return min((e[i] / w, i) for i, w in enumerate(law) if w > 0)[1]


def ref_row(logits, p, draft, cand, q, greedy, ua, ur, ub, keyed=None):
    """One request: (accept length, tokens, bad, bad_q) from lists of floats / ints. ``keyed``
    (a watermarked row): slot → the E_i of that slot's context where it is fresh, else None."""
    gamma = len(draft)
    bad = any(not (all(x == x for x in row) and abs(max(row)) < INF) for row in logits)
    if greedy:
        acc = 0
        while acc < gamma and draft[acc] == first_max(logits[acc]):
            acc += 1
        emit, bad_q = first_max(logits[acc]), False
    else:
        q_d = [sum(qk for c, qk in zip(cand[j], q[j]) if c == draft[j]) for j in range(gamma)]
        bad_q = any(not (0.0 <= x < INF) for row in q for x in row) \
            or not all(x > 0 for x in q_d)
        acc = 0
        while acc < gamma and ua[acc] * q_d[acc] < p[acc][draft[acc]]:
            acc += 1
        mass = [0.0] * len(p[acc])
        if acc < gamma:
            for c, qk in zip(cand[acc], q[acc]):
                mass[c] += qk
        resid = [max(x - m, 0.0) if x == x else x for x, m in zip(p[acc], mass)]
        law = p[acc] if math.fsum(resid) <= 0 else resid
        emit = draw(law, ur[acc] if acc < gamma else ub)
        e = keyed(acc) if keyed else None
        if e is not None:
            emit = gumbel_min(law, e)
        bad = bad or (not bad_q and emit < 0)
    tokens = list(draft[:acc]) + [emit] + [-1] * (gamma - acc)
    return acc, tokens, bad, bad_q


def check(logits, draft, cand, q, sampling, noise, tuning=Tuning(), fp64=True, marks=None):
    """The kernel's outputs equal ``ref_row``'s for every request (T = 1 or greedy rows, no
    truncation: the sampled law is the float32 softmax). ``marks``: a watermarked batch, whose
    noise carries the keyed acceptance coins; E = -log of the keyed uniforms (subkey B)."""
    if marks is not None:
        noise = marks.noise(noise)
    got = verify.verify(logits, draft, cand, q, sampling, noise, False, tuning, marks=marks,
                        has_fp64=fp64)
    p = torch.softmax(logits, -1).double().tolist()
    ids = torch.arange(logits.shape[2])
    rows = []
    for r in range(logits.shape[0]):
        keyed = None
        if marks is not None:
            def keyed(s, r=r):
                if not marks.fresh[r, s]:
                    return None
                u = values.keyed_uniforms(marks.key.target, marks.ctx[r, s].view(1), ids)
                return values.neg_log(u).tolist()
        rows.append(ref_row(logits[r].double().tolist(), p[r], draft[r].tolist(),
                            cand[r].tolist(), q[r].double().tolist(), bool(sampling.greedy[r]),
                            noise.accept[r].double().tolist(), noise.residual[r].double().tolist(),
                            float(noise.bonus[r]), keyed))
    want_acc, want_tok, want_bad, want_bq = zip(*rows)
    assert got.accept_len.tolist() == list(want_acc)
    assert got.tokens.tolist() == list(want_tok)
    assert got.bad.tolist() == list(want_bad) and got.bad_q.tolist() == list(want_bq)
    return got


def _case(seed, r=6, gamma=3, v=75, k=4):
    """Random logits, distinct candidates, drafts among them, rows 0 / 1 greedy; row 2's drafts
    are the target's maxima (deep acceptance)."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(r, gamma + 1, v, generator=g) * 2
    cand = torch.stack([torch.randperm(v, generator=g)[:k] for _ in range(r * gamma)])
    cand = cand.view(r, gamma, k)
    q = torch.softmax(torch.randn(r, gamma, k, generator=g), -1)
    draft = cand[..., 0].clone()
    draft[1] = logits[1, :gamma].argmax(-1)
    draft[2] = logits[2, :gamma].argmax(-1)
    cand[2, :, 0] = draft[2]
    sampling = SamplingBatch.build([0.0, 0.0] + [1.0] * (r - 2), [0] * r, [1.0] * r)
    noise = BlockNoise.draw(torch.arange(r), torch.zeros(r, dtype=torch.long),
                            torch.full((r,), seed), gamma)
    return logits, draft, cand, q, sampling, noise


def _noise(accept, residual, bonus):
    accept = torch.tensor(accept, dtype=torch.float32)
    return BlockNoise(accept, accept, torch.tensor(residual, dtype=torch.float32),
                      torch.tensor(bonus, dtype=torch.float32))


FP64 = pytest.mark.parametrize("fp64", [True, False], ids=["fp64", "nofp64"])


@FP64
@pytest.mark.parametrize("seed, v, block_v", [(0, 75, 32), (1, 64, 32), (2, 75, 1024),
                                              (3, 9, 1024)])
def test_random_batches_equal_the_loops(seed, v, block_v, fp64):
    """Partial last chunks (75 = 2·32 + 11), whole chunks, one chunk (block_v capped at 128
    and at 16)."""
    check(*_case(seed, v=v, k=min(4, v)), Tuning(block_v=block_v), fp64)


@pytest.mark.parametrize("gamma", [1, 4])
def test_an_all_greedy_batch_equals_the_loops(gamma):
    logits, draft, cand, q, _, _ = _case(7, r=4, gamma=gamma)
    draft[0] = logits[0, :gamma].argmax(-1)                     # row 0: through to the bonus
    draft[3, -1] = logits[3, gamma - 1].argmax(-1)               # row 3: a late match only
    got = check(logits, draft, cand, q, SamplingBatch.greedy_batch(4),
                BlockNoise.unused(4, gamma, "cpu"), Tuning(block_v=32))
    assert got.accept_len[0] == gamma


@FP64
def test_a_zero_uniform_accepts_exactly_the_drafts_with_mass(fp64):
    """u = 0: 0 · q(d) < p(d) holds iff p(d) > 0 (strict), so row 0's draft with p = 0 is
    rejected at slot 0 and row 1 (every draft with mass) runs to the bonus."""
    g = torch.Generator().manual_seed(11)
    r, gamma, v = 2, 2, 8
    logits = torch.randn(r, gamma + 1, v, generator=g)
    cand = torch.tensor([[[3, 6], [1, 2]], [[0, 5], [4, 7]]])
    q = torch.tensor([[[0.5, 0.5], [0.25, 0.75]], [[0.5, 0.5], [0.5, 0.5]]])
    draft = cand[..., 0].clone()
    logits[0, 0, 3] = -INF
    noise = _noise([[0.0, 0.0], [0.0, 0.0]], [[0.4, 0.6], [0.3, 0.2]], [0.7, 0.9])
    sampling = SamplingBatch.build([1.0, 1.0], [0, 0], [1.0, 1.0])
    got = check(logits, draft, cand, q, sampling, noise, fp64=fp64)
    assert got.accept_len.tolist() == [0, 2]


@FP64
def test_the_closed_end_u_one_never_emits_a_token_without_mass(fp64):
    """u = 1: every prefix sum is ≤ u · total (exact float64 sums of float32 mass), so the
    draw is capped at the last token with mass, never a trailing token of p = 0: rows 0 / 1
    (mass below id 30), and laws whose only mass is id 0: the bonus (row 2), a residual (row
    3), p where q covers the residual (row 4)."""
    g = torch.Generator().manual_seed(12)
    r, gamma, v = 5, 2, 40
    logits = torch.randn(r, gamma + 1, v, generator=g)
    logits[..., 30:] = -INF
    logits[2, 2, 1:] = -INF
    logits[3:, 0, 1:] = -INF
    cand = torch.tensor([[[1, 2], [3, 4]], [[5, 6], [7, 8]], [[5, 6], [7, 8]], [[5, 6], [7, 8]],
                         [[5, 0], [7, 8]]])
    q = torch.full((r, gamma, 2), 0.5)
    q[4, 0, 1] = 1.0
    draft = cand[..., 0].clone()
    noise = _noise([[0.999, 0.5], [0.0, 0.0], [0.0, 0.0], [0.5, 0.5], [0.5, 0.5]],
                   [[1.0, 1.0]] * r, [1.0] * r)
    sampling = SamplingBatch.build([1.0] * r, [0] * r, [1.0] * r)
    got = check(logits, draft, cand, q, sampling, noise, Tuning(block_v=16), fp64)
    assert got.accept_len.tolist() == [0, 2, 2, 0, 0]
    assert got.tokens[0, 0] == 29 and got.tokens[1, 2] == 29
    assert got.tokens[2:].gather(1, got.accept_len[2:].view(-1, 1)).flatten().tolist() == [0] * 3


@FP64
def test_a_residual_covered_by_q_draws_from_p(fp64):
    """q ≥ p on every token: (p - q)+ has no mass, the rejected row draws from p."""
    g = torch.Generator().manual_seed(13)
    r, gamma, v = 2, 2, 6
    logits = torch.randn(r, gamma + 1, v, generator=g)
    cand = torch.arange(v).expand(r, gamma, v).contiguous()
    q = torch.ones(r, gamma, v)
    draft = torch.tensor([[2, 3], [4, 5]])
    noise = _noise([[0.99, 0.5], [0.999, 0.5]], [[0.3, 0.1], [0.8, 0.1]], [0.5, 0.5])
    sampling = SamplingBatch.build([1.0, 1.0], [0, 0], [1.0, 1.0])
    got = check(logits, draft, cand, q, sampling, noise, fp64=fp64)
    assert got.accept_len.tolist() == [0, 0]


@FP64
def test_the_bonus_draws_from_p_not_the_last_slots_residual(fp64):
    """Fully accepted blocks whose last slot's candidates are the bonus row's three likeliest
    tokens, with q = 1 on them: the bonus is drawn from p_γ, where those tokens keep their
    mass (no q applies to row γ)."""
    g = torch.Generator().manual_seed(21)
    r, gamma, v, k = 6, 2, 40, 4
    logits = torch.randn(r, gamma + 1, v, generator=g) * 3
    top = logits[:, gamma].topk(3, -1).indices
    cand = torch.stack([torch.randperm(v, generator=g)[:k] for _ in range(r * gamma)])
    cand = cand.view(r, gamma, k)
    cand[:, gamma - 1, :3] = top                                 # the last draft: top[:, 0]
    draft = cand[..., 0].clone()
    q = torch.full((r, gamma, k), 0.25)
    q[:, gamma - 1, :3] = 1.0
    noise = BlockNoise.draw(torch.arange(r), torch.zeros(r, dtype=torch.long),
                            torch.full((r,), 6), gamma)
    noise.accept.zero_()
    sampling = SamplingBatch.build([1.0] * r, [0] * r, [1.0] * r)
    got = check(logits, draft, cand, q, sampling, noise, Tuning(block_v=16), fp64)
    assert got.accept_len.tolist() == [gamma] * r
    assert sum(int(t) in top[i].tolist() for i, t in enumerate(got.tokens[:, gamma])) >= 3


@FP64
def test_q_flags_every_broken_slot_of_a_sampled_row(fp64):
    """bad_q: a negative q on another candidate (row 1), +inf (row 2), NaN at a slot after
    the rejection (row 3), a draft outside its candidates (row 4), -inf on another candidate
    of the rejected slot (row 6, float64: a residual of +inf, nothing drawn; the float32
    formulation draws there, from a row it flags all the same); row 0 a law, row 5 greedy with
    a broken q (not read)."""
    g = torch.Generator().manual_seed(14)
    r, gamma, v, k = 7, 3, 20, 3
    logits = torch.randn(r, gamma + 1, v, generator=g)
    cand = torch.stack([torch.randperm(v, generator=g)[:k] for _ in range(r * gamma)])
    cand = cand.view(r, gamma, k)
    q = torch.full((r, gamma, k), 0.25)
    draft = cand[..., 0].clone()
    q[1, 1, 2] = -0.25
    q[2, 0, 1] = INF
    q[3, 2, 0] = float("nan")
    draft[4, 1] = next(i for i in range(v) if i not in cand[4, 1].tolist())
    q[5, 0, 0] = -1.0
    q[6, 0, 1] = -INF if fp64 else -1.0
    noise = _noise([[0.9, 0.5, 0.5]] * r, [[0.5] * 3] * r, [0.5] * r)
    sampling = SamplingBatch.build([1.0] * 5 + [0.0, 1.0], [0] * r, [1.0] * r)
    got = check(logits, draft, cand, q, sampling, noise, fp64=fp64)
    assert got.bad_q.tolist() == [False, True, True, True, True, False, True]
    assert got.accept_len[6] == 0 and (got.tokens[6, 0] == -1) == fp64


@FP64
def test_rows_of_logits_that_are_not_finite_flag_the_request(fp64):
    """bad: +inf in a greedy row (row 0), NaN in a greedy row past its mismatch (row 1), a
    greedy row of -inf only (row 2: its maximum is id 0), NaN in a sampled row's first slot (row 3:
    rejected, nothing drawn), a sampled bonus row of -inf only (row 4); row 5 finite."""
    g = torch.Generator().manual_seed(15)
    r, gamma, v = 6, 2, 12
    logits = torch.randn(r, gamma + 1, v, generator=g)
    cand = torch.stack([torch.randperm(v, generator=g)[:2] for _ in range(r * gamma)])
    cand = cand.view(r, gamma, 2)
    q = torch.full((r, gamma, 2), 0.5)
    draft = cand[..., 0].clone()
    logits[0, 1, 4] = INF
    logits[1, 2, 7] = float("nan")
    logits[2, 0] = -INF
    draft[2, 0] = 0
    logits[3, 0, 5] = float("nan")
    logits[4, 2] = -INF
    draft[4] = logits[4, :gamma].argmax(-1)
    cand[4, :, 0] = draft[4]
    noise = _noise([[0.5, 0.5]] * 3 + [[0.5, 0.5], [0.0, 0.0], [0.5, 0.5]], [[0.5] * 2] * r,
                   [0.5] * r)
    sampling = SamplingBatch.build([0.0] * 3 + [1.0] * 3, [0] * r, [1.0] * r)
    got = check(logits, draft, cand, q, sampling, noise, fp64=fp64)
    assert got.bad.tolist() == [True] * 5 + [False]
    assert got.accept_len[4] == gamma and got.tokens[3, 0] == -1


def _marked(draft, seed):
    """A watermarked batch (window 2, nothing recorded) and its marks for these drafts."""
    wm = wmgen.WatermarkBatch.build(KEY, [(seed, i + 1) for i in range(draft.shape[0])], 16, 2,
                                    "cpu")
    return wm.marks(draft)


def rejected_covering(seed, r, gamma, slot, v=40, k=4):
    """Random logits (× 3), candidates and q = 1/4 of R rows, where ``slot``'s draft
    (candidate 0) has p = 0 and its other three candidates, p's three likeliest tokens there
    (``top`` [R, 3]), have q = 1 ≥ p: (logits, top, cand, q)."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(r, gamma + 1, v, generator=g) * 3
    top = logits[:, slot].topk(3, -1).indices                   # [R, 3]
    cand = torch.stack([torch.randperm(v, generator=g)[:k] for _ in range(r * gamma)])
    cand = cand.view(r, gamma, k)
    for i in range(r):
        others = [t for t in range(v) if t not in top[i].tolist()]
        cand[i, slot] = torch.tensor([others[i]] + top[i].tolist())
        logits[i, slot, others[i]] = -INF                       # p(d) = 0: rejected
    q = torch.full((r, gamma, k), 0.25)
    q[:, slot, 1:] = 1.0
    return logits, top, cand, q


def test_keyed_residual_without_the_mass_q_covers():
    """Rows rejected at slot 0 (p(d) = 0) whose q covers p's three likeliest tokens (q ≥ p
    there): the keyed draw is over (p - q)+, which gives those tokens no mass, not over p."""
    r, gamma = 6, 2
    logits, top, cand, q = rejected_covering(16, r, gamma, slot=0)
    draft = cand[..., 0].clone()
    sampling = SamplingBatch.build([1.0] * r, [0] * r, [1.0] * r)
    noise = BlockNoise.draw(torch.arange(r), torch.zeros(r, dtype=torch.long),
                            torch.full((r,), 3), gamma)
    marks = _marked(draft, 16)
    assert bool(marks.fresh[:, 0].all())
    got = check(logits, draft, cand, q, sampling, noise, Tuning(block_v=16), marks=marks)
    assert got.accept_len.tolist() == [0] * r
    emitted = got.tokens[:, 0]
    assert not any(int(t) in top[i].tolist() for i, t in enumerate(emitted))


def test_keyed_draw_of_a_residual_that_is_not_a_law_is_empty():
    """A NaN q (row 0) or a q of -inf (row 1: a residual of +inf) on another candidate of the
    rejected slot: the residual is not a law, nothing is drawn (-1; flagged by bad_q), though
    p is one. Row 2: the same slot with a finite q draws."""
    g = torch.Generator().manual_seed(17)
    r, gamma, v, k = 3, 2, 24, 3
    logits = torch.randn(r, gamma + 1, v, generator=g)
    cand = torch.tensor([[0, 1, 2], [3, 4, 5]]).expand(r, gamma, k).contiguous()
    logits[:, 0, 0] = -INF                                      # p(d) = 0: rejected at slot 0
    q = torch.full((r, gamma, k), 0.25)
    q[0, 0, 1] = float("nan")
    q[1, 0, 2] = -INF
    draft = cand[..., 0].clone()
    sampling = SamplingBatch.build([1.0] * r, [0] * r, [1.0] * r)
    noise = BlockNoise.draw(torch.arange(r), torch.zeros(r, dtype=torch.long),
                            torch.full((r,), 4), gamma)
    marks = _marked(draft, 17)
    assert bool(marks.fresh[:, 0].all())
    got = check(logits, draft, cand, q, sampling, noise, Tuning(block_v=16), marks=marks)
    assert got.tokens[:, 0].tolist()[:2] == [-1, -1] and got.tokens[2, 0] >= 0
    assert got.bad_q.tolist() == [True, True, False] and got.bad.tolist() == [False] * 3


def test_verify_checks_its_outputs_unless_told_not_to():
    """By default a request whose logits are not a law raises NonFiniteLogitsError naming it,
    and a q that gives a draft no mass raises InvalidInputError; check=False returns flags."""
    logits, draft, cand, q, sampling, noise = _case(18, r=3, v=20)
    nan = logits.clone()
    nan[1, 0, 3] = float("nan")
    with pytest.raises(NonFiniteLogitsError, match=r"request\(s\) \[1\]"):
        verify.verify(nan, draft, cand, q, sampling, noise)
    zero = q.clone()
    zero[2, 1] = 0.0
    with pytest.raises(InvalidInputError, match=r"request\(s\) \[2\]: a draft token has q = 0"):
        verify.verify(logits, draft, cand, zero, sampling, noise)
    assert verify.verify(nan, draft, cand, q, sampling, noise, check=False).bad.tolist() == \
        [False, True, False]


def test_marks_of_another_shape_and_marks_without_fp64_are_refused():
    logits, draft, cand, q, sampling, noise = _case(19, r=3, v=20)
    marks = _marked(draft, 19)
    short = wmgen.Marks(marks.key, marks.ctx[:, :-1], marks.fresh[:, :-1])
    with pytest.raises(InvalidInputError, match=r"marks.ctx \(3, 3\) must be \[R, γ\+1\] = "
                                                r"\(3, 4\)"):
        verify.verify(logits, draft, cand, q, sampling, noise, check=False, marks=short)
    with pytest.raises(WatermarkUnsupportedError, match="no float64"):
        verify.verify(logits, draft, cand, q, sampling, noise, check=False, marks=marks,
                      has_fp64=False)


def test_keyed_draw_of_a_law_on_the_first_token_alone():
    """Laws whose only mass is id 0: the bonus of a fully accepted block (row 0: each slot's
    law is its draft alone) and the residual of a rejected slot (row 1: p(d) = 0)."""
    r, gamma, v = 2, 2, 40
    logits = torch.full((r, gamma + 1, v), -INF)
    logits[:, :, 0] = 0.0
    draft = torch.tensor([[7, 9], [5, 5]])
    logits[0, 0, 7], logits[0, 1, 9] = 0.0, 0.0
    logits[0, :gamma, 0] = -INF
    cand = torch.stack([draft, draft + 1, draft + 2], -1)
    q = torch.full((r, gamma, 3), 0.25)
    sampling = SamplingBatch.build([1.0] * r, [0] * r, [1.0] * r)
    noise = BlockNoise.draw(torch.arange(r), torch.zeros(r, dtype=torch.long),
                            torch.full((r,), 5), gamma)
    marks = _marked(draft, 20)
    assert bool(marks.fresh[0, gamma]) and bool(marks.fresh[1, 0])
    got = check(logits, draft, cand, q, sampling, noise, Tuning(block_v=16), marks=marks)
    assert got.tokens.tolist() == [[7, 9, 0], [0, -1, -1]]


def test_keyed_draw_ties_go_to_the_lowest_id_across_chunks():
    """After the window (41580, 7) ids 6 and 20 get the same keyed uniform (asserted); with
    p = 1/2 on each their keys E / p tie exactly, in the same lane of chunks 3 and 10 (block 2):
    the lowest id, 6, is drawn."""
    v = 32
    wm = wmgen.WatermarkBatch.build(KEY, [(41580, 7)], 16, 2, "cpu")
    draft = torch.tensor([[3]])
    marks = wm.marks(draft)
    u = values.keyed_uniforms(KEY.target, marks.ctx[0, 0].view(1), torch.tensor([6, 20]))
    assert u[0] == u[1] and bool(marks.fresh[0, 0])
    logits = torch.full((1, 2, v), -INF)
    logits[0, :, 6], logits[0, :, 20] = 0.0, 0.0                 # p(d) = 0: rejected
    cand = torch.tensor([[[3, 4, 5]]])
    q = torch.full((1, 1, 3), 0.25)
    sampling = SamplingBatch.build([1.0], [0], [1.0])
    noise = BlockNoise.draw(torch.tensor([1]), torch.tensor([0]), torch.tensor([0]), 1)
    got = check(logits, draft, cand, q, sampling, noise, Tuning(block_v=2), marks=marks)
    assert got.tokens.tolist() == [[6, -1]]
