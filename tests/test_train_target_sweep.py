"""The recipe's target model pieces (``dflash2rt.train.target``) against their definitions: the
default shape and its config against the bundled target's config.json; ``init_weights`` by a
replay of its seeded draws; the token stream and windows by hand (a stream too short for a
window is a typed error); the padded forwards row by row against unpadded single-row forwards;
the learning-rate schedule and the optimizer's groups by hand; ``train_target``'s loop with its
optimizer and progress replaced by recorders (so nothing trains); ``eval_stats`` by float64
loops over the seeded windows."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

import dflash2rt.train.target as target_mod
from dflash2rt.bundled import bundled_path
from dflash2rt.errors import InvalidInputError
from dflash2rt.models.config import TargetConfig
from dflash2rt.models.target import TargetModel

from test_distill_sweep import FakeOptimizer, FakeProgress
from tiny_models import VOCAB, tiny_pair

pytestmark = pytest.mark.usefixtures("one_thread")   # tests/conftest.py


# ---------------------------------------------------------------- shape, config, init

def test_the_default_shape_is_the_bundled_targets_config():
    """The bundled stdlib-code target was trained with the default shape: its config.json is
    ``target_config_dict`` of ``TargetShape()`` (its tokenizer's 2048 ids, EOS 0)."""
    want = json.loads((bundled_path("stdlib-code") / "target" / "config.json")
                      .read_text(encoding="utf-8"))
    assert target_mod.target_config_dict(target_mod.TargetShape(), 2048, 0) == want


def test_a_shape_is_immutable_and_hashable():
    shape = target_mod.TargetShape()
    with pytest.raises(dataclasses.FrozenInstanceError):
        shape.layers = 2
    assert hash(shape) == hash(target_mod.TargetShape()) and shape.layers == 8


def test_config_dict_takes_every_field_of_the_shape():
    shape = target_mod.TargetShape(hidden=40, layers=3, heads=5, kv_heads=5, head_dim=8,
                                   intermediate=72, max_position=96)
    d = target_mod.target_config_dict(shape, 77, 5)
    assert {k: d[k] for k in ("vocab_size", "hidden_size", "num_hidden_layers",
                              "num_attention_heads", "num_key_value_heads", "head_dim",
                              "intermediate_size", "max_position_embeddings", "eos_token_id",
                              "pad_token_id", "bos_token_id", "tie_word_embeddings")} == \
        {"vocab_size": 77, "hidden_size": 40, "num_hidden_layers": 3, "num_attention_heads": 5,
         "num_key_value_heads": 5, "head_dim": 8, "intermediate_size": 72,
         "max_position_embeddings": 96, "eos_token_id": 5, "pad_token_id": 5,
         "bos_token_id": None, "tie_word_embeddings": False}
    assert d["rms_norm_eps"] == 1e-6 and d["rope_theta"] == 10000.0


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj = torch.nn.Linear(3, 4)                 # a matrix and a vector (bias)
        self.o_proj = torch.nn.Linear(4, 3, bias=False)
        self.down_proj = torch.nn.Linear(5, 3, bias=False)
        self.input_layernorm = torch.nn.Module()
        self.input_layernorm.weight = torch.nn.Parameter(torch.zeros(3))


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(6, 3)
        self.layer = _Block()


@pytest.mark.parametrize("std, layers", [(None, None), (0.05, 3)])
def test_init_weights_replays_its_seeded_draws(std, layers):
    """In sorted name order: vectors (norms, biases) are ones and draw nothing; matrices draw
    N(0, 1) × std, output projections (o_proj, down_proj) × std / sqrt(2 × layers); by default
    std 0.02 and one layer."""
    net = _Net()
    if std is None:
        target_mod.init_weights(net, torch.Generator().manual_seed(7))
        std, layers = 0.02, 1
    else:
        target_mod.init_weights(net, torch.Generator().manual_seed(7), std=std,
                                residual_layers=layers)
    order = ["embed_tokens.weight", "layer.down_proj.weight", "layer.input_layernorm.weight",
             "layer.o_proj.weight", "layer.q_proj.bias", "layer.q_proj.weight"]
    params = dict(net.named_parameters())
    assert sorted(params) == order
    out_scale = std / (2 * layers) ** 0.5
    gen = torch.Generator().manual_seed(7)
    for name in order:
        p = params[name]
        if p.dim() == 1:
            assert torch.equal(p, torch.ones(p.shape)), name
            continue
        scale = out_scale if "o_proj" in name or "down_proj" in name else std
        draw = torch.randn(p.shape, generator=gen).double() * scale
        assert (p.double() - draw).abs().max() <= 1e-6 * scale, name


def test_init_weights_of_a_target_with_its_layer_count():
    shape = target_mod.TargetShape(hidden=16, layers=2, heads=2, kv_heads=1, head_dim=8,
                                   intermediate=24, max_position=32)
    model = TargetModel(TargetConfig.from_dict(target_mod.target_config_dict(shape, 11, 0)),
                        (0, 1))
    target_mod.init_weights(model, torch.Generator().manual_seed(3), residual_layers=2)
    gen = torch.Generator().manual_seed(3)
    for name, p in sorted(model.named_parameters()):
        if p.dim() == 1:
            assert torch.equal(p, torch.ones(p.shape)), name
            continue
        scale = 0.01 if name.endswith(("o_proj.weight", "down_proj.weight")) else 0.02
        draw = torch.randn(p.shape, generator=gen).double() * scale
        assert (p.double() - draw).abs().max() <= 1e-6 * scale, name


# ---------------------------------------------------------------- the stream and its windows

def test_token_stream_puts_eos_after_each_document():
    got = target_mod.token_stream([[5, 6], [], [7]], 9)
    assert got.dtype == torch.int64 and got.tolist() == [5, 6, 9, 9, 7, 9]
    assert target_mod.token_stream([], 1).tolist() == []


def test_windows_are_contiguous_at_seeded_starts_before_the_last_window():
    """Starts are drawn by ``torch.randint(0, N - length)`` from the generator: every start in
    0 .. N - length - 1 appears in a large batch, and none later."""
    stream = torch.arange(100, 112)
    got = target_mod.sample_windows(stream, 200, 5, torch.Generator().manual_seed(3))
    assert got.shape == (200, 5)
    starts = (got[:, 0] - 100).tolist()
    assert set(starts) == set(range(7))
    for s, row in zip(starts, got.tolist()):
        assert row == list(range(100 + s, 105 + s))
    want = torch.randint(0, 7, (200,), generator=torch.Generator().manual_seed(3))
    assert starts == want.tolist()


@pytest.mark.parametrize("n, length", [(5, 5), (3, 5), (0, 1)])
def test_a_stream_without_room_for_a_window_is_a_typed_error(n, length):
    """A window needs at least one token more than its length in the stream (the starts are
    drawn below N - length): shorter streams are refused by name, in training and evaluation
    too."""
    stream, gen = torch.arange(n), torch.Generator().manual_seed(0)
    msg = (f"a stream of {n} tokens is too short for windows of {length} tokens "
           f"\\(it needs at least {length + 1}\\)")
    with pytest.raises(InvalidInputError, match=msg):
        target_mod.sample_windows(stream, 2, length, gen)
    assert target_mod.sample_windows(torch.arange(length + 1), 3, length, gen).tolist() == \
        [list(range(length))] * 3


def test_training_and_evaluation_on_a_too_short_stream_are_typed_errors(target, recorders):
    with pytest.raises(InvalidInputError, match="a stream of 6 tokens is too short"):
        target_mod.eval_stats(target, torch.arange(6), 1, 6, 0)
    model = tiny_pair("dflash2", block=4, seed=5).target
    with pytest.raises(InvalidInputError, match="a stream of 6 tokens is too short"):
        target_mod.train_target(model, torch.arange(6), 1, 1, 5, 0.01, 0)
    assert FakeOptimizer.made[0].steps == []


# ---------------------------------------------------------------- the forwards

def _single(model, seq):
    """The unpadded one-row forward of ``seq`` at positions 0 .. len - 1."""
    ids = torch.tensor([seq])
    n = len(seq)
    return model.forward_full(ids, torch.arange(n).view(1, n), torch.ones(1, n, dtype=torch.bool))


@pytest.fixture(scope="module")
def target():
    return tiny_pair("dflash2", block=4, seed=5).target


def test_lm_logits_rows_are_their_single_row_forwards(target):
    ids = torch.tensor([[3, 9, 27, 14, 5], [40, 2, 2, 33, 60]])
    got = target_mod.lm_logits(target, ids)
    assert got.shape == (2, 5, VOCAB)
    for r in range(2):
        want = _single(target, ids[r].tolist()).logits[0]
        assert (got[r] - want).abs().max() < 1e-12
    assert (target_mod.lm_logits(target, ids[:, :3]) - got[:, :3]).abs().max() < 1e-12


def test_lm_forward_pads_on_the_right_and_keeps_each_rows_values(target):
    seqs = [[3, 9, 27, 14, 5], [40, 2], [8, 8, 1, 59]]
    out = target_mod.lm_forward(target, seqs)
    taps = target_mod.lm_taps(target, seqs)
    assert out.logits.shape == (3, 5, VOCAB) and taps.shape[:2] == (3, 5)
    assert torch.equal(taps, out.taps)
    for r, seq in enumerate(seqs):
        want = _single(target, seq)
        n = len(seq)
        assert (out.logits[r, :n] - want.logits[0]).abs().max() < 1e-12
        assert (out.taps[r, :n] - want.taps[0]).abs().max() < 1e-12


# ---------------------------------------------------------------- schedule and optimizer

@pytest.mark.parametrize("step, total, warmup, floor, want", [
    (0, 10, 2, 0.1, 0.5), (1, 10, 2, 0.1, 1.0), (2, 10, 2, 0.1, 1.0),
    (6, 10, 2, 0.1, 0.55), (4, 10, 2, 0.1, 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 4))),
    (10, 10, 2, 0.1, 0.1), (10, 10, 2, 0.0, 0.0), (6, 10, 2, 0.5, 0.75),
    (0, 10, 0, 0.1, 1.0), (5, 5, 5, 0.1, 1.0), (6, 5, 5, 0.1, 0.1), (3, 4, 3, 0.1, 1.0),
    (4, 4, 3, 0.1, 0.1)])
