"""The recipe's held-out figures (``dflash2rt.train.validate``) against definitions written anew on
a tiny float64 pair and packed sequences with planted acceptances: each anchor's greedy accept
length by the runtime's own draft forward and selector walk, one block at a time (the engine's
path); ``engine_tau`` by a walk over positions (and over accept lengths given by hand); and
``soft_metrics`` by float64 loops over each anchor's lattice row and the target's law."""

from __future__ import annotations

import math

import pytest
import torch

from dflash2rt.backend import TorchOpsBackend
from dflash2rt.ops.batch import SamplingBatch
from dflash2rt.ops.selector import SelectorParams, select
from dflash2rt.train import target as target_mod
from dflash2rt.train import validate
from dflash2rt.train.generate import DistillData

from test_distill_sweep import _lattice
from tiny_models import tiny_pair

BACKEND = TorchOpsBackend("cpu", "cpu", (torch.float32, torch.float64))
BLOCK, GAMMA, VOCAB, LAW = 4, 3, 59, 6

pytestmark = pytest.mark.usefixtures("one_thread")   # tests/conftest.py


def _runtime_block(pair, seq, a):
    """The runtime's draft at anchor ``a``: context taps of rows < a in a fresh cache, the
    block [seq[a], MASK × γ] at positions a .. a+γ → (normed hidden of the γ slots [γ, H], the
    greedy selector walk's γ drafts)."""
    d, t = pair.draft, pair.target
    cache = d.empty_cache(1, a + BLOCK + 8, pair.dtype, "cpu")
    cache.commit(d.context_kv(target_mod.lm_taps(t, [seq[:a]]), torch.arange(a).view(1, a)),
                 torch.zeros(1, dtype=torch.long), torch.tensor([a]))
    ids = torch.full((1, BLOCK), d.cfg.mask_token_id)
    ids[0, 0] = seq[a]
    h = d(t.embed(ids), (a + torch.arange(BLOCK)).view(1, BLOCK), cache, torch.tensor([a]),
          BACKEND)[:, 1:]
    sel = d.candidate_selector
    params = SelectorParams(d.cfg.selector_top_k, d.cfg.output_multiplier,
                            d.cfg.final_logit_softcapping)
    out = select(t.lm_head(h), sel.hidden_projection(h), torch.tensor([seq[a]]),
                 sel.predecessor_codebook, sel.successor_codebook, params,
                 SamplingBatch.greedy_batch(1), torch.zeros(1, GAMMA))
    return h[0], out.draft[0].tolist()


def _accepted(pair, seq, a):
    """Drafts of the walk at ``a`` that match the sequence's next tokens, up to the first miss."""
    _, drafts = _runtime_block(pair, seq, a)
    k = 0
    while k < GAMMA and drafts[k] == seq[a + 1 + k]:
        k += 1
    return k


def _planted(pair, length, plants, seed):
    """A token sequence whose walk at anchor a accepts exactly k drafts for each (a, k) of
    ``plants`` (later tokens never change an earlier anchor's context)."""
    g = torch.Generator().manual_seed(seed)
    seq = torch.randint(0, VOCAB, (length,), generator=g).tolist()
    for a, k in plants:
        _, drafts = _runtime_block(pair, seq, a)
        seq[a + 1:a + 1 + k] = drafts[:k]
        if k < GAMMA:
            seq[a + 1 + k] = (drafts[k] + 1) % VOCAB
    return seq


# (length, prompt length, planted (anchor, accepted)): the second has no full block after its
# prompt, the last exactly one
SEQS = [(14, 6, [(6, 2), (9, 3)]), (9, 6, []), (24, 4, [(4, 3), (9, 1), (12, 2), (17, 0)]),
        (10, 6, [(6, 1)])]


def _data(pair, seqs):
    """The sequences packed end to end with the target's taps and its top-``LAW`` law (T = 1)
    of every row."""
    feats, ids, probs = [], [], []
    for seq in seqs:
        out = target_mod.lm_forward(pair.target, [seq])
        feats.append(out.taps[0])
        p, i = torch.softmax(out.logits[0].double(), dim=-1).topk(LAW, dim=-1)
        ids.append(i)
        probs.append(p)
    lengths = torch.tensor([len(s) for s in seqs])
    return lengths, (torch.cat(feats), torch.cat(ids), torch.cat(probs))


@pytest.fixture(scope="module")
def case():
    pair = tiny_pair("dflash2", block=BLOCK, seed=3)
    seqs = [_planted(pair, n, plants, i) for i, (n, _, plants) in enumerate(SEQS)]
    lengths, (feats, ids, probs) = _data(pair, seqs)
    data = DistillData(torch.tensor([t for s in seqs for t in s]), feats,
                       torch.cumsum(lengths, 0) - lengths, lengths,
                       torch.tensor([p for _, p, _ in SEQS]), ids, probs)
    return pair, seqs, data


def _one(pair, seq, prompt):
    """``seq`` alone as distillation data (with its law)."""
    lengths, (feats, ids, probs) = _data(pair, [seq])
    return DistillData(torch.tensor(seq), feats, torch.tensor([0]), lengths,
                       torch.tensor([prompt]), ids, probs)


def test_accept_lengths_are_the_runtime_walks(case):
    """One length per anchor a in [prompt, n - γ) (a full block after it), each the number of
    the runtime walk's drafts that match the sequence, the planted ones among them."""
    pair, seqs, data = case
    for s, (seq, (n, p, plants)) in enumerate(zip(seqs, SEQS)):
        got = validate.accept_lengths(pair.draft, pair.target, data, s, BACKEND)
        assert got == [_accepted(pair, seq, a) for a in range(p, n - GAMMA)], s
        for a, k in plants:
            assert got[a - p] == k
    assert validate.accept_lengths(pair.draft, pair.target, data, 1, BACKEND) == []


