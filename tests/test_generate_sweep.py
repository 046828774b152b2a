"""The distillation data builder (``dflash2rt.train.generate``) against definitions written anew on
a tiny float64 target: greedy continuations by an argmax loop over whole-sequence forwards;
sampled ones the same for every batch size and drawn per prompt index; the taps and the top-M law
(T = 1) of each row by one forward per sequence and a float64 softmax sorted by hand; the packing
and ``subset`` by hand-made rows; the progress lines by a recorder."""

from __future__ import annotations

import math

import pytest
import torch

from dflash2rt.backend import TorchOpsBackend
from dflash2rt.models.pair import ModelPair
from dflash2rt.train import generate
from dflash2rt.train import target as target_mod
from dflash2rt.train.generate import DistillData

from tiny_models import tiny_pair

BACKEND = TorchOpsBackend("cpu", "cpu", (torch.float32, torch.float64))
PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8], [9], [1, 2, 3], [30, 31]]

pytestmark = pytest.mark.usefixtures("one_thread")   # tests/conftest.py


@pytest.fixture(scope="module")
def target():
    return tiny_pair("dflash2", block=4, seed=3).target


class Recorder:
    """Stands in for ``Progress``: keeps (phase, total, every) and every step's (i, tokens),
    each an int (the line prints them)."""
    made: list = []

    def __init__(self, phase, total, every=10, stream=None):
        assert type(total) is int and type(every) is int
        self.phase, self.total, self.every, self.calls = phase, total, every, []
        Recorder.made.append(self)

    def step(self, i, tokens, **metrics):
        assert type(i) is int and type(tokens) is int
        self.calls.append((i, tokens))


@pytest.fixture
def progress(monkeypatch):
    Recorder.made = []
    monkeypatch.setattr(generate, "Progress", Recorder)
    return Recorder.made


def _greedy(target, prompt, k):
    """k tokens, each the argmax of a whole-sequence forward's last row."""
    seq = list(prompt)
    for _ in range(k):
        seq.append(int(target_mod.lm_forward(target, [seq]).logits[0, -1].argmax()))
    return seq[len(prompt):]


def _conts(target, prompts, temps, batch, seed=7, new=5, top_ps=None, phase="generate"):
    return generate.continuations(ModelPair(target, None), BACKEND, prompts, new, temps, batch,
                                  seed, phase, top_ps=top_ps)


