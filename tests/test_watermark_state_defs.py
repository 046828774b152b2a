"""The watermark batch's construction, step inputs and keyed marks (``watermark/generate.py``)
against the module's docstrings written anew over plain lists, row by row: the window holds the
last ``width`` prompt tokens with -1 before the start; a step body's inputs read back the same
state and key; ``Marks.emit`` draws under subkey B at the emitting slot's context where fresh,
else keeps the ordinary draw; ``Marks.noise`` keys the acceptance coins of fresh slots only.

Classes of bug held: a short prompt's window padded with another value than -1; a state that
does not survive the round trip through a step body's inputs; a next-token draw of one row, or
of another slot; keyed coins where a context was used before, or the ordinary ones where fresh."""

from __future__ import annotations

import torch

from dflash2rt.ops.batch import BlockNoise
from dflash2rt.watermark import WatermarkKey
from dflash2rt.watermark.generate import INPUTS, PADS, Marks, WatermarkBatch
from dflash2rt.watermark.sampler import coin, draw_dense
from dflash2rt.watermark.values import context_hash

KEY = WatermarkKey(bytes(range(7, 39)))


def ctx_of(seq, width):
    """The context of the position after ``seq``: its last ``width`` tokens, -1 before 0."""
    window = ([-1] * width + list(seq))[-width:]
    return int(context_hash(torch.tensor([window], dtype=torch.int64))[0])


def test_build_pads_short_prompts_with_minus_one_and_starts_empty():
    prompts = [(), (5,), (1, 2, 3), (1, 2, 3, 4, 5, 6), (9, 8, 7, 6)]
    wm = WatermarkBatch.build(KEY, prompts, 8, 4, "cpu")
    assert wm.window.tolist() == [([-1] * 4 + list(p))[-4:] for p in prompts]
    assert wm.record.tolist() == [[0] * 8] * len(prompts)
    assert wm.used.tolist() == [0] * len(prompts)
    assert wm.shape == (4, 8)
    subs = (KEY.draft, KEY.target, KEY.coin)
    assert wm.words.tolist() == [[w for s in subs for w in (s.k0, s.k1, s.word)]] * len(prompts)


def test_a_padded_row_is_the_state_of_an_empty_request():
    """``PADS`` fills a padded row's window, record and used as ``build`` leaves a request
    with no prompt: -1 before the start, nothing recorded."""
    empty = WatermarkBatch.build(KEY, [()], 3, 5, "cpu")
    assert [PADS["wm_window"]] * 5 == empty.window[0].tolist()
    assert [PADS["wm_record"]] * 3 == empty.record[0].tolist()
    assert PADS["wm_used"] == int(empty.used[0]) == 0
    assert set(PADS) == set(INPUTS)


def test_a_step_bodys_inputs_read_back_the_same_state_and_key():
    prompts = [(3, 1, 4, 1, 5), (2,), (6, 6)]
    wm = WatermarkBatch.build(KEY, prompts, 12, 3, "cpu")
    toks = torch.tensor([[1, 2, 3, 4], [5, 5, 5, 5], [0, 7, 0, 7]])
    wm.commit_(toks, torch.tensor([4, 1, 3]))
    inp = wm.inputs()
    assert list(inp) == list(INPUTS)
    back = WatermarkBatch.of_inputs(inp)
    assert back.width == 3 and back.shape == (3, 12)
    for a, b in ((back.window, wm.window), (back.record, wm.record), (back.used, wm.used),
                 (back.words, wm.words)):
        assert torch.equal(a, b)
    seqs = [list(p) + t[:c] for p, t, c in zip(prompts, toks.tolist(), (4, 1, 3))]
    law = torch.softmax(torch.linspace(-2, 2, 11, dtype=torch.float64), 0).expand(3, 11)
    got = back.marks(torch.zeros(3, 0, dtype=torch.int64), True)
    assert got.ctx[:, 0].tolist() == [ctx_of(s, 3) for s in seqs]
    drawn = got.emit(law, torch.zeros(3, dtype=torch.int64), torch.full((3,), -5))
    want = [int(draw_dense(KEY.target, torch.tensor([ctx_of(s, 3)]), law[:1])[0]) for s in seqs]
    assert drawn.tolist() == want


def test_emit_draws_keyed_at_each_rows_own_slot_where_fresh():
    gen = torch.Generator().manual_seed(3)
    r, s, v = 4, 3, 9
    ctx = torch.randint(-2**40, 2**40, (r, s), generator=gen)
    fresh = torch.tensor([[True, False, True], [False, True, True], [True, True, False],
                          [False, False, True]])
    law = torch.softmax(torch.randn(r, v, generator=gen, dtype=torch.float64), -1)
    plain = torch.tensor([-1, -2, -3, -4])
    for slots in ([0, 1, 2, 0], [2, 0, 1, 2], [1, 2, 0, 1]):
        got = Marks(KEY, ctx, fresh, True).emit(law, torch.tensor(slots), plain).tolist()
        for i, j in enumerate(slots):
            if fresh[i, j]:
                want = int(draw_dense(KEY.target, ctx[i, j:j + 1], law[i:i + 1])[0])
            else:
                want = -1 - i
            assert got[i] == want, (slots, i)


def test_noise_keys_the_acceptance_coins_of_fresh_slots_only():
    gen = torch.Generator().manual_seed(4)
    r, g = 3, 4
    ctx = torch.randint(-2**40, 2**40, (r, g + 1), generator=gen)
    fresh = torch.tensor([[True, False, True, True, False], [False, False, False, False, True],
                          [True, True, True, True, True]])
    walk, residual = torch.rand(r, g, generator=gen), torch.rand(r, g, generator=gen)
    accept, bonus = torch.full((r, g), 2.0), torch.rand(r, generator=gen)
    out = Marks(KEY, ctx, fresh, True).noise(BlockNoise(walk, accept, residual, bonus))
    assert torch.equal(out.walk, walk) and torch.equal(out.residual, residual)
    assert torch.equal(out.bonus, bonus)
    for i in range(r):
        for j in range(g):
            want = float(coin(KEY.coin, ctx[i, j:j + 1])[0]) if fresh[i, j] else 2.0
            assert float(out.accept[i, j]) == want, (i, j)


def test_the_key_is_read_from_row_zero_beside_padded_rows():
    """Padded rows hold ``PADS`` (words 0, not the key): a body's batch of one live row and
    padded rows draws under the batch's key."""
    live = WatermarkBatch.build(KEY, [(4, 2)], 6, 2, "cpu").inputs()
    inp = {n: torch.cat([t, torch.full((2,) + tuple(t.shape[1:]), PADS[n], dtype=t.dtype)])
           for n, t in live.items()}
    back = WatermarkBatch.of_inputs(inp)
    law = torch.softmax(torch.linspace(1, -1, 13, dtype=torch.float64), 0).expand(3, 13)
    m = back.marks(torch.zeros(3, 0, dtype=torch.int64), True)
    got = int(m.emit(law, torch.zeros(3, dtype=torch.int64), torch.full((3,), -5))[0])
    assert got == int(draw_dense(KEY.target, torch.tensor([ctx_of((4, 2), 2)]), law[:1])[0])
    c = ctx_of((4, 2), 2)
    assert float(coin(back.key.coin, torch.tensor([c]))[0]) == float(coin(KEY.coin,
                                                                            torch.tensor([c]))[0])
