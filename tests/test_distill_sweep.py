"""The draft's distillation (``dflash2rt.train.distill``) against its definitions, on a tiny
float64 pair and hand-made data: ``sample_batch``'s blocks, labels and law rows by a loop over the
packed sequences; ``slot_weights`` and ``candidate_mass`` by hand; the selector's lattice scores,
``distill_loss``'s loss and every metric by float64 loops over the rows (log-sum-exp, the KLs,
the teacher-forced walk); and ``train_draft``'s loop (seeded epochs, learning rates, clipping,
the evaluation and progress calls) with its optimizer replaced by a recorder, so nothing trains."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

import dflash2rt.train.progress
import dflash2rt.train.target
from dflash2rt.backend import TorchOpsBackend
from dflash2rt.errors import InvalidInputError
from dflash2rt.train import distill
from dflash2rt.train.generate import DistillData

from tiny_models import tiny_pair

BACKEND = TorchOpsBackend("cpu", "cpu", (torch.float32, torch.float64))
MASK = 60


pytestmark = pytest.mark.usefixtures("one_thread")   # tests/conftest.py


# ---------------------------------------------------------------- sample_batch

def _packed(lengths, prompt_lens, m=3):
    """Sequences packed end to end: token of row i = 100 + i, taps [i, i + 0.5], law ids
    10 i + j with probabilities (j + 1) / 100 + i / 1000."""
    n = sum(lengths)
    lengths_t = torch.tensor(lengths)
    rows = torch.arange(n, dtype=torch.float32)
    feats = torch.stack([rows, rows + 0.5], dim=-1).unsqueeze(-1).expand(n, 2, 3).clone()
    ids = torch.tensor([[10 * i + j for j in range(m)] for i in range(n)])
    p = torch.tensor([[(j + 1) / 100 + i / 1000 for j in range(m)] for i in range(n)])
    return DistillData(100 + torch.arange(n), feats, torch.cumsum(lengths_t, 0) - lengths_t,
                       lengths_t, torch.tensor(prompt_lens), ids, p)


# sequence 0: anchors 3 .. 5; 1: a short generated part (anchor 2 only, its block runs past the
# end into padding); 2: as long as the longest, all but one row prompt (anchor 8, its block
# runs past the padded length); law rows past a sequence's end are its last row's
LENGTHS, PROMPTS, BLOCK = [9, 5, 9], [3, 2, 8], 4


def _anchor_range(s):
    gamma = BLOCK - 1
    lo = PROMPTS[s]
    return lo, max(LENGTHS[s] - gamma, lo + 1)


def test_sample_batch_rows_are_the_sequences_rows():
    data = _packed(LENGTHS, PROMPTS)
    seqs, n_anchors = [2, 0, 1], 40
    b = distill.sample_batch(data, seqs, n_anchors, BLOCK, MASK, torch.Generator().manual_seed(3))
    lmax, gamma = max(LENGTHS), BLOCK - 1
    starts = [sum(LENGTHS[:s]) for s in range(3)]
    assert b.feats.shape == (3, lmax, 2, 3) and b.anchors.shape == (3, n_anchors)
    assert b.block_ids.shape == (3, n_anchors, BLOCK) and b.labels.shape == (3, n_anchors, gamma)
    assert b.soft_ids.shape == b.soft_p.shape == (3, n_anchors, gamma, 3)
    assert b.ctx_len.tolist() == [LENGTHS[s] for s in seqs]
    for i, s in enumerate(seqs):
        st, n = starts[s], LENGTHS[s]
        for t in range(lmax):
            want = [t + st, t + st + 0.5] if t < n else [0.0, 0.0]
            assert b.feats[i, t, :, 0].tolist() == want, (i, t)
        lo, hi = _anchor_range(s)
        got = b.anchors[i].tolist()
        assert set(got) == set(range(lo, hi)), (s, sorted(set(got)))     # all of them, no other

        def tok(pos):
            return 100 + st + pos if pos < n else 0                        # 0: padding

        for j, a in enumerate(got):
            assert b.block_ids[i, j].tolist() == [tok(a)] + [MASK] * gamma
            assert b.labels[i, j].tolist() == [tok(a + e) for e in range(1, BLOCK)]
            for e in range(gamma):
                row = st + min(a + e, n - 1)
                assert b.soft_ids[i, j, e].tolist() == data.soft_ids[row].tolist()
                assert b.soft_p[i, j, e].tolist() == data.soft_p[row].tolist()


def test_sample_batch_draws_uniform_anchors_from_its_generator():
    """Anchor j of sequence i is lo + ⌊u (hi - lo)⌋ for the generator's next uniforms u [R, N]:
    the same generator state gives the same batch."""
    data = _packed(LENGTHS, PROMPTS)
    b = distill.sample_batch(data, [0, 1, 2], 7, BLOCK, MASK, torch.Generator().manual_seed(5))
    u = torch.rand(3, 7, generator=torch.Generator().manual_seed(5), dtype=torch.float32)
    for i in range(3):
        lo, hi = _anchor_range(i)
        assert b.anchors[i].tolist() == [lo + int(float(x) * (hi - lo)) for x in u[i]]
    again = distill.sample_batch(data, [0, 1, 2], 7, BLOCK, MASK,
                                 torch.Generator().manual_seed(5))
    assert torch.equal(again.anchors, b.anchors) and torch.equal(again.labels, b.labels)


def test_a_batch_is_immutable():
    data = _packed(LENGTHS, PROMPTS)
    b = distill.sample_batch(data, [0], 2, BLOCK, MASK, torch.Generator().manual_seed(0))
    with pytest.raises(dataclasses.FrozenInstanceError):
        b.labels = b.labels[..., :1]


def test_sample_batch_without_a_law_has_no_soft_rows():
    data = dataclasses.replace(_packed(LENGTHS, PROMPTS), soft_ids=None, soft_p=None)
    b = distill.sample_batch(data, [0, 1], 4, BLOCK, MASK, torch.Generator().manual_seed(0))
    assert b.soft_ids is None and b.soft_p is None
    assert b.labels.shape == (2, 4, BLOCK - 1)


# ---------------------------------------------------------------- small pieces

def test_slot_weights_decay_exponentially_and_sum_to_one():
    z = 1 + math.exp(-0.5) + math.exp(-1.0)
    want = [1 / z, math.exp(-0.5) / z, math.exp(-1.0) / z]
    got = distill.slot_weights(3, 2.0).tolist()
    assert got == pytest.approx(want, rel=1e-6)
    assert distill.slot_weights(1, 7.0).tolist() == [1.0]


def test_candidate_mass_is_the_laws_probability_of_each_candidate():
    cand = torch.tensor([[[3, 5, 9]], [[7, 1, 2]]])                      # [2, 1, K]
    ids = torch.tensor([[[5, 7, 3]], [[1, 4, 7]]])                       # [2, 1, M]
    p = torch.tensor([[[0.5, 0.25, 0.125]], [[0.375, 0.25, 0.0625]]])
    assert distill.candidate_mass(cand, ids, p).tolist() == [[[0.125, 0.5, 0.0]],
                                                            [[0.0625, 0.375, 0.0]]]


def test_block_mask_rows_see_their_context_and_their_own_block_only():
    anchors = torch.tensor([[0, 3], [4, 1]])
    m = distill.block_mask(anchors, 5, 2)                                 # [2, 4, 5 + 4]
    assert m.shape == (2, 4, 9)
    for r in range(2):
        for row in range(4):
            j = row // 2
            want = [c < int(anchors[r, j]) for c in range(5)] + [c // 2 == j for c in range(4)]
            assert m[r, row].tolist() == want, (r, row)


# ---------------------------------------------------------------- distill_loss

def _log_softmax(xs):
    top = max(xs)
    z = top + math.log(sum(math.exp(x - top) for x in xs))
    return [x - z for x in xs]


def _topk(xs, k):
    """(values, ids) of the k largest, descending (no ties in these tests)."""
    ids = sorted(range(len(xs)), key=lambda i: -xs[i])[:k]
    return [xs[i] for i in ids], ids


def _lattice(draft, h, logits, prev):
    """The selector's row reached from ``prev``, in float64 loops (ops/selector.py's formula):
    softcap(top-K logit × output_multiplier) + Σ_r A[prev, r] P(h)_r B[cand, r] → (scores, cand)
    as nested lists [R][N][γ][K]."""
    cfg, sel = draft.cfg, draft.candidate_selector
    proj = sel.hidden_projection(h).tolist()
    a, bc = sel.predecessor_codebook.tolist(), sel.successor_codebook.tolist()
    lg, pv = logits.tolist(), prev.tolist()
    cap = cfg.final_logit_softcapping
    scores, cands = [], []
    for r in range(len(lg)):
        sr, cr = [], []
        for j in range(len(lg[r])):
            sj, cj = [], []
            for e in range(len(lg[r][j])):
                vals, ids = _topk(lg[r][j][e], cfg.selector_top_k)
                row = []
                for v, c in zip(vals, ids):
                    u = v * cfg.output_multiplier
                    u = cap * math.tanh(u / cap) if cap is not None else u
                    p = a[pv[r][j][e]]
                    u += sum(p[q] * proj[r][j][e][q] * bc[c][q] for q in range(len(p)))
                    row.append(u)
                sj.append(row)
                cj.append(ids)
            sr.append(sj)
            cr.append(cj)
        scores.append(sr)
        cands.append(cr)
    return scores, cands


# per (r, j): the label of each slot: T the selector's top candidate, C another candidate,
# O a token outside the candidates; teacher-forced accept lengths 3, 1, 0, 2, 0, 1 and exactly
# one row whose label is a candidate at slot 2
PLAN = [["TTT", "TCO", "OTO"], ["TTO", "COO", "TOO"]]
ANCHORS = [[2, 5, 9], [4, 4, 11]]


@dataclasses.dataclass
class Case:
    pair: object
    batch: distill.Batch
    logits: torch.Tensor
    h: torch.Tensor


@pytest.fixture(scope="module")
def case() -> Case:
    """A batch whose labels walk the plan, with a law of M = 5 per label row: row q's first id
    a candidate other than its label when q % 3 == 0, one row with no candidate in its law, and
    probabilities that end in a zero."""
    pair = tiny_pair("dflash2", block=4, seed=7)
    draft, target = pair.draft, pair.target
    g = torch.Generator().manual_seed(11)
    feats = 0.5 * torch.randn(2, 14, 2, 32, generator=g, dtype=torch.float64)
    anchors = torch.tensor(ANCHORS)
    first = torch.tensor([[13, 21, 34], [8, 8, 55]])
    ids = torch.full((2, 3, 4), MASK)
    ids[..., 0] = first
    blank = distill.Batch(feats, torch.tensor([14, 14]), anchors, ids,
                          torch.zeros(2, 3, 3, dtype=torch.int64))
    h = distill.draft_hidden(draft, target, blank, BACKEND)[:, :, 1:]
    logits = target.lm_head(h)
    labels = torch.zeros(2, 3, 3, dtype=torch.int64)
    for e in range(3):                                   # slot e's row depends on label e - 1
        prev = torch.cat([first.unsqueeze(-1), labels[..., :-1]], dim=-1)
        scores, cand = _lattice(draft, h, logits, prev)
        for r in range(2):
            for j in range(3):
                row, c = scores[r][j][e], cand[r][j][e]
                order = sorted(range(len(c)), key=lambda k: -row[k])
                kind = PLAN[r][j][e]
                labels[r, j, e] = c[order[0]] if kind == "T" else c[order[1]] if kind == "C" \
                    else min(t for t in range(MASK) if t not in c)
    prev = torch.cat([first.unsqueeze(-1), labels[..., :-1]], dim=-1)
    _, cand = _lattice(draft, h, logits, prev)
    soft_ids = torch.zeros(2, 3, 3, 5, dtype=torch.int64)
    soft_p = torch.zeros(2, 3, 3, 5, dtype=torch.float64)
    q = 0
    for r in range(2):
        for j in range(3):
            for e in range(3):
                c = cand[r][j][e]
                pool = [t for t in range(MASK) if t not in c and t != int(labels[r, j, e])]
                perm = torch.randperm(len(pool), generator=g).tolist()
                row = [pool[i] for i in perm[:5]]
                if q % 3 == 0:
                    row[0] = next(t for t in c if t != int(labels[r, j, e]))
                if q % 3 == 1 and q != 4:
                    row[2] = c[-1]
                    row[3] = int(labels[r, j, e])
                soft_ids[r, j, e] = torch.tensor(row)
                base = [0.4, 0.2, 0.1, 0.05, 0.0] if q % 2 else [0.5, 0.25, 0.125, 0.0625, 0.0]
                soft_p[r, j, e] = torch.tensor(base) * (1 - q / 40)
                q += 1
    batch = distill.Batch(feats, torch.tensor([14, 14]), anchors, ids, labels, soft_ids, soft_p)
    return Case(pair, batch, logits, h)


def _reference(case: Case, decay, sel_w, soft_w, hard_w, argmax, soft=True):
    """(loss, metrics) of the docstring's definition, in float64 loops over the rows."""
    draft, b = case.pair.draft, case.batch
    labels = b.labels.tolist()
    prev = torch.cat([b.block_ids[..., :1], b.labels[..., :-1]], dim=-1)
    scores, cand = _lattice(draft, case.h, case.logits, prev)
    lg = case.logits.tolist()
    r_n, n_n, g_n = len(lg), len(lg[0]), len(lg[0][0])
    w = [math.exp(-e / decay) for e in range(g_n)]
    w = [x / sum(w) for x in w]
    sid, sp = (b.soft_ids.tolist(), b.soft_p.tolist()) if soft else (None, None)
    rows = [(r, j) for r in range(r_n) for j in range(n_n)]
    ce = sel = kl = selkl = 0.0
    mass_all, acc_all, tau1_all, top1, accept = [], [], [], 0, 0
    for e in range(g_n):
        ce_e = sel_sum = kl_e = num = den = 0.0
        present = 0
        for r, j in rows:
            logp = _log_softmax(lg[r][j][e])
            logq = _log_softmax(scores[r][j][e])
            c = cand[r][j][e]
            hard = sid[r][j][e][0] if argmax else labels[r][j][e]
            ce_e -= logp[hard] / len(rows)
            if hard in c:
                present += 1
                sel_sum -= logq[c.index(hard)]
            top1 += max(range(len(logp)), key=lambda t: logp[t]) == labels[r][j][e]
            if sid is not None:
                law = dict(zip(sid[r][j][e], sp[r][j][e]))
                kl_e += sum(p * (math.log(p) - logp[t]) for t, p in law.items() if p > 0) \
                    / len(rows)
                pc = [law.get(t, 0.0) for t in c]
                mass = sum(pc)
                pt = [x / mass if mass > 0 else 0.0 for x in pc]
                num += mass * sum(x * (math.log(x) - lq) for x, lq in zip(pt, logq) if x > 0)
                den += mass
                mass_all.append(mass)
                acc_all.append(sum(min(x, math.exp(lq)) for x, lq in zip(pc, logq)))
        ce += w[e] * ce_e
        sel += w[e] * sel_sum / max(present, 1)
        kl += w[e] * kl_e
        selkl += w[e] * (num / den if den > 0 else 0.0)
    for r, j in rows:
        for e in range(g_n):
            c = cand[r][j][e]
            best = max(range(len(c)), key=lambda k: scores[r][j][e][k])
            if labels[r][j][e] not in c or c[best] != labels[r][j][e]:
                break
            accept += 1
    loss = hard_w * (ce + sel_w * sel)
    metrics = {"ce": ce, "sel": sel, "tau": 1 + accept / len(rows),
               "top1": top1 / (len(rows) * g_n)}
    if sid is not None and soft_w > 0:
        loss += soft_w * (kl + sel_w * selkl)
        for q in range(len(rows)):
            run, prod = 0.0, 1.0
            for e in range(g_n):
                prod *= acc_all[e * len(rows) + q]
                run += prod
            tau1_all.append(run)
        metrics.update(kl=kl, selkl=selkl, mass=sum(mass_all) / len(mass_all),
                       acc1=sum(acc_all) / len(acc_all), tau1=1 + sum(tau1_all) / len(rows))
    return loss, metrics


