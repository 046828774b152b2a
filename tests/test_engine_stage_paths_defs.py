"""The decode stages' paths (``engine/stages.py``) against their documented contracts, each checked
by a computation of its own: the selector's width per variant written out from the draft config,
a masked walk against the tokens the mask bans, deferred draft context caught up against a
prefill of the committed sequence, packed logprobs against log_softmax and float32 bits read
with ``struct``, a NaN row flagged as its own beside good rows.

Classes of bug held: a DFlash2 draft selecting one candidate per slot (or v1 more than one); a
walk mask that never reaches the walk; a catch-up that projects other positions or another side
buffer (rows of different lengths); a target-only step of one row only; logprobs dropped when
asked; a bad row that raises instead of being flagged."""

from __future__ import annotations

import dataclasses
import math
import struct
from types import SimpleNamespace

import pytest
import torch

from dflash2rt import get_backend
from dflash2rt.backend import Fallbacks
from dflash2rt.engine import stages
from dflash2rt.engine.engine import Engine
from dflash2rt.engine.extensions import RowExtension
from dflash2rt.engine.request import Request, SamplingParams
from dflash2rt.ops.selector import SelectorParams

from tiny_models import tiny_pair

PROMPTS = [(1, 2, 3), (5, 9, 11, 13, 17), (7,)]
TEMPS = (0.0, 1.0, 0.7)


def _reqs(temps=TEMPS, n=12, seed=5, **kw):
    return [Request(p, SamplingParams(max_new_tokens=n, temperature=t, seed=seed,
                                      ignore_eos=True, **kw)) for p, t in zip(PROMPTS, temps)]


def _started(pair, reqs, block):
    """An eager cpu runner's batch after prefill, and each row's first token."""
    engine = Engine(pair, get_backend("cpu"))
    st = engine.runner.start(reqs, True, block, None, Fallbacks().report, {})
    first = engine.runner.prefill(st, [q.prompt_ids for q in reqs])
    return engine, st, [h[0] for h in first]


def _with(st, ext):
    return dataclasses.replace(st, extensions=tuple(st.extensions) + (ext,))


def _cfg_pair(variant):
    cfg = SimpleNamespace(variant=variant, selector_top_k=5, output_multiplier=0.5,
                          final_logit_softcapping=3.0)
    return SimpleNamespace(draft=SimpleNamespace(cfg=cfg))


def test_the_selector_width_is_one_for_v1_and_the_trained_top_k_for_v2():
    assert stages.selector_params(_cfg_pair("dflash1")) == SelectorParams(1, 0.5, 3.0)
    assert stages.selector_params(_cfg_pair("dflash2")) == SelectorParams(5, 0.5, 3.0)
    assert stages.selector_params(tiny_pair("dflash2", block=4)) == SelectorParams(4, 0.5, 10.0)


def test_a_v1_draft_hands_the_selector_empty_codebooks_of_the_vocabulary(monkeypatch):
    """Without a lattice the codebooks are [V, 0] and the projection [R, γ, 0] (the select
    contract's shapes with rank 0), so a backend indexing them by token id stays in bounds."""
    pair, block = tiny_pair("dflash1", block=4, seed=4), 4
    with torch.inference_mode():
        engine, st, _ = _started(pair, _reqs(), block)
        seen = []
        real = engine.backend.select

        def spy(*args):
            seen.append([tuple(a.shape) for a in args[:5]])
            return real(*args)
        monkeypatch.setattr(engine.backend, "select", spy)
        h = stages.draft_block(pair, st, engine.backend, stages.block_positions(st, block), None)
        noise = engine.backend.noise(st.seed, st.key, st.lens, block - 1)
        stages.select_block(pair, st, engine.backend, h, noise)
    v, r, g = pair.target.cfg.vocab_size, len(PROMPTS), block - 1
    assert seen == [[(r, g, v), (r, g, 0), (r,), (v, 0), (v, 0)]]


class _Ban:
    """A walk mask that forbids token ``banned[r, j]`` at slot j of row r, whatever the path."""

    def __init__(self, banned):
        self.banned, self.asked = banned, []

    def allowed(self, slot, cand):
        self.asked.append(slot)
        return cand != self.banned[:, slot:slot + 1]

    def advance(self, token):
        pass


class _MaskExt(RowExtension):
    def __init__(self, mask):
        self.mask = mask

    def walk_mask(self):
        return self.mask


def test_a_walk_mask_reaches_the_walk():
    """Banning the tokens the unmasked walk drew changes every slot of every row (greedy and
    sampled), each to one of the slot's candidates."""
    pair, block = tiny_pair("dflash2", block=4, seed=2), 4
    with torch.inference_mode():
        engine, st, _ = _started(pair, _reqs(), block)
        h = stages.draft_block(pair, st, engine.backend, stages.block_positions(st, block), None)
        noise = engine.backend.noise(st.seed, st.key, st.lens, block - 1)
        plain = stages.select_block(pair, st, engine.backend, h, noise)
        mask = _Ban(plain.draft.clone())
        got = stages.select_block(pair, _with(st, _MaskExt(mask)), engine.backend, h, noise)
    assert sorted(set(mask.asked)) == list(range(block - 1))
    for r in range(len(PROMPTS)):
        for j in range(block - 1):
            assert int(got.draft[r, j]) != int(plain.draft[r, j]), (r, j)
            assert int(got.draft[r, j]) in got.candidates[r, j].tolist(), (r, j)
    assert not got.bad.any()


