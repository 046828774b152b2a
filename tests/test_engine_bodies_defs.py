"""The step bodies against their documented contract: flag bits as the bytes of one 32-bit word
(``int.from_bytes`` in the machine's order), the host's first bad source row by row, and each
body's arithmetic (positions, noise, committed counts, lengths, anchors) against loops over
fake stages that record what they were given."""

from __future__ import annotations

import importlib.util
import itertools
import sys
from types import SimpleNamespace

import pytest
import torch

from dflash2rt.engine import bodies as bodies_module
from dflash2rt.engine.bodies import (BAD_DRAFT, BAD_LATTICE, BAD_Q, BAD_TARGET, NOISE,
                                     StepBodies, StepOut, live_inputs, pack_flags, raise_flags)
from dflash2rt.errors import InvalidInputError, NonFiniteLogitsError
from dflash2rt.ops.batch import SamplingBatch
from dflash2rt.engine.state import BatchState


def word(target=0, q=0, draft=0, lattice=0) -> int:
    """The 32-bit word whose bytes, in memory order, are the four conditions."""
    return int.from_bytes(bytes([int(target), int(q), int(draft), int(lattice)]), sys.byteorder)


# ---- flag bits --------------------------------------------------------------------------------
def test_each_flag_is_one_byte_of_the_word():
    assert (BAD_TARGET, BAD_Q, BAD_DRAFT, BAD_LATTICE) == \
        (word(1), word(0, 1), word(0, 0, 1), word(0, 0, 0, 1))


@pytest.mark.parametrize("order", ["little", "big"])
def test_the_flag_bits_in_either_byte_order(monkeypatch, order):
    """The module loaded anew as if on a host of each byte order: its bits are that order's
    bytes, and a target-only word is the target's bit (computed without the byte view)."""
    monkeypatch.setattr(sys, "byteorder", order)
    spec = importlib.util.spec_from_file_location("dflash2rt.engine._bodies_" + order,
                                                  bodies_module.__file__)
    fresh = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fresh)
    bits = [int.from_bytes(bytes(1 if j == i else 0 for j in range(4)), order)
            for i in range(4)]
    assert [fresh.BAD_TARGET, fresh.BAD_Q, fresh.BAD_DRAFT, fresh.BAD_LATTICE] == bits
    got = fresh.pack_flags(torch.tensor([True, False, True]))
    assert got.dtype == torch.int64 and got.tolist() == [bits[0], 0, bits[0]]


def test_pack_flags_of_every_combination_row_by_row():
    combos = list(itertools.product((False, True), repeat=4))
    cols = [torch.tensor([c[i] for c in combos]) for i in range(4)]
    got = pack_flags(*cols)
    assert got.dtype == torch.int64
    assert got.tolist() == [word(*c) for c in combos]


def test_pack_flags_reads_each_missing_condition_as_false():
    rows = list(itertools.product((False, True), repeat=4))
    cols = [torch.tensor([c[i] for c in rows]) for i in range(4)]
    for present in itertools.product((False, True), repeat=3):
        args = [cols[0]] + [c if p else None for c, p in zip(cols[1:], present)]
        want = [word(c[0], *(v if p else 0 for v, p in zip(c[1:], present))) for c in rows]
        got = pack_flags(*args)
        assert got.dtype == torch.int64 and got.tolist() == want, present


def test_pack_flags_of_one_row_and_of_non_bool_conditions():
    one = torch.tensor([True])
    assert pack_flags(one, one, one, one).tolist() == [word(1, 1, 1, 1)]
    assert pack_flags(torch.tensor([2, 0]), torch.tensor([0, 5]),
                      None, torch.tensor([1, 1])).tolist() == [word(1, 0, 0, 1), word(0, 1, 0, 1)]


# ---- raise_flags ------------------------------------------------------------------------------
def _raised(flags, rows):
    with pytest.raises(InvalidInputError) as e:
        raise_flags(flags, rows)
    return type(e.value), str(e.value)


def test_no_flag_raises_nothing():
    raise_flags([0, 0, 0], [4, 5, 6])
    raise_flags([], [])


@pytest.mark.parametrize("bit,what", [(BAD_TARGET, "target logits"),
                                      (BAD_DRAFT, "draft logits"),
                                      (BAD_LATTICE, "candidate selector scores")],
                         ids=["target", "draft", "lattice"])
def test_each_non_finite_source_alone_names_its_requests(bit, what):
    rows = [7, 3, 9, 0]
    kind, msg = _raised([0, bit, 0, bit], rows)
    assert kind is NonFiniteLogitsError
    assert msg.startswith(f"{what} of request(s) [3, 0] are not a finite law")
    kind, msg = _raised([bit, 0, 0, 0], rows)
    assert msg.startswith(f"{what} of request(s) [7] ")