def test_the_fixture_walks_its_plan(case):
    """The plan's accept lengths (3, 1, 0, 2, 0, 1) on the teacher-forced walk, every mass
    between 0 and 1 with one row at 0, and labels that are neither all nor none the argmax."""
    _, m = _reference(case, 7.0, 1.0, 1.0, 1.0, False)
    assert m["tau"] == pytest.approx(1 + 7 / 6, rel=1e-12)
    assert 0.0 < m["top1"] < 1.0 and 0.0 < m["mass"] < 1.0


@pytest.mark.parametrize("decay, sel_w, soft_w, hard_w, argmax", [
    (2.0, 0.6, 0.7, 1.3, False),
    (3.0, 1.5, 1.0, 0.0, True),
    (7.0, 1.0, 2.5, 1.0, True),
])
def test_distill_loss_is_its_definition(case, decay, sel_w, soft_w, hard_w, argmax):
    draft, target = case.pair.draft, case.pair.target
    loss, m = distill.distill_loss(draft, target, case.batch, BACKEND, decay, sel_w,
                                   soft_weight=soft_w, hard_weight=hard_w, hard_argmax=argmax)
    want_loss, want = _reference(case, decay, sel_w, soft_w, hard_w, argmax)
    assert set(m) == set(want)
    assert loss.item() == pytest.approx(want_loss, rel=1e-6)
    for k, v in want.items():
        assert m[k] == pytest.approx(v, rel=1e-6, abs=1e-12), k