def test_cosine_lr_by_hand(step, total, warmup, floor, want):
    """Linear warmup to the peak over ``warmup`` steps, then a half cosine from the peak to
    ``floor`` × peak over the remaining ``total - warmup`` steps (at least one)."""
    got = target_mod.cosine_lr(step, total, 2.0, warmup, floor)
    assert got == pytest.approx(2.0 * want, rel=1e-12, abs=1e-15)


def test_optimizer_decays_matrices_only_and_skips_frozen_parameters():
    net = _Net()
    net.layer.o_proj.weight.requires_grad_(False)
    opt = target_mod.make_optimizer(net, 0.03, 0.2)
    decay, keep = opt.param_groups
    assert isinstance(opt, torch.optim.AdamW)
    ids = lambda ps: sorted(id(p) for p in ps)  # noqa: E731
    assert ids(decay["params"]) == ids([net.layer.q_proj.weight, net.layer.down_proj.weight])
    assert ids(keep["params"]) == ids([net.embed_tokens.weight, net.layer.q_proj.bias,
                                       net.layer.input_layernorm.weight])
    assert (decay["weight_decay"], keep["weight_decay"]) == (0.2, 0.0)
    assert all(g["lr"] == 0.03 and g["betas"] == (0.9, 0.95) for g in (decay, keep))
    opt = target_mod.make_optimizer(net, 0.03, 0.2, no_decay=("down_proj", "nothing"))
    decay, keep = opt.param_groups
    assert ids(decay["params"]) == ids([net.embed_tokens.weight, net.layer.q_proj.weight])
    assert ids(keep["params"]) == ids([net.layer.q_proj.bias, net.layer.input_layernorm.weight,
                                       net.layer.down_proj.weight])