def test_a_bad_q_alone_is_a_selector_bug():
    kind, msg = _raised([0, 0, BAD_Q], [2, 8, 1])
    assert kind is InvalidInputError and msg.startswith("request(s) [1]: a draft token has q = 0")


def test_the_first_bad_source_wins_in_the_documented_order():
    order = [(BAD_TARGET, "target logits"), (BAD_DRAFT, "draft logits"),
             (BAD_LATTICE, "candidate selector scores")]
    rows = [10, 11, 12, 13]
    for i, (bit, what) in enumerate(order):
        later = [b for b, _ in order[i + 1:]] + [BAD_Q]
        flags = [0, bit, 0, 0]
        for j, b in enumerate(later):           # every later source in rows of its own
            flags[2 + j % 2] |= b
        kind, msg = _raised(flags, rows)
        assert kind is NonFiniteLogitsError and msg.startswith(f"{what} of request(s) [11] ")
    kind, msg = _raised([BAD_Q, BAD_Q | BAD_LATTICE], [5, 6])
    assert msg.startswith("candidate selector scores of request(s) [6] ")


# ---- StepOut and live inputs ------------------------------------------------------------------
def test_step_out_takes_its_fields_and_packs_them_for_the_host():
    acc, tok = torch.tensor([1, 0]), torch.tensor([[5, 6, 7], [8, 9, 10]])
    flags, lens, anchor = torch.tensor([0, BAD_Q]), torch.tensor([4, 3]), torch.tensor([6, 8])
    out = StepOut.of({"accept_len": acc, "tokens": tok, "flags": flags, "lens": lens,
                      "anchor": anchor, "draft": torch.zeros(1)})
    assert out.logprobs is None and out.tokens is tok and out.anchor is anchor
    assert out.for_host().tolist() == [[1, 0, 5, 6, 7], [0, BAD_Q, 8, 9, 10]]
    lp = torch.tensor([[11, 12], [13, 14]])
    out = StepOut.of({"accept_len": acc, "tokens": tok, "flags": flags, "lens": lens,
                      "anchor": anchor, "logprobs": lp})
    assert out.for_host().tolist() == [[1, 0, 5, 6, 7, 11, 12], [0, BAD_Q, 8, 9, 10, 13, 14]]


class _Ext:
    def __init__(self, names):
        self.t = {n: torch.full((2,), i) for i, n in enumerate(names)}

    def graph_inputs(self):
        return self.t


def _batch(r=2, extensions=(), lens=None):
    sampling = SamplingBatch(torch.full((r,), 0.5), torch.zeros(r, dtype=torch.long),
                             torch.ones(r), torch.zeros(r, dtype=torch.bool), any_sampled=True)
    lens = torch.arange(r) + 10 if lens is None else lens
    return BatchState("T", "D", lens, torch.arange(r) + 100, torch.arange(r) + 7,
                      torch.arange(r) + 3, sampling, [0] * r, list(range(r)), extensions)


def test_live_inputs_are_the_batch_state_and_its_graphed_extensions():
    a, b = _Ext(["wa", "wb"]), _Ext(["wc"])
    st = _batch(extensions=(a, b))
    inp = live_inputs(st)
    s = st.sampling
    want = {"anchor": st.anchor, "lens": st.lens, "seed": st.seed, "key": st.key,
            "temperature": s.temperature, "top_k": s.top_k, "top_p": s.top_p,
            "greedy": s.greedy, "live": st.live, "wa": a.t["wa"], "wb": a.t["wb"],
            "wc": b.t["wc"]}
    assert set(inp) == set(want) and all(inp[n] is want[n] for n in want)
    assert st.live.tolist() == [True, True]


# ---- the bodies over fake stages --------------------------------------------------------------
class Stages:
    """Fake stages: record each call's arguments and return scripted tensors."""

    def __init__(self, monkeypatch, acc, tokens, bad, bad_q, lp=None):
        self.calls = {}
        self.acc, self.tokens, self.bad, self.bad_q, self.lp = acc, tokens, bad, bad_q, lp
        for name in ("draft_block", "select_block", "verify_block", "commit_kv",
                     "target_only_forward"):
            monkeypatch.setattr(bodies_module.stages, name, getattr(self, name))

    def draft_block(self, pair, st, backend, pos, ctx_len):
        self.calls["draft_block"] = (st, pos, ctx_len)
        return torch.zeros(st.size, pos.shape[1] - 1, 4)

    def select_block(self, pair, st, backend, h_e, noise):
        self.calls["select_block"] = (st, h_e, noise)
        r, g = h_e.shape[:2]
        return SimpleNamespace(draft=torch.full((r, g), 2), candidates=torch.zeros(r, g, 3),
                               q=torch.ones(r, g, 3), bad=torch.zeros(r, dtype=torch.bool),
                               bad_lattice=torch.ones(r, dtype=torch.bool))

    def verify_block(self, pair, st, backend, sel, noise, pos, ctx_len):
        self.calls["verify_block"] = (st, sel, noise, pos, ctx_len)
        ver = SimpleNamespace(accept_len=self.acc, tokens=self.tokens, bad=self.bad,
                              bad_q=self.bad_q)
        return "target out", ver, self.lp

    def commit_kv(self, pair, st, out, pos, count, defer_draft=False):
        self.calls["commit_kv"] = (st, out, pos, count.clone(), defer_draft)

    def target_only_forward(self, pair, st, backend, ctx_len):
        self.calls["target_only_forward"] = (st, ctx_len)
        return self.tokens, self.bad, "target out", st.lens.view(-1, 1), self.lp