def test_distill_loss_with_fewer_anchors_than_slots(case):
    """The first two anchors only (R 2, N 2, γ 3): every mean and slot weight over its own
    axis."""
    b = case.batch
    sub = distill.Batch(b.feats, b.ctx_len, b.anchors[:, :2], b.block_ids[:, :2],
                        b.labels[:, :2], b.soft_ids[:, :2], b.soft_p[:, :2])
    small = Case(case.pair, sub, case.logits[:, :2], case.h[:, :2])
    loss, m = distill.distill_loss(case.pair.draft, case.pair.target, sub, BACKEND, 2.0, 0.6,
                                   soft_weight=0.7, hard_weight=1.3)
    want_loss, want = _reference(small, 2.0, 0.6, 0.7, 1.3, False)
    assert loss.item() == pytest.approx(want_loss, rel=1e-6)
    assert m == pytest.approx(want, rel=1e-6, abs=1e-12)


def test_hard_argmax_changes_the_hard_target_not_the_walks_metric(case):
    """hard_argmax reads the law's top id as the CE's target; ``tau`` stays the walk on the
    continuation's own tokens."""
    draft, target = case.pair.draft, case.pair.target
    loss, plain = distill.distill_loss(draft, target, case.batch, BACKEND, 7.0, 1.0)
    want_loss, want = _reference(case, 7.0, 1.0, 1.0, 1.0, False)      # the defaults
    assert loss.item() == pytest.approx(want_loss, rel=1e-6)
    assert plain == pytest.approx(want, rel=1e-6, abs=1e-12)
    _, am = distill.distill_loss(draft, target, case.batch, BACKEND, 7.0, 1.0,
                                 hard_argmax=True)
    assert am["tau"] == plain["tau"] == pytest.approx(1 + 7 / 6, rel=1e-6)
    assert am["ce"] != pytest.approx(plain["ce"], rel=1e-3)


