"""``kernels.selector`` (under the interpreter) against the walk written anew as float64 loops
over plain Python lists: the top-K candidates (lowest id on ties), the unary scores
softcap(val · multiplier), the lattice row of the previous pick, a row that is not a finite
law (any NaN / +inf, or no finite entry) flagged and walked as a row of zeros, greedy argmax
(lowest position on ties) and the sampled inverse CDF (the count of prefix sums <= u · total,
capped at the last positive entry: in float64, or without float64 as exact rationals where
the double-float sums are exact); in a watermarked batch a sampled row's slot whose context
(the last H tokens of window ++ path) is neither recorded nor an earlier slot's takes the
least E_i / q_i, E_i = -log of the keyed uniform under subkey A (``watermark.values``), and
a watermark is refused without float64."""

from __future__ import annotations

import math

import pytest
import torch

from dflash2rt.ops.batch import SamplingBatch
from dflash2rt.ops.selector import SelectorParams
from dflash2rt.plugin_kit import interpreting
from dflash2rt.watermark import WatermarkKey, values
from dflash2rt.watermark import generate as wmgen

pytest.importorskip("triton", reason="triton is not installed (pip install 'dflash2rt[triton]')")
if not interpreting():
    pytest.skip("TRITON_INTERPRET is off in this process (a GPU is present, see conftest.py)",
                allow_module_level=True)
from dflash2rt.kernels import selector  # noqa: E402
from test_exact32_sweep import _rational_index as exact_inverse_cdf  # noqa: E402
from test_verify_kernel_sweep import draw as inverse_cdf, first_max  # noqa: E402

INF = math.inf


def candidates(logits, k):
    return sorted(range(len(logits)), key=lambda i: (-logits[i], i))[:k]


def unary(val, mult, cap):
    if val == -INF:
        return -INF
    x = val * mult
    return cap * math.tanh(x / cap) if cap is not None else x


def softmax(row, temp):
    top = max(row)
    ex = [math.exp((x - top) / temp) for x in row]
    s = math.fsum(ex)
    return [x / s for x in ex]


def keyed_pick(key, ctx, cand, law):
    """The least E_i / w_i over w_i > 0 (lowest id, then position on ties); -1 without a law."""
    if not all(0.0 <= w < INF for w in law) or not any(w > 0 for w in law):
        return -1
    u = values.keyed_uniforms(key.draft, torch.tensor([ctx] * len(cand)), torch.tensor(cand))
    e = values.neg_log(u).tolist()
    return min((e[i] / w, cand[i], i) for i, w in enumerate(law) if w > 0)[2]


def ref_walk(logits, proj, anchor, a, b, k, temps, u, mult=1.0, cap=None, wm=None):
    """Per request: (drafts, q rows, bad lattice, the keyed pick of each slot of a sampled
    row, fresh or not) from tensors, in float64 Python floats."""
    logits, proj, a, b, u = (t.double().tolist() for t in (logits, proj, a, b, u))
    out = []
    for r, temp in enumerate(temps):
        prev, bad, path, ctxs, drafts, qs, keyed = int(anchor[r]), False, [], [], [], [], []
        for e in range(len(logits[r])):
            cand = candidates(logits[r][e], k)
            row = [unary(logits[r][e][c], mult, cap)
                   + math.fsum(a[prev][j] * proj[r][e][j] * b[c][j] for j in range(len(a[0])))
                   for c in cand]
            row_bad = any(x != x or x == INF for x in row) or not any(abs(x) < INF for x in row)
            bad |= row_bad
            if row_bad:
                row = [0.0] * k
            if temp == 0.0:
                pos, q = first_max(row), [float(i == first_max(row)) for i in range(k)]
            else:
                q = softmax(row, temp)
                pos = inverse_cdf(q, u[r][e])
                if wm is not None:
                    win = (wm.window[r].tolist() + path)[-wm.width:]
                    ctx = int(values.context_hash(torch.tensor([win]))[0])
                    recorded = ctx in wm.record[r, :int(wm.used[r])].tolist()
                    drawn = keyed_pick(wm.key, ctx, cand, [INF] if row_bad else q)
                    keyed.append(drawn)
                    if not recorded and ctx not in ctxs:
                        pos, bad = max(drawn, 0), bad or drawn < 0
                    ctxs.append(ctx)
            prev = cand[pos]
            drafts.append(prev)
            path.append(prev)
            qs.append(q)
        out.append((drafts, qs, bad, keyed))
    return out