class Backend:
    def __init__(self):
        self.noise_calls = []

    def noise(self, seed, key, lens, gamma):
        self.noise_calls.append((seed, key, lens, gamma))
        r = seed.shape[0]
        return SimpleNamespace(walk=torch.full((r, gamma), 0.1),
                               accept=torch.full((r, gamma), 0.2),
                               residual=torch.full((r, gamma), 0.3),
                               bonus=torch.full((r,), 0.4))


def _bodies(block):
    return StepBodies("pair", Backend(), "target cache", "draft cache", block)


def _graph_inputs(r=3):
    return {"anchor": torch.tensor([100, 101, 102])[:r], "lens": torch.tensor([5, 0, 9])[:r],
            "seed": torch.tensor([1, 2, 3])[:r], "key": torch.tensor([4, 5, 6])[:r],
            "temperature": torch.tensor([0.0, 1.0, 0.5])[:r],
            "top_k": torch.tensor([0, 2, 0])[:r], "top_p": torch.tensor([1.0, 1.0, 0.9])[:r],
            "greedy": torch.tensor([True, False, False])[:r],
            "live": torch.tensor([True, False, True])[:r]}


@pytest.mark.parametrize("block", [1, 2, 5])
def test_draft_positions_noise_and_outputs(monkeypatch, block):
    fake, b = Stages(monkeypatch, None, None, None, None), _bodies(block)
    inp = _graph_inputs()
    out = b.draft(inp, True, 11)
    st, pos, ctx_len = fake.calls["draft_block"]
    assert ctx_len == 11
    assert pos.tolist() == [[n + j for j in range(block)] for n in (5, 0, 9)]
    gamma = block - 1
    assert len(b.backend.noise_calls) == 1
    seed, key, lens, g = b.backend.noise_calls[0]
    assert (seed is inp["seed"], key is inp["key"], lens is inp["lens"], g) == \
        (True, True, True, gamma)
    assert out["walk"].shape == (3, gamma) and out["walk"].eq(0.1).all()
    assert out["bonus"].tolist() == pytest.approx([0.4] * 3)
    assert set(out) == {"draft", "cand", "q", "draft_bad", "lattice_bad", *NOISE, "pos",
                        "lens", "anchor"}
    assert out["pos"] is pos and out["lens"] is inp["lens"] and out["anchor"] is inp["anchor"]
    assert out["draft_bad"].tolist() == [False] * 3 and out["lattice_bad"].all()
    assert fake.calls["select_block"][2].walk is out["walk"]


def test_a_greedy_draft_draws_no_noise(monkeypatch):
    Stages(monkeypatch, None, None, None, None)
    b = _bodies(4)
    out = b.draft(_graph_inputs(), False, None)
    assert b.backend.noise_calls == []
    for n in NOISE[:3]:
        assert out[n].shape == (3, 3) and out[n].eq(0.5).all(), n
    assert out["bonus"].shape == (3,) and out["bonus"].eq(0.5).all()


def test_a_graph_body_builds_its_state_from_its_inputs(monkeypatch):
    fake = Stages(monkeypatch, None, None, None, None)
    seen = []

    class Graphed:
        @classmethod
        def of_inputs(cls, inp):
            seen.append(inp)
            return cls()
    inp = _graph_inputs()
    _bodies(3).draft(inp, True, None, graphed=(Graphed,))
    st = fake.calls["draft_block"][0]
    assert st.target_storage == "target cache" and st.draft_storage == "draft cache"
    assert st.lens is inp["lens"] and st.anchor is inp["anchor"]
    assert st.seed is inp["seed"] and st.key is inp["key"]
    s = st.sampling
    assert (s.temperature is inp["temperature"], s.top_k is inp["top_k"],
            s.top_p is inp["top_p"], s.greedy is inp["greedy"]) == (True,) * 4
    assert s.any_sampled is True and s.top_k_max is None and s.top_p_rows is None
    assert st.rows == [0, 1, 2] and st.size == 3
    assert len(st.extensions) == 1 and type(st.extensions[0]) is Graphed and seen == [inp]
    _bodies(3).draft(inp, False, None)
    st = fake.calls["draft_block"][0]
    assert st.sampling.any_sampled is False and st.extensions == ()