@pytest.mark.parametrize("drop_law", [True, False])
def test_without_the_soft_part_only_the_hard_terms_count(case, drop_law):
    """No law in the batch, or ``soft_weight`` 0: the loss is the hard part alone and the
    metrics are ce, sel, tau and top1."""
    draft, target = case.pair.draft, case.pair.target
    batch = dataclasses.replace(case.batch, soft_ids=None, soft_p=None) if drop_law \
        else case.batch
    loss, m = distill.distill_loss(draft, target, batch, BACKEND, 2.0, 0.5,
                                   soft_weight=0.0 if not drop_law else 1.0, hard_weight=1.25)
    want_loss, want = _reference(case, 2.0, 0.5, 0.0, 1.25, False, soft=not drop_law)
    assert set(m) == {"ce", "sel", "tau", "top1"} == set(want)
    assert loss.item() == pytest.approx(want_loss, rel=1e-6)
    for k, v in want.items():
        assert m[k] == pytest.approx(v, rel=1e-6, abs=1e-12), k


def test_hard_argmax_without_a_law_is_refused(case):
    draft, target = case.pair.draft, case.pair.target
    batch = dataclasses.replace(case.batch, soft_ids=None, soft_p=None)
    with pytest.raises(InvalidInputError, match="soft_top > 0"):
        distill.distill_loss(draft, target, batch, BACKEND, 7.0, 1.0, hard_argmax=True)