def _walk_tau(lengths_at):
    """τ of walks over positions: from each sequence's first generated token, while a full
    block fits, commit the accepted drafts + 1 and move past them."""
    committed = steps = 0
    for n, p, at in lengths_at:
        pos = p
        while pos + GAMMA < n:
            k = at(pos)
            committed, steps, pos = committed + k + 1, steps + 1, pos + k + 1
    return committed / steps if steps else 0.0


@pytest.mark.parametrize("training", [True, False])
def test_engine_tau_walks_like_the_engine(case, training):
    pair, seqs, data = case
    pair.draft.train(training)
    try:
        got = validate.engine_tau(pair.draft, pair.target, data)
        assert pair.draft.training is training
    finally:
        pair.draft.eval()
    want = _walk_tau([(n, p, lambda a, seq=seq: _accepted(pair, seq, a))
                      for seq, (n, p, _) in zip(seqs, SEQS)])
    assert got == pytest.approx(want, rel=1e-12) and 1 < got < BLOCK


def test_engine_tau_over_accept_lengths_given_by_hand(case, monkeypatch):
    """Walks over [2, 0, 1, 3, 0, 0] (commit 3 then 4), [] and [0, 0] (commit 1 twice): 9 tokens
    in 4 steps; the draft runs in eval mode and gets its training mode back."""
    pair, _, data = case
    plan = {0: [2, 0, 1, 3, 0, 0], 1: [], 2: [0, 0], 3: []}
    modes = []

    def lengths(draft, target, data_, seq, backend):
        modes.append(draft.training)
        return plan[seq]

    monkeypatch.setattr(validate, "accept_lengths", lengths)
    pair.draft.train(True)
    try:
        assert validate.engine_tau(pair.draft, pair.target, data) == 9 / 4
        assert pair.draft.training and modes == [False] * 4
    finally:
        pair.draft.eval()
    plan = {s: [] for s in plan}
    assert validate.engine_tau(pair.draft, pair.target, data) == 0.0


def test_engine_tau_without_a_full_block_is_zero(case):
    pair, seqs, _ = case
    assert validate.engine_tau(pair.draft, pair.target, _one(pair, seqs[1], 6)) == 0.0


def _anchor_soft(pair, seq, a, law_ids, law_p):
    """(mass, acc1 per slot) at anchor ``a``, in float64 loops: the lattice row after the true
    previous token, q = its softmax; mass = Σ_k p(c_k), acc1 = Σ_k min(p(c_k), q_k) with p the
    law of row a + e (the target's law of token a + e + 1)."""
    h, _ = _runtime_block(pair, seq, a)
    h = h.view(1, 1, GAMMA, -1)
    prev = torch.tensor(seq[a:a + GAMMA]).view(1, 1, GAMMA)
    scores, cand = _lattice(pair.draft, h, pair.target.lm_head(h), prev)
    mass, acc = [], []
    for e in range(GAMMA):
        law = dict(zip(law_ids[a + e], law_p[a + e]))
        row = scores[0][0][e]
        z = sum(math.exp(x) for x in row)
        pc = [law.get(c, 0.0) for c in cand[0][0][e]]
        mass.append(sum(pc))
        acc.append(sum(min(x, math.exp(s) / z) for x, s in zip(pc, row)))
    return mass, acc


def _soft_reference(pair, data, items):
    """Each figure averaged over the anchors of ``items`` (sequence, its index in ``data``,
    prompt length)."""
    masses, accs, taus = [], [], []
    for seq, s, p in items:
        n, st = len(seq), int(data.starts[s])
        law_ids = data.soft_ids[st:st + n].tolist()
        law_p = data.soft_p[st:st + n].tolist()
        for a in range(p, n - GAMMA):
            mass, acc = _anchor_soft(pair, seq, a, law_ids, law_p)
            masses.append(sum(mass) / GAMMA)
            accs.append(sum(acc) / GAMMA)
            taus.append(1 + sum(math.prod(acc[:e + 1]) for e in range(GAMMA)))
    return {k: sum(v) / len(v) for k, v in (("mass", masses), ("acc1", accs), ("tau1", taus))}


def test_soft_metrics_average_every_anchor(case):
    pair, seqs, data = case
    pair.draft.train(True)
    try:
        got = validate.soft_metrics(pair.draft, pair.target, data)
        assert pair.draft.training
    finally:
        pair.draft.eval()
    want = _soft_reference(pair, data, [(seq, s, p) for s, (seq, (_, p, _)) in
                                        enumerate(zip(seqs, SEQS))])
    assert got.keys() == want.keys()
    for k in want:
        assert got[k] == pytest.approx(want[k], rel=1e-9), k
    assert 0 < got["acc1"] < got["mass"] < 1 and 1 < got["tau1"] < BLOCK
    assert validate.soft_metrics(pair.draft, pair.target, data) == got
    assert not pair.draft.training


def test_soft_metrics_of_one_anchor_and_of_none(case):
    pair, seqs, _ = case
    one = _one(pair, seqs[3], 6)
    got = validate.soft_metrics(pair.draft, pair.target, one)
    want = _soft_reference(pair, one, [(seqs[3], 0, 6)])
    assert got == pytest.approx(want, rel=1e-9)
    none = validate.soft_metrics(pair.draft, pair.target, _one(pair, seqs[1], 6))
    assert none == {"mass": 0.0, "acc1": 0.0, "tau1": 0.0}