# ---------------------------------------------------------------- train_target

@pytest.fixture
def recorders(monkeypatch):
    FakeOptimizer.made, FakeProgress.made = [], []
    monkeypatch.setattr(target_mod, "make_optimizer", FakeOptimizer)
    monkeypatch.setattr(target_mod, "Progress", FakeProgress)


def _ce64(logits, labels):
    """Mean next-token cross-entropy by a float64 loop (log-sum-exp by hand)."""
    rows = logits.reshape(-1, logits.shape[-1]).double().tolist()
    total = 0.0
    for row, y in zip(rows, labels.reshape(-1).tolist()):
        m = max(row)
        total += m + math.log(sum(math.exp(v - m) for v in row)) - row[y]
    return total / len(rows)


def _lr(step, steps, peak):
    warm = min(100, steps // 10 + 1)
    if step < warm:
        return peak * (step + 1) / warm
    return peak * (0.1 + 0.45 * (1 + math.cos(math.pi * (step - warm) / max(1, steps - warm))))


@pytest.mark.parametrize("steps, every", [(12, 5), (22, None)])
def test_train_target_loop(recorders, steps, every):
    """Windows of ``seq_len + 1`` tokens drawn from the seeded generator, the loss the mean
    next-token cross-entropy of each window, the warmed-up cosine rate, gradients clipped to
    norm 1, progress with the mean of the last ``every`` (default 20) losses, eval mode and no
    gradients after."""
    model = tiny_pair("dflash2", block=4, seed=5).target
    stream = torch.tensor([(7 * i * i + 3 * i + 1) % VOCAB for i in range(40)])
    batch, seq_len = 2, 6
    given = {} if every is None else {"every": every}
    every = 20 if every is None else every
    losses = target_mod.train_target(model, stream, steps, batch, seq_len, 0.004, 9, **given)
    [opt], [prog] = FakeOptimizer.made, FakeProgress.made
    assert opt.args == (0.004, 0.1, ())
    assert (prog.phase, prog.total, prog.every) == ("target", steps, every)
    assert not model.training and not any(p.requires_grad for p in model.parameters())
    gen, wins = torch.Generator().manual_seed(9), []
    for _ in range(steps):
        starts = torch.randint(0, 40 - seq_len - 1, (batch,), generator=gen).tolist()
        wins.append(torch.stack([stream[s:s + seq_len + 1] for s in starts]))
    assert len(losses) == steps
    for win, loss in zip(wins, losses):
        logits = target_mod.lm_forward(model, win[:, :-1].tolist()).logits
        assert loss == pytest.approx(_ce64(logits, win[:, 1:]), rel=1e-9)
    assert opt.zeroed == steps
    assert [lr for lr, _, _ in opt.steps] == pytest.approx([_lr(s, steps, 0.004)
                                                            for s in range(steps)], rel=1e-12)
    assert all(training for _, training, _ in opt.steps)
    assert all(0.0 < norm <= 1.0 + 1e-9 for _, _, norm in opt.steps)
    # step 0's gradient: that of the loss, clipped to norm 1
    model.requires_grad_(True)
    logits = target_mod.lm_forward(model, wins[0][:, :-1].tolist()).logits
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), wins[0][:, 1:].flatten())
    grads = torch.autograd.grad(loss, list(model.parameters()))
    model.requires_grad_(False)
    raw = math.sqrt(sum(float((g ** 2).sum()) for g in grads))
    coef = min(1.0, 1.0 / (raw + 1e-6))
    for got, g in zip(opt.first_grads, grads):
        assert (got - coef * g).abs().max() <= 1e-9 * max(raw * coef, 1e-3)
    assert [c[:2] for c in prog.calls] == [(i + 1, batch * seq_len) for i in range(steps)]
    for i, (_, _, metrics) in enumerate(prog.calls):
        recent = losses[max(0, i + 1 - every):i + 1]
        assert metrics == pytest.approx({"loss": sum(recent) / len(recent),
                                         "lr": _lr(i, steps, 0.004)}, rel=1e-12), i