def test_selector_scores_are_the_lattice_formula(case):
    """Scores of every row and candidate, against the float64 loops; a draft without the
    softcap too."""
    draft, b = case.pair.draft, case.batch
    prev = torch.cat([b.block_ids[..., :1], b.labels[..., :-1]], dim=-1)
    for cap in (draft.cfg.final_logit_softcapping, None):
        d = draft
        if cap is None:
            d = type(draft).__new__(type(draft))
            d.__dict__.update(draft.__dict__)
            d.cfg = dataclasses.replace(draft.cfg, final_logit_softcapping=None)
        scores, cand = distill.selector_scores(d, case.h, case.logits, prev,
                                               d.cfg.selector_top_k)
        want_s, want_c = _lattice(d, case.h, case.logits, prev)
        assert cand.tolist() == want_c
        assert scores.dtype == torch.float64
        assert (scores - torch.tensor(want_s, dtype=torch.float64)).abs().max() < 1e-12


# ---------------------------------------------------------------- train_draft

class FakeOptimizer:
    """make_optimizer's stand-in: records each step's learning rate, the draft's mode and the
    gradient's norm; changes no parameter (so nothing trains)."""

    made: list = []

    def __init__(self, model, lr, weight_decay, no_decay=()):
        self.model, self.param_groups = model, [{"lr": None}, {"lr": None}]
        self.args = (lr, weight_decay, no_decay)
        self.steps: list[tuple[float, bool, float]] = []
        self.zeroed = 0
        FakeOptimizer.made.append(self)

    def zero_grad(self, set_to_none=True):
        self.zeroed += 1
        for p in self.model.parameters():
            p.grad = None

    def step(self):
        lrs = {g["lr"] for g in self.param_groups}
        assert len(lrs) == 1
        norm = math.sqrt(sum(float((p.grad.double() ** 2).sum())
                             for p in self.model.parameters() if p.grad is not None))
        self.steps.append((lrs.pop(), self.model.training, norm))
        if len(self.steps) == 1:
            self.first_grads = [None if p.grad is None else p.grad.clone()
                                for p in self.model.parameters()]