def test_deferred_draft_context_caught_up_equals_a_prefill_of_the_committed_sequence():
    """k target-only steps commit the draft context to the side buffer only; ``catch_up_draft``
    of k then leaves the draft cache (rows of three lengths) as a prefill of prompt + the k
    committed tokens writes it, and the last target-only token is that prefill's first."""
    pair, block, k = tiny_pair("dflash2", block=4, seed=6), 4, 3
    reqs = _reqs()
    with torch.inference_mode():
        engine, st, first = _started(pair, reqs, block)
        seqs = [list(p) for p in PROMPTS]
        anchor = list(first)
        for _ in range(k):
            token, bad, out, pos, lp = stages.target_only_forward(pair, st, engine.backend, None)
            assert pos.tolist() == [[len(s)] for s in seqs]
            assert lp is None and not bad.any()
            count = torch.ones_like(token)
            before = [t.clone() for t in st.draft_storage.k]
            stages.commit_kv(pair, st, out, pos, count, defer_draft=True)
            for b, a in zip(before, st.draft_storage.k):                 # K/V untouched
                assert torch.equal(b, a)
            for i in range(len(seqs)):
                seqs[i].append(anchor[i])
            anchor = token.tolist()
            st.lens.add_(1)
            st.anchor.copy_(token)
            stages.commit(st, token.view(-1, 1), count)
        stages.catch_up_draft(pair, st, k)
        ref = Engine(pair, get_backend("cpu")).runner.start(reqs, True, block, None, print, {})
        pre = stages.prefill(pair, ref, engine.backend, [tuple(s) for s in seqs])
    assert st.lens.tolist() == [len(s) for s in seqs]
    assert pre.token.tolist() == anchor
    for i, s in enumerate(seqs):
        n = len(s)
        for got, want in zip(st.draft_storage.k + st.draft_storage.v,
                             ref.draft_storage.k + ref.draft_storage.v):
            torch.testing.assert_close(got[i, :n], want[i, :n])


def _f32(bits):
    return struct.unpack("<f", struct.pack("<i", bits))[0]


def test_target_only_logprobs_are_the_raw_log_softmax_of_each_row():
    pair, block, n = tiny_pair("dflash2", block=4, seed=3), 4, 2
    with torch.inference_mode():
        engine, st, _ = _started(pair, _reqs(logprobs=n), block)
        token, bad, out, pos, lp = stages.target_only_forward(pair, st, engine.backend, None)
        _, st0, _ = _started(pair, _reqs(), block)
        assert stages.target_only_forward(pair, st0, engine.backend, None)[4] is None
    assert lp is not None and lp.shape == (len(PROMPTS), 1 + 2 * n)
    logits = out.logits[:, 0].double().tolist()
    for r, row in enumerate(logits):
        top = max(row)
        lse = top + math.log(sum(math.exp(x - top) for x in row))
        want = [x - lse for x in row]
        vals = lp[r].tolist()
        assert math.isclose(_f32(vals[0]), want[int(token[r])], abs_tol=1e-5), r
        ids = vals[1 + n:]
        assert ids == sorted(range(len(row)), key=lambda v: -want[v])[:n], r
        for v, bits in zip(ids, vals[1:1 + n]):
            assert math.isclose(_f32(bits), want[v], abs_tol=1e-5), (r, v)


class _NanRow(RowExtension):
    """Processing that makes every target logit of row ``row`` NaN."""

    def __init__(self, row):
        self.row = row

    def process(self, logits, draft=None):
        logits = logits.clone()
        logits[self.row] = float("nan")
        return logits


@pytest.mark.parametrize("rule", ["token", "block"])
def test_a_nan_verify_row_is_flagged_beside_good_rows_not_raised(rule):
    """Under either verification rule (block rows take the torch ops' verify)."""
    pair, block = tiny_pair("dflash2", block=4, seed=2), 4
    for row in range(len(PROMPTS)):
        with torch.inference_mode():
            engine, st, _ = _started(pair, _reqs(verification=rule), block)
            pos = stages.block_positions(st, block)
            h = stages.draft_block(pair, st, engine.backend, pos, None)
            noise = engine.backend.noise(st.seed, st.key, st.lens, block - 1)
            sel = stages.select_block(pair, st, engine.backend, h, noise)
            _, ver, _ = stages.verify_block(pair, _with(st, _NanRow(row)), engine.backend, sel,
                                            noise, pos, None)
        assert ver.bad.tolist() == [r == row for r in range(len(PROMPTS))], row