def test_train_target_warms_up_for_at_most_100_steps(recorders, monkeypatch):
    """1000 steps: a 100-step warmup (the forward replaced by a constant one, so that the steps
    are cheap)."""
    param = torch.nn.Parameter(torch.zeros(1))

    def logits(model, ids):
        return torch.zeros(*ids.shape, 4) + param * 0

    monkeypatch.setattr(target_mod, "lm_logits", logits)
    model = torch.nn.Linear(1, 1)
    losses = target_mod.train_target(model, torch.arange(20) % 4, 1000, 1, 2, 0.01, 0,
                                     every=1000)
    assert losses == pytest.approx([math.log(4)] * 1000, rel=1e-6)
    [opt] = FakeOptimizer.made
    got = [lr for lr, _, _ in opt.steps]
    assert got == pytest.approx([_lr(s, 1000, 0.01) for s in range(1000)], rel=1e-12)
    assert got[99] == pytest.approx(0.01, rel=1e-12) and got[98] == pytest.approx(0.0099)


# ---------------------------------------------------------------- eval_stats

@pytest.mark.parametrize("windows, seq_len, seed", [(1, 5, 0), (3, 6, 4)])
def test_eval_stats_are_float64_means_over_the_seeded_windows(target, windows, seq_len, seed):
    """Per window (drawn as ``sample_windows`` draws, one at a time): the mean over its
    positions of -log p(next token) and of the entropy -Σ p log p of the model's law; both
    averaged over the windows."""
    stream = torch.tensor([(5 * i * i + i + 2) % VOCAB for i in range(30)])
    got = target_mod.eval_stats(target, stream, windows, seq_len, seed)
    gen = torch.Generator().manual_seed(seed)
    loss = ent = 0.0
    for _ in range(windows):
        s = int(torch.randint(0, 30 - seq_len - 1, (1,), generator=gen))
        win = stream[s:s + seq_len + 1].tolist()
        rows = target_mod.lm_forward(target, [win[:-1]]).logits[0].double().tolist()
        w_loss = w_ent = 0.0
        for row, y in zip(rows, win[1:]):
            m = max(row)
            lse = m + math.log(sum(math.exp(v - m) for v in row))
            w_loss += lse - row[y]
            w_ent -= sum(math.exp(v - lse) * (v - lse) for v in row)
        loss += w_loss / seq_len
        ent += w_ent / seq_len
    assert set(got) == {"loss", "entropy"}
    assert got["loss"] == pytest.approx(loss / windows, rel=1e-10)
    assert got["entropy"] == pytest.approx(ent / windows, rel=1e-10)
    assert 0.0 < got["entropy"] < math.log(VOCAB)