class FakeProgress:
    made: list = []

    def __init__(self, phase, total, every=10, stream=None):
        self.phase, self.total, self.every, self.calls = phase, total, every, []
        FakeProgress.made.append(self)

    def step(self, i, tokens, **metrics):
        self.calls.append((i, tokens, metrics))


@pytest.fixture
def recorders(monkeypatch):
    FakeOptimizer.made, FakeProgress.made = [], []
    monkeypatch.setattr(dflash2rt.train.target, "make_optimizer", FakeOptimizer)
    monkeypatch.setattr(dflash2rt.train.progress, "Progress", FakeProgress)
    batches = []
    real = distill.sample_batch

    def sample(data, seqs, anchors, block, mask_id, gen):
        b = real(data, seqs, anchors, block, mask_id, gen)
        batches.append((list(seqs), b))
        return b

    monkeypatch.setattr(distill, "sample_batch", sample)
    return batches


@pytest.mark.parametrize("every", [0, -3, 2.0, True])
def test_train_draft_refuses_a_bad_progress_interval(recorders, every):
    """``every`` is a count of steps: 0, negatives, floats and booleans are refused by name
    before any step."""
    pair = tiny_pair("dflash2", block=4, seed=2, dtype=torch.float32)
    with pytest.raises(InvalidInputError, match="every must be an integer >= 1"):
        distill.train_draft(pair.draft, pair.target, _train_data(pair), 2, 2, 3, 0.01, 5,
                            every=every)
    assert recorders == [] and FakeOptimizer.made == []