def test_an_eager_body_takes_the_hosts_sampling_and_extensions(monkeypatch):
    fake = Stages(monkeypatch, None, None, None, None)
    host = _batch(3, extensions=("ext",))
    inp = _graph_inputs()
    _bodies(3).draft(inp, True, 9, host=host)
    st = fake.calls["draft_block"][0]
    assert st.sampling is host.sampling and st.extensions == ("ext",)
    assert st.lens is inp["lens"] and st.size == 3


def _verify_inputs(block, r=3):
    g = block - 1
    inp = _graph_inputs(r)
    inp.update(draft=torch.full((r, g), 2), cand=torch.zeros(r, g, 3), q=torch.ones(r, g, 3),
               draft_bad=torch.tensor([False, True, False])[:r],
               lattice_bad=torch.tensor([False, False, True])[:r],
               pos=inp["lens"].view(-1, 1) + torch.arange(block),
               walk=torch.full((r, g), 0.1), accept=torch.full((r, g), 0.2),
               residual=torch.full((r, g), 0.3), bonus=torch.full((r,), 0.4))
    return inp


def test_verify_commits_accepted_plus_one_on_live_rows_only(monkeypatch):
    block = 4
    acc = torch.tensor([2, 3, 0])
    tokens = torch.tensor([[11, 12, 13, 14], [21, 22, 23, 24], [31, 32, 33, 34]])
    bad, bad_q = torch.tensor([True, False, False]), torch.tensor([False, False, True])
    fake = Stages(monkeypatch, acc, tokens, bad, bad_q)
    inp = _verify_inputs(block)
    out = _bodies(block).verify(inp, True, 13)
    live, lens = [True, False, True], [5, 0, 9]
    count = [a + 1 if lv else 0 for a, lv in zip(acc.tolist(), live)]
    st, out_t, pos, got_count, defer = fake.calls["commit_kv"]
    assert got_count.tolist() == count == [3, 0, 1] and defer is False
    assert pos is inp["pos"] and out_t == "target out"
    assert out["lens"].tolist() == [n + c for n, c in zip(lens, count)]
    assert out["anchor"].tolist() == [tokens[i, a].item() for i, a in enumerate(acc.tolist())]
    assert out["accept_len"] is acc and out["tokens"] is tokens
    want = [word(bad[i], bad_q[i], inp["draft_bad"][i], inp["lattice_bad"][i]) for i in range(3)]
    assert out["flags"].tolist() == want
    assert "logprobs" not in out
    st, sel, noise, vpos, ctx_len = fake.calls["verify_block"]
    assert ctx_len == 13 and vpos is inp["pos"]
    assert (sel.draft, sel.candidates, sel.q, sel.bad, sel.bad_lattice) == \
        (inp["draft"], inp["cand"], inp["q"], inp["draft_bad"], inp["lattice_bad"])
    assert all(getattr(noise, n) is inp[n] for n in NOISE)
    assert inp["lens"].tolist() == lens                        # inputs stay unmodified


def test_verify_passes_the_logprobs_on(monkeypatch):
    lp = torch.tensor([[1, 2], [3, 4]])
    Stages(monkeypatch, torch.tensor([0, 1]), torch.tensor([[7, 8], [9, 10]]),
           torch.zeros(2, dtype=torch.bool), torch.zeros(2, dtype=torch.bool), lp)
    out = _bodies(2).verify(_verify_inputs(2, r=2), False, None)
    assert out["logprobs"] is lp and out["anchor"].tolist() == [7, 10]
    assert out["lens"].tolist() == [5 + 1, 0]


def test_target_only_commits_one_token_on_live_rows_only(monkeypatch):
    token, bad = torch.tensor([40, 41, 42]), torch.tensor([False, True, True])
    fake = Stages(monkeypatch, None, token, bad, None)
    inp = _graph_inputs()
    out = _bodies(None).target_only(inp, True, 6)
    assert fake.calls["target_only_forward"][1] == 6
    st, out_t, pos, count, defer = fake.calls["commit_kv"]
    assert count.tolist() == [1, 0, 1] and defer is True and out_t == "target out"
    assert out["lens"].tolist() == [5 + 1, 0, 9 + 1]
    assert out["accept_len"].tolist() == [0, 0, 0] and out["accept_len"].dtype == token.dtype
    assert out["tokens"].tolist() == [[40], [41], [42]] and out["anchor"] is token
    assert out["flags"].tolist() == [word(0), word(1), word(1)]
    assert "logprobs" not in out
    lp = torch.tensor([[5], [6], [7]])
    Stages(monkeypatch, None, token, bad, None, lp)
    assert _bodies(None).target_only(inp, False, None)["logprobs"] is lp
