"""``train.calibration``: the re-shaped draft laws against their definitions written by hand
(hand-made rows, ties, cuts at the edge), and ``law_acceptance`` on a tiny float64 pair against
a float64 loop over every anchor (the draft's top-K candidates, the lattice row after the true
previous token, the target's law after temperature and top-p)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from dflash2rt.ops.sampling import scale
from dflash2rt.train import calibration
from test_evaluate_sweep import _law, forced_anchors

from tiny_models import tiny_pair


pytestmark = pytest.mark.usefixtures("one_thread")   # tests/conftest.py


def _softmax(xs):
    top = max(xs)
    e = [math.exp(x - top) for x in xs]
    return [x / sum(e) for x in e]


# ---------------------------------------------------------------- shaped_law

@pytest.mark.parametrize("beta", [0.5, 1.0, 1.7])
@pytest.mark.parametrize("temperature", [0.3, 1.0, 2.0])
def test_scale_is_softmax_of_beta_row_over_t(beta, temperature):
    rows = torch.tensor([[2.0, -1.0, 0.5, 3.0], [0.0, 0.0, -4.0, 1.0]])
    got = calibration.shaped_law(rows, temperature, ("scale", beta))
    for r, row in enumerate(rows.tolist()):
        want = _softmax([beta * x / temperature for x in row])
        assert got[r].tolist() == pytest.approx(want, rel=1e-6, abs=1e-7)


def test_scale_one_is_the_engines_law_bit_for_bit():
    rows = torch.randn(3, 5, 16, generator=torch.Generator().manual_seed(1)) * 4
    for t in (0.7, 1.0):
        want = torch.softmax(scale(rows, torch.tensor(t)), dim=-1)
        assert torch.equal(calibration.shaped_law(rows, t, ("scale", 1.0)), want)


def _nucleus(row, temperature, top):
    """The nucleus cut is top-p's rule: ``_law`` (test_evaluate_sweep) at p = top."""
    return _law(row, temperature, top)


@pytest.mark.parametrize("top", [0.1, 0.5, 0.8, 0.95, 1.0, 2.0])
def test_nucleus_keeps_the_prefix_whose_mass_ahead_is_below_p(top):
    rows = torch.tensor([[2.0, -1.0, 0.5, 3.0, 1.0], [0.0, 1.0, -4.0, 1.5, -2.0]])
    got = calibration.shaped_law(rows, 1.0, ("nucleus", top))
    for r, row in enumerate(rows.tolist()):
        assert got[r].tolist() == pytest.approx(_nucleus(row, 1.0, top), rel=1e-6, abs=1e-7)


def test_nucleus_cut_exactly_at_a_breakpoint_and_ties_to_the_lower_index():
    # law (1/2, 1/4, 1/4) by logits ln 2 : 0 : 0. Mass ahead of the second and third: 1/2, 3/4.
    rows = torch.tensor([[0.0, math.log(2.0), 0.0]])
    q = calibration.shaped_law(rows, 1.0, ("nucleus", 0.5))     # 1/2 ahead is not below 1/2
    assert q.tolist() == [[0.0, 1.0, 0.0]]
    q = calibration.shaped_law(rows, 1.0, ("nucleus", 0.6))     # the tie: index 0 before 2
    assert q[0].tolist() == pytest.approx([1 / 3, 2 / 3, 0.0])
    q = calibration.shaped_law(rows, 1.0, ("nucleus", 0.76))
    assert q[0].tolist() == pytest.approx([0.25, 0.5, 0.25])


@pytest.mark.parametrize("shape, msg", [(("top_k", 0.5), "choose from scale, nucleus"),
                                        (("scale", 0.0), "needs a value > 0"),
                                        (("nucleus", -1.0), "needs a value > 0")])
def test_bad_shapes_are_refused(shape, msg):
    with pytest.raises(ValueError, match=msg):
        calibration.shaped_law(torch.zeros(1, 3), 1.0, shape)


# ---------------------------------------------------------------- law_acceptance

@pytest.fixture(scope="module")
def pair():
    pair = tiny_pair("dflash2", block=4, seed=5)
    pair.draft.cfg = dataclasses.replace(pair.draft.cfg, selector_top_k=20)
    return pair


# prompt 1 has no anchor (n - γ <= its length)
OUTS = ([5, 6, 7], [8, 9, 10, 11, 12, 13]), ([1, 2, 3, 4], [14, 15]), ([9, 10], [21, 22, 23, 24])
SHAPES = [("scale", 1.0), ("scale", 0.6), ("nucleus", 0.7)]