def _train_data(pair, n_seq=4, length=10, prompt=3):
    """``n_seq`` sequences of the target's taps, each with the target's top-4 law per row."""
    seqs = [[(5 * s + 7 * i + 1) % MASK for i in range(length)] for s in range(n_seq)]
    out = dflash2rt.train.target.lm_forward(pair.target, seqs)
    p, ids = torch.softmax(out.logits.float(), -1).topk(4, dim=-1)
    lengths = torch.full((n_seq,), length)
    return DistillData(torch.tensor(seqs).flatten(), out.taps.flatten(0, 1).float(),
                       torch.arange(n_seq) * length, lengths, torch.full((n_seq,), prompt),
                       ids.flatten(0, 1), p.flatten(0, 1))


def _lr(step, steps, peak):
    """cosine_lr with the warmup train_draft asks for: min(100, steps // 10 + 1) steps."""
    warm = min(100, steps // 10 + 1)
    if step < warm:
        return peak * (step + 1) / warm
    frac = (step - warm) / max(1, steps - warm)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


@pytest.mark.parametrize("steps, every, sps, hard_w", [(11, 1, 3, 1.0), (4, 3, 2, 400.0),
                                                      (2, None, 3, 1.0)])
def test_train_draft_loop(recorders, steps, every, sps, hard_w):
    """Seeded shuffled epochs (a new permutation of the sequences drawn when fewer than a
    step's are left, from the generator the anchors come from), the warmed-up cosine learning
    rate, gradients clipped to norm 1, ``on_eval`` every ``10 × every`` steps and at the last,
    progress with the mean of the last ``every`` (default 20) steps' metrics, and the metrics
    of each step equal to ``distill_loss`` with the documented defaults."""
    pair = tiny_pair("dflash2", block=4, seed=2, dtype=torch.float32)
    draft, target = pair.draft, pair.target
    data = _train_data(pair)
    evals = []
    given = {} if hard_w == 1.0 else {"hard_weight": hard_w}           # else the defaults
    if every is not None:
        given["every"] = every
    every = 20 if every is None else every
    hist = distill.train_draft(draft, target, data, steps, sps, 3, 0.01, 5,
                               on_eval=evals.append, **given)
    [opt], [prog] = FakeOptimizer.made, FakeProgress.made
    assert opt.args[:2] == (0.01, 0.01) and "codebook" in opt.args[2]
    assert (prog.phase, prog.total, prog.every) == ("draft", steps, every)
    assert evals == [s for s in range(1, steps + 1) if s % (10 * every) == 0 or s == steps]
    assert not draft.training and not any(p.requires_grad for p in draft.parameters())
    assert not any(p.requires_grad for p in target.parameters())
    # the seeded epochs and each step's anchors (sample_batch's draw, after the permutations)
    gen, order = torch.Generator().manual_seed(5), []
    assert len(recorders) == steps
    for seqs_got, b in recorders:
        if len(order) < sps:
            order += torch.randperm(4, generator=gen).tolist()
        seqs, order = order[:sps], order[sps:]
        assert seqs_got == seqs
        u = torch.rand(sps, 3, generator=gen)
        lo = torch.tensor([int(data.prompt_lens[s]) for s in seqs]).view(sps, 1)
        hi = torch.tensor([max(int(data.lengths[s]) - 3, int(data.prompt_lens[s]) + 1)
                           for s in seqs]).view(sps, 1)
        assert torch.equal(b.anchors, lo + (u * (hi - lo)).long())
    # the learning rates, the mode, the clipped gradients
    assert opt.zeroed == steps
    assert [lr for lr, _, _ in opt.steps] == pytest.approx([_lr(s, steps, 0.01)
                                                            for s in range(steps)], rel=1e-12)
    assert all(training for _, training, _ in opt.steps)
    for _, _, norm in opt.steps:
        assert 0.0 < norm <= 1.0 + 1e-5
    if hard_w > 100:
        assert all(norm == pytest.approx(1.0, rel=1e-4) for _, _, norm in opt.steps)
    # step 0's gradient: that of distill_loss with the defaults' weights, clipped to norm 1
    draft.requires_grad_(True)
    loss, _ = distill.distill_loss(draft, target, recorders[0][1], BACKEND, 7.0, 1.0,
                                   soft_weight=1.0, hard_weight=hard_w, hard_argmax=False)
    grads = torch.autograd.grad(loss, list(draft.parameters()), allow_unused=True)
    draft.requires_grad_(False)
    grads = [torch.zeros_like(p) if g is None else g for g, p in zip(grads, draft.parameters())]
    raw = math.sqrt(sum(float((g.double() ** 2).sum()) for g in grads))
    coef = min(1.0, 1.0 / (raw + 1e-6))
    for got, g in zip(opt.first_grads, grads):
        assert (got.double() - coef * g.double()).abs().max() <= 1e-5 * max(raw * coef, 1e-3)
    # each step's metrics and the progress lines
    assert len(hist) == steps
    for i in (0, steps - 1):
        batch = recorders[i][1]
        _, m = distill.distill_loss(draft, target, batch, BACKEND, 7.0, 1.0, soft_weight=1.0,
                                    hard_weight=hard_w, hard_argmax=False)
        assert set(hist[i]) == set(m)
        for k in m:
            assert hist[i][k] == pytest.approx(m[k], rel=1e-5, abs=1e-7), (i, k)
    assert [c[:2] for c in prog.calls] == [(i + 1, len(recorders[i][0]) * 3 * 4)
                                           for i in range(steps)]
    for i, (_, _, metrics) in enumerate(prog.calls):
        recent = hist[max(0, i + 1 - every):i + 1]
        want = {k: sum(h[k] for h in recent) / len(recent)
                for k in ("ce", "sel", "tau", "kl", "mass", "tau1")}
        assert metrics == pytest.approx(want, rel=1e-12), i


def test_train_draft_warms_up_for_at_most_100_steps(recorders, monkeypatch):
    """1000 steps: the warmup is min(100, steps // 10 + 1) = 100 steps (the loss replaced by a
    constant one, so that the steps are cheap)."""
    pair = tiny_pair("dflash2", block=4, seed=2, dtype=torch.float32)
    data = _train_data(pair)
    param = next(pair.draft.parameters())

    def loss(draft, target, batch, backend, *args):
        return (param * 0).sum(), {"ce": 0.0}

    monkeypatch.setattr(distill, "distill_loss", loss)
    distill.train_draft(pair.draft, pair.target, data, 1000, 1, 1, 0.01, 0, every=1000)
    [opt] = FakeOptimizer.made
    got = [lr for lr, _, _ in opt.steps]
    assert got == pytest.approx([_lr(s, 1000, 0.01) for s in range(1000)], rel=1e-12)
    assert got[99] == pytest.approx(0.01, rel=1e-12) and got[98] == pytest.approx(0.0099)