def _inputs(seed, r, gamma, v, rank=3):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(r, gamma, v, generator=g), torch.randn(r, gamma, rank, generator=g),
            torch.randint(0, v, (r,), generator=g), torch.randn(v, rank, generator=g),
            torch.randn(v, rank, generator=g), torch.rand(r, gamma, generator=g))


def _check(got, want):
    """Drafts and flags exactly, q to float32 rounding."""
    assert got.bad_lattice.tolist() == [w[2] for w in want]
    for i, (drafts, qs, _, _) in enumerate(want):
        assert got.draft[i].tolist() == drafts, (i, got.draft[i].tolist(), drafts)
        torch.testing.assert_close(got.q[i].double(), torch.tensor(qs, dtype=torch.float64),
                                   rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("fp64", [True, False], ids=["fp64", "nofp64"])
@pytest.mark.parametrize("poison", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_one_bad_entry_beside_finite_ones_flags_the_row_and_walks_zeros(poison, fp64):
    """A successor codebook row holding NaN / +inf in one rank column: the lattice row of
    every slot where that token is a candidate has one bad entry and finite others. The rows
    that read it are flagged (greedy and sampled alike) and walk a row of zeros there
    (greedy: position 0; sampled: the uniform law's inverse CDF)."""
    r, gamma, v, k = 4, 3, 12, 4
    logits, proj, anchor, a, b, u = _inputs(5, r, gamma, v)
    t = 6
    logits[0, 1, t] = logits[2, 0, t] = 40.0         # t a candidate of row 0 slot 1, row 2 slot 0
    logits[1, :, t] = logits[3, :, t] = -40.0        # and never one of rows 1 and 3
    logits[0, 0, t] = logits[0, 2, t] = logits[2, 1:, t] = -40.0
    b[t, 1] = poison
    proj[:, :, 1] = proj[:, :, 1].abs() + 0.5        # the poisoned column is read with weight
    a[:, 1] = a[:, 1].abs() + 0.5                    # ≠ 0 (NaN either way; inf keeps its sign)
    temps = [0.0, 0.0, 0.9, 1.3]
    sampling = SamplingBatch.build(temps, [0] * r, [1.0] * r)
    got = selector.select(logits, proj, anchor, a, b, SelectorParams(k), sampling, u,
                          has_fp64=fp64)
    want = ref_walk(logits, proj, anchor, a, b, k, temps, u)
    assert [w[2] for w in want] == [True, False, True, False]
    _check(got, want)


@pytest.mark.parametrize("mult,cap", [(1.0, None), (0.5, 3.0), (-1.5, None)])
def test_greedy_and_sampled_walks_equal_the_float64_loops(mult, cap):
    r, gamma, v, k = 4, 4, 30, 5
    logits, proj, anchor, a, b, u = _inputs(11, r, gamma, v)
    temps = [0.0, 0.8, 1.0, 1.7]
    sampling = SamplingBatch.build(temps, [0] * r, [1.0] * r)
    for fp64 in (True, False):
        got = selector.select(logits, proj, anchor, a, b, SelectorParams(k, mult, cap),
                              sampling, u, has_fp64=fp64)
        _check(got, ref_walk(logits, proj, anchor, a, b, k, temps, u, mult, cap))


def test_a_context_both_recorded_and_an_earlier_slot_s_is_not_fresh():
    """Rows whose prompt ends in four copies of t and whose slot 0 takes t: slot 1's context
    is slot 0's, and it is recorded once as well. Neither slot is fresh: both take the inverse
    CDF pick, as in the loops, and not the keyed one."""
    r, gamma, v, k, h = 6, 3, 20, 6, 4
    logits, proj, anchor, a, b, u = _inputs(3, r, gamma, v)
    logits = logits * 0.3
    a, b = a * 0.2, b * 0.2
    prompts = [(t,) * h for t in range(2, 2 + r)]
    for i, p in enumerate(prompts):
        logits[i, 0, p[0]] = 60.0                    # slot 0 takes t: window t t t t again
    anchor = torch.tensor([p[-1] for p in prompts])
    key = WatermarkKey(bytes(range(5, 37)))
    wm = wmgen.WatermarkBatch.build(key, prompts, 8, h, "cpu")
    wm.record[:, 0] = values.context_hash(wm.window)
    wm.used[:] = 1
    temps = [1.0] * r
    got = selector.select(logits, proj, anchor, a, b, SelectorParams(k),
                          SamplingBatch.build(temps, [0] * r, [1.0] * r), u, wm=wm)
    want = ref_walk(logits, proj, anchor, a, b, k, temps, u, wm=wm)
    assert [w[0][0] for w in want] == [p[0] for p in prompts]
    _check(got, want)
    cands = [candidates(row, k) for row in logits[:, 1].tolist()]
    assert any(w[0][1] != c[w[3][1]] for w, c in zip(want, cands))   # the keyed pick differs


@pytest.mark.parametrize("k", [3, 33])
def test_the_draw_is_float64_with_float64_and_exact_without(k):
    """A law (t, 1/2, 1/2, 0, ...) with t ≈ 2^-62 and u = 1/2: in float64 the prefix sum
    t + 1/2 rounds to 1/2 = u · total, so the float64 walk takes position 2; the float32
    formulation (double-float sums, exact to far below t for K ≤ 64) keeps t and takes
    position 1, the exact rational's pick. Each mode draws as its own formulation from the q
    it returns. K = 33: the candidates past the third score -inf (their weights are 0)."""
    v = max(k, 3)
    logits = torch.full((1, 1, v), -INF)
    logits[0, 0, :3] = torch.tensor([10.0, 9.0, 8.0])
    succ = torch.zeros(v, 1)
    succ[:3, 0] = torch.tensor([-61 * math.log(2.0) - 10.0, -9.0, -8.0])   # (-61 ln 2, 0, 0)
    args = (logits, torch.ones(1, 1, 1), torch.tensor([0]), torch.ones(v, 1), succ,
            SelectorParams(k), SamplingBatch.build([1.0], [0], [1.0]), torch.tensor([[0.5]]))
    fp64 = selector.select(*args, has_fp64=True)
    nofp64 = selector.select(*args, has_fp64=False)
    law = fp64.q[0, 0].tolist()
    assert nofp64.q[0, 0].tolist() == law and 2.0 ** -63 < law[0] < 2.0 ** -61
    assert law[1:3] == [0.5, 0.5] and not any(law[3:])
    assert inverse_cdf(law, 0.5) == 2 and exact_inverse_cdf(law, 0.5) == 1
    assert fp64.draft.tolist() == [[2]] and nofp64.draft.tolist() == [[1]]


@pytest.mark.parametrize("fp64", [True, False], ids=["fp64", "nofp64"])
def test_a_uniform_on_a_breakpoint_counts_it_and_u_one_takes_the_last_positive(fp64):
    """Four equal scores (q = 1/4 each): u = 1/4, 1/2, 3/4 sit exactly on the prefix sums,
    which count (≤): positions 1, 2, 3. u = 1 counts every prefix sum and is capped at the
    last positive weight: position 2 where only three candidates are finite, position 0
    where only one is."""
    v, k = 6, 4
    logits = torch.zeros(5, 1, v)
    logits[3, 0, 3:] = -INF
    logits[4, 0, 1:] = -INF
    u = torch.tensor([[0.25], [0.5], [0.75], [1.0], [1.0]])
    args = (logits, torch.ones(5, 1, 1), torch.zeros(5, dtype=torch.long), torch.ones(v, 1),
            torch.zeros(v, 1), SelectorParams(k), SamplingBatch.build([1.0] * 5, [0] * 5,
                                                                      [1.0] * 5), u)
    got = selector.select(*args, has_fp64=fp64)
    assert got.draft.tolist() == [[1], [2], [3], [2], [0]]
    assert got.bad_lattice.tolist() == [False] * 5


@pytest.mark.parametrize("fp64", [True, False], ids=["fp64", "nofp64"])
def test_a_slot_without_a_finite_score_is_flagged_and_one_finite_score_is_a_law(fp64):
    """Rows 0, 1 (greedy, sampled): every logit of slot 1 is -inf, so its lattice row has no
    finite entry: flagged, walked as zeros. Rows 2, 3: slot 1 has one finite logit, the other
    candidates -inf: a law (q one-hot on it), not flagged. Row 4 (greedy): slot 0's top two
    logits tie, the lower id (position 0) wins."""
    r, gamma, v, k = 5, 3, 10, 4
    logits, proj, anchor, a, b, u = _inputs(8, r, gamma, v)
    logits[:2, 1] = -INF
    logits[2:4, 1] = -INF
    logits[2, 1, 7] = logits[3, 1, 5] = 1.5
    b[:] = 0.0
    logits[4, 0, [2, 6]] = logits[4, 0].max() + 1.0
    temps = [0.0, 1.1, 0.0, 0.7, 0.0]
    sampling = SamplingBatch.build(temps, [0] * r, [1.0] * r)
    got = selector.select(logits, proj, anchor, a, b, SelectorParams(k), sampling, u,
                          has_fp64=fp64)
    want = ref_walk(logits, proj, anchor, a, b, k, temps, u)
    assert [w[2] for w in want] == [True, True, False, False, False]
    assert got.draft[2, 1] == 7 and got.draft[3, 1] == 5 and got.draft[4, 0] == 2
    _check(got, want)


@pytest.mark.parametrize("fp64", [True, False], ids=["fp64", "nofp64"])
def test_large_scores_walk_their_differences(fp64):
    """Scores near 1e6 that differ by a few units: q is the softmax of the differences
    (row - max row, exact in float32), not of anything rounded at the scores' magnitude."""
    r, gamma, v, k = 2, 2, 8, 3
    logits, proj, anchor, a, b, u = _inputs(4, r, gamma, v)
    logits[:] = -50.0
    logits[:, :, 3], logits[:, :, 1], logits[:, :, 6] = 1e6, 1e6 - 3.3, 1e6 - 1.7
    b[:] = 0.0
    temps = [1.0, 0.6]
    got = selector.select(logits, proj, anchor, a, b, SelectorParams(k),
                          SamplingBatch.build(temps, [0] * r, [1.0] * r), u, has_fp64=fp64)
    _check(got, ref_walk(logits, proj, anchor, a, b, k, temps, u))


def test_a_watermark_without_float64_is_refused():
    from dflash2rt.watermark.sampler import WatermarkUnsupportedError

    logits, proj, anchor, a, b, u = _inputs(1, 2, 2, 10)
    wm = wmgen.WatermarkBatch.build(WatermarkKey(bytes(32)), [(1,), (2,)], 8, 4, "cpu")
    with pytest.raises(WatermarkUnsupportedError, match="float64"):
        selector.select(logits, proj, anchor, a, b, SelectorParams(3),
                        SamplingBatch.build([1.0, 0.0], [0, 0], [1.0, 1.0]), u, wm=wm,
                        has_fp64=False)


def test_record_entries_past_used_are_not_read():
    """The record holds slot 0's context right after its ``used`` entries (a stale entry):
    slot 0 is fresh and takes the keyed pick, as in the loops; counted as used it would not,
    and the drafts would differ."""
    r, gamma, v, k, h = 6, 2, 20, 6, 4
    logits, proj, anchor, a, b, u = _inputs(13, r, gamma, v)
    logits, a, b = logits * 0.3, a * 0.2, b * 0.2
    prompts = [(i, i + 1, i + 2) for i in range(r)]
    key = WatermarkKey(bytes(range(9, 41)))

    def batch(used):
        wm = wmgen.WatermarkBatch.build(key, prompts, 4, h, "cpu")
        wm.record[:, 0] = 12345
        wm.record[:, 1] = values.context_hash(wm.window)
        wm.used[:] = used
        return wm

    temps = [1.0] * r
    sampling = SamplingBatch.build(temps, [0] * r, [1.0] * r)
    got = selector.select(logits, proj, anchor, a, b, SelectorParams(k), sampling, u,
                          wm=batch(1))
    want = ref_walk(logits, proj, anchor, a, b, k, temps, u, wm=batch(1))
    _check(got, want)
    recorded = ref_walk(logits, proj, anchor, a, b, k, temps, u, wm=batch(2))
    assert [w[0] for w in want] != [w[0] for w in recorded]


def test_a_keyed_draw_from_a_bad_row_is_flagged():
    """A watermarked batch whose sampled rows read a lattice row with one NaN at a fresh
    slot: the keyed draw has no law (pick 0) and the row is flagged."""
    r, gamma, v, k, h = 4, 2, 12, 4, 4
    logits, proj, anchor, a, b, u = _inputs(21, r, gamma, v)
    t = 9
    logits[:, 0, t] = 40.0                            # t a candidate of every row's slot 0
    b[t, 0] = float("nan")
    wm = wmgen.WatermarkBatch.build(WatermarkKey(bytes(range(3, 35))),
                                    [(i, 2 * i + 1) for i in range(r)], 4, h, "cpu")
    temps = [1.0, 0.0, 0.8, 1.2]
    got = selector.select(logits, proj, anchor, a, b, SelectorParams(k),
                          SamplingBatch.build(temps, [0] * r, [1.0] * r), u, wm=wm)
    want = ref_walk(logits, proj, anchor, a, b, k, temps, u, wm=wm)
    assert [w[2] for w in want] == [True] * r and [w[3][0] for w in want if w[3]] == [-1] * 3
    _check(got, want)