@pytest.mark.parametrize("batch", [1, 2, 5, 8])
def test_greedy_continuations_are_the_targets_argmax(target, progress, batch):
    got = _conts(target, PROMPTS, [0.0] * 5, batch)
    assert got == [_greedy(target, p, 5) for p in PROMPTS]
    [rec] = progress
    steps = -(-5 // batch)
    assert (rec.phase, rec.total, rec.every) == ("generate", steps, 1)     # a line per batch
    assert rec.calls == [(i + 1, 5 * len(PROMPTS[i * batch:(i + 1) * batch]))
                         for i in range(steps)]


def test_sampled_continuations_depend_on_the_index_not_the_batch(target, progress):
    """Prompts 0 and 3 are the same: sampled at T = 1 they differ (each request's key is its
    index); every batch size gives the same tokens; a prompt keeps its tokens when its
    neighbours change; the seed and top-p change them."""
    temps = [1.0, 0.0, 1.0, 1.0, 0.7]
    top_ps = [1.0, 1.0, 0.9, 1.0, 0.95]
    want = _conts(target, PROMPTS, temps, 1, top_ps=top_ps)
    for batch in (2, 3, 5):
        assert _conts(target, PROMPTS, temps, batch, top_ps=top_ps) == want
    assert want[0] != want[3]
    assert want[1] == _greedy(target, PROMPTS[1], 5)
    other = [[40], [41, 42], *PROMPTS[2:]]
    got = _conts(target, other, [0.0, 0.0, *temps[2:]], 2, top_ps=[1.0, 1.0, *top_ps[2:]])
    assert got[2:] == want[2:]
    assert _conts(target, PROMPTS, temps, 2, seed=8, top_ps=top_ps) != want
    assert _conts(target, PROMPTS, temps, 2) == _conts(target, PROMPTS, temps, 2,
                                                       top_ps=[1.0] * 5)
    assert _conts(target, PROMPTS, temps, 2, phase="held-out")[0] == \
        _conts(target, PROMPTS, temps, 3)[0]
    assert [r.phase for r in progress][-2:] == ["held-out", "generate"]


def _law(logits_row, m):
    """The top-m (ids, probabilities) of softmax(row) in float64, largest first."""
    top = max(logits_row)
    e = [math.exp(x - top) for x in logits_row]
    z = sum(e)
    ids = sorted(range(len(e)), key=lambda i: -e[i])[:m]
    return ids, [e[i] / z for i in ids]


SEQS = [[5, 6, 7, 8, 9, 10, 11], [12, 13], [14, 15, 16, 17], [18, 19, 20, 21, 22]]


@pytest.mark.parametrize("batch, m", [(1, 5), (3, 1), (4, 5)])
def test_tap_features_and_the_law_of_each_row(target, batch, m):
    feats = generate.tap_features(target, SEQS, batch)
    got, soft = generate.tap_features(target, SEQS, batch, m)
    assert len(feats) == len(got) == len(soft) == len(SEQS)
    for s, seq in enumerate(SEQS):
        out = target_mod.lm_forward(target, [seq])
        torch.testing.assert_close(feats[s], out.taps[0], rtol=1e-9, atol=1e-9)
        assert torch.equal(got[s], feats[s])
        ids, p = soft[s]
        assert ids.shape == p.shape == (len(seq), m)
        assert (ids.dtype, p.dtype) == (torch.int64, torch.float32)
        for i, row in enumerate(out.logits[0].tolist()):
            want_ids, want_p = _law(row, m)
            assert ids[i].tolist() == want_ids
            assert p[i].tolist() == pytest.approx(want_p, rel=1e-5, abs=1e-7)


def test_pack_by_hand():
    feats = [torch.full((3, 2, 4), 1.0), torch.full((2, 2, 4), 2.0)]
    soft = [(torch.tensor([[1, 2], [3, 4], [5, 6]]), torch.tensor([[0.5, 0.2]] * 3)),
            (torch.tensor([[7, 8], [9, 10]]), torch.tensor([[0.6, 0.1]] * 2))]
    data = generate.pack([[11, 12, 13], [14, 15]], feats, [1, 2], soft)
    assert data.tokens.tolist() == [11, 12, 13, 14, 15] and data.tokens.dtype == torch.int64
    assert data.starts.tolist() == [0, 3] and data.lengths.tolist() == [3, 2]
    assert data.prompt_lens.tolist() == [1, 2] and data.num_sequences == 2
    assert data.feats[:, 0, 0].tolist() == [1.0, 1.0, 1.0, 2.0, 2.0]
    assert data.soft_ids[:, 0].tolist() == [1, 3, 5, 7, 9]
    assert data.soft_p[:, 0].tolist() == pytest.approx([0.5, 0.5, 0.5, 0.6, 0.6])
    for none in (None, []):
        bare = generate.pack([[11, 12, 13], [14, 15]], feats, [1, 2], none)
        assert bare.soft_ids is None and bare.soft_p is None


def _hand_data(with_law):
    """Sequences of 3, 2 and 4 rows; row r: token 100 + r, taps r, law ids (r, r + 50) with
    probabilities (r / 100, r / 1000)."""
    rows = torch.arange(9)
    law = (torch.stack([rows, rows + 50], -1),
           torch.stack([rows / 100, rows / 1000], -1)) if with_law else (None, None)
    return DistillData(100 + rows, rows.double().view(9, 1, 1), torch.tensor([0, 3, 5]),
                       torch.tensor([3, 2, 4]), torch.tensor([1, 1, 2]), *law)


@pytest.mark.parametrize("with_law", [True, False])
def test_subset_by_hand(with_law):
    sub = _hand_data(with_law).subset([2, 0])
    assert sub.tokens.tolist() == [105, 106, 107, 108, 100, 101, 102]
    assert sub.feats.flatten().tolist() == [5, 6, 7, 8, 0, 1, 2]
    assert sub.starts.tolist() == [0, 4] and sub.lengths.tolist() == [4, 3]
    assert sub.prompt_lens.tolist() == [2, 1] and sub.num_sequences == 2
    if with_law:
        assert sub.soft_ids.tolist() == [[r, r + 50] for r in (5, 6, 7, 8, 0, 1, 2)]
        assert sub.soft_p[:, 0].tolist() == pytest.approx([r / 100 for r in (5, 6, 7, 8, 0, 1,
                                                                           2)])
    else:
        assert sub.soft_ids is None and sub.soft_p is None
    one = _hand_data(with_law).subset([1])
    assert one.tokens.tolist() == [103, 104] and one.starts.tolist() == [0]


@pytest.mark.parametrize("soft_top", [0, 1, 3])
def test_build_distill_data_is_prompt_and_continuation(target, progress, soft_top):
    prompts = PROMPTS[:3]
    data = generate.build_distill_data(ModelPair(target, None), BACKEND, prompts, 4,
                                       [0.0, 0.0, 0.0], 2, 5, soft_top=soft_top)
    seqs = [p + _greedy(target, p, 4) for p in prompts]
    assert data.tokens.tolist() == [t for s in seqs for t in s]
    assert data.lengths.tolist() == [7, 9, 5] and data.starts.tolist() == [0, 7, 16]
    assert data.prompt_lens.tolist() == [3, 5, 1]
    assert [r.phase for r in progress] == ["generate"]
    for s, seq in enumerate(seqs):
        rows = slice(int(data.starts[s]), int(data.starts[s]) + len(seq))
        out = target_mod.lm_forward(target, [seq])
        torch.testing.assert_close(data.feats[rows], out.taps[0], rtol=1e-9, atol=1e-9)
        if soft_top:
            for i, row in enumerate(out.logits[0].tolist()):
                want_ids, want_p = _law(row, soft_top)
                assert data.soft_ids[rows][i].tolist() == want_ids
                assert data.soft_p[rows][i].tolist() == pytest.approx(want_p, rel=1e-5,
                                                                     abs=1e-7)
    if not soft_top:
        assert data.soft_ids is None and data.soft_p is None
        bare = generate.build_distill_data(ModelPair(target, None), BACKEND, prompts, 4,
                                           [0.0, 0.0, 0.0], 3, 5)          # no law by default
        assert bare.soft_ids is None and torch.equal(bare.tokens, data.tokens)