def _row(pair, h, dl, cand, prev):
    """The lattice row by hand: unary (softcapped) + Σ_r A[prev, r] · (W h)_r · B[cand, r]."""
    cfg, sel = pair.draft.cfg, pair.draft.candidate_selector
    proj = (sel.hidden_projection.weight.double() @ h.double()).tolist()
    a = sel.predecessor_codebook[prev].double().tolist()
    row = []
    for c in cand:
        u = dl[c] * cfg.output_multiplier
        if cfg.final_logit_softcapping is not None:
            u = cfg.final_logit_softcapping * math.tanh(u / cfg.final_logit_softcapping)
        b = sel.successor_codebook[c].double().tolist()
        row.append(u + sum(x * y * z for x, y, z in zip(a, proj, b)))
    return row


def _reference(pair, temperature, top_p, outs=OUTS):
    gamma, k = pair.draft.cfg.block_size - 1, pair.draft.cfg.selector_top_k
    acc = [[0.0] * gamma for _ in SHAPES]
    mass, count = [0.0] * gamma, 0
    for seq, a, h, dl, logits in forced_anchors(pair, *zip(*outs)):
        for e in range(gamma):
            cand = sorted(range(len(dl[e])), key=lambda t: (-dl[e][t], t))[:k]
            row = _row(pair, h[e], dl[e], cand, seq[a + e])
            law = _law(logits[a + e], temperature, top_p)          # scores token a + e + 1
            pc = [law[c] for c in cand]
            mass[e] += sum(pc)
            for i, (kind, v) in enumerate(SHAPES):
                q = (_softmax([v * x / temperature for x in row]) if kind == "scale"
                     else _nucleus(row, temperature, v))
                acc[i][e] += sum(min(x, y) for x, y in zip(pc, q))
        count += 1
    return count, [m / count for m in mass], [[x / count for x in a] for a in acc]


def _tau(per):
    tau, run = 1.0, 1.0
    for x in per:
        run *= x
        tau += run
    return tau


@pytest.mark.parametrize("temperature, top_p", [(1.0, 1.0), (0.7, 0.95), (1.4, 0.6)])
def test_law_acceptance_against_a_float64_loop(pair, temperature, top_p):
    prompts, outputs = [p for p, _ in OUTS], [o for _, o in OUTS]
    got = calibration.law_acceptance(pair, prompts, outputs, temperature, top_p, SHAPES)
    count, mass, acc = _reference(pair, temperature, top_p)
    assert got["anchors"] == count == 3 + 1
    assert got["mass"] == pytest.approx(mass, rel=1e-5, abs=1e-7)
    assert got["mass_tau"] == pytest.approx(_tau(mass), rel=1e-5)
    assert [s["shape"] for s in got["shapes"]] == [list(s) for s in SHAPES]
    for s, want in zip(got["shapes"], acc):
        assert s["per_slot"] == pytest.approx(want, rel=1e-5, abs=1e-7)
        assert s["mean"] == pytest.approx(sum(want) / len(want), rel=1e-5)
        assert s["tau"] == pytest.approx(_tau(want), rel=1e-5)
        assert all(a <= m + 1e-9 for a, m in zip(s["per_slot"], got["mass"]))


def test_one_anchor_is_its_own_mean(pair):
    (prompt, out), = OUTS[2:]
    got = calibration.law_acceptance(pair, [prompt], [out], 1.0, 1.0, SHAPES)
    count, mass, acc = _reference(pair, 1.0, 1.0, OUTS[2:])
    assert got["anchors"] == count == 1
    assert got["mass"] == pytest.approx(mass, rel=1e-5, abs=1e-7)
    assert got["shapes"][0]["per_slot"] == pytest.approx(acc[0], rel=1e-5, abs=1e-7)


def test_no_anchor_gives_zeros_not_a_division_by_zero(pair):
    got = calibration.law_acceptance(pair, [[1, 2, 3, 4]], [[14, 15]], 1.0, 1.0, SHAPES)
    assert got["anchors"] == 0
    assert got["mass"] == [0.0] * 3
    assert got["mass_tau"] == 1.0
    assert [s["per_slot"] for s in got["shapes"]] == [[0.0] * 3] * len(SHAPES)


def test_law_acceptance_needs_a_positive_temperature(pair):
    with pytest.raises(ValueError, match="temperature must be > 0"):
        calibration.law_acceptance(pair, [[1, 2]], [[3, 4, 5, 6]], 0.0, 1.0, SHAPES)
