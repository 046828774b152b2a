"""Row extensions against their documented contract: each hook's condition alone (scripted
feature batches), the fallback reports over every implementation table, the watermark's static
inputs against a real batch's inputs, and ``build``'s order and refusals request by request."""

from __future__ import annotations

import dataclasses
import itertools
from types import SimpleNamespace

import pytest
import torch

from dflash2rt.backend import OPS, TORCH_OPS, TRITON_INTERPRETER, TRITON_KERNEL, UNSUPPORTED
from dflash2rt.constraints import TokenAutomaton
from dflash2rt.engine import extensions as ext
from dflash2rt.engine.request import Request, SamplingParams
from dflash2rt.watermark import WatermarkKey
from dflash2rt.watermark.generate import INPUTS, PADS, KeyedDraws, WatermarkBatch

CPU = torch.device("cpu")
KINDS = ("draft", "verify", "target-only")
IMPLS = (TORCH_OPS, TRITON_KERNEL, TRITON_INTERPRETER, UNSUPPORTED)


class Feature:
    """A scripted feature batch: records calls, returns tagged values."""

    def __init__(self, bias=None, penalized=False):
        self.bias, self.penalized, self.calls = bias, penalized, []

    def process(self, logits, draft=None):
        self.calls.append(("process", logits, draft))
        return ("processed", logits, draft)

    def commit_(self, tokens, count):
        self.calls.append(("commit", tokens, count))

    def take(self, idx):
        return ("taken", tuple(idx))


@pytest.mark.parametrize("bias, penalized, shaped", [
    (None, False, False), ({3: 1.0}, False, True), (None, True, True), ({3: 1.0}, True, True)])
def test_procs_shape_draft_logits_when_a_bias_or_a_penalty_is_there_each_alone(
        bias, penalized, shaped):
    f = Feature(bias, penalized)
    logits = torch.zeros(2, 3, 5)
    got = ext.Procs(f).draft_logits(logits)
    if shaped:
        assert got == ("processed", logits, None) and len(f.calls) == 1
    else:
        assert got is logits and f.calls == []


def test_procs_and_constraint_pass_their_hooks_through():
    f = Feature()
    p = ext.Procs(f)
    logits, draft = torch.zeros(1, 2, 4), torch.zeros(1, 1, dtype=torch.int64)
    assert p.process(logits, draft) == ("processed", logits, draft)
    p.commit_("t", "c")
    assert f.calls[-1] == ("commit", "t", "c")
    assert p.take([1, 0]) == ext.Procs(("taken", (1, 0)))
    c = SimpleNamespace(take=lambda idx: ("c", tuple(idx)), walk=lambda: "walk",
                        draft_logits=lambda x: ("dl", x), mask=lambda x, d: ("mask", x, d),
                        commit_=lambda t, n: f.calls.append(("ccommit", t, n)))
    con = ext.Constraint(c)
    assert con.take([2]) == ext.Constraint(("c", (2,)))
    assert (con.walk_mask(), con.draft_logits(1), con.process(1, 2)) == \
        ("walk", ("dl", 1), ("mask", 1, 2))
    con.commit_("t", "n")
    assert f.calls[-1] == ("ccommit", "t", "n")


def tables():
    """Every implementation table over the ops that matter here (the rest torch ops)."""
    for wm, sel, ver in itertools.product(IMPLS + (None,), IMPLS, IMPLS):
        impl = {op: TORCH_OPS for op in OPS}
        impl.update(select=sel, verify=ver)
        if wm is None:
            del impl["watermark"]                  # undeclared: the keyed draws are torch ops
        else:
            impl["watermark"] = wm
        yield impl


def test_watermark_reports_torch_ops_exactly_when_its_draws_leave_the_kernels():
    w = ext.Watermark(object())
    seen = 0
    for kind, impl in itertools.product(KINDS, tables()):
        draws_on_torch = impl.get("watermark") in (None, TORCH_OPS)
        kernels = impl["select"] != TORCH_OPS or impl["verify"] != TORCH_OPS
        want = [ext.WATERMARK_OPS] if kind != "target-only" and draws_on_torch and kernels \
            else []
        assert w.reports(kind, impl) == want, (kind, impl)
        seen += bool(want)
    assert seen == 2 * 2 * 15                       # two kinds, two watermark values, 15 pairs


def test_constraint_reports_the_walk_on_a_draft_body_off_torch_ops():
    c = ext.Constraint(object())
    for kind, impl in itertools.product(KINDS, tables()):
        want = [ext.CONSTRAINT_WALK_OPS] if kind == "draft" and impl["select"] != TORCH_OPS \
            else []
        assert c.reports(kind, impl) == want, (kind, impl)


def test_the_plain_hooks_leave_the_step_as_it_is():
    for cls in (ext.RowExtension, ext.Procs, ext.Constraint, ext.Candidates):
        assert cls.graphed is False
    assert ext.Watermark.graphed is True and ext.Watermark.graph_label == "watermarked"
    base = ext.RowExtension()
    x = torch.zeros(1, 2, 3)
    assert base.draft_logits(x) is x and base.process(x) is x and base.process(x, x) is x
    assert base.walk_mask() is None and base.draws(None) is None and base.next_draw(x) is None
    assert base.reports("draft", {}) == [] and base.graph_key() is None
    assert base.graph_inputs() == {} and base.static_inputs(None, 2, CPU) == {}
    assert base.pads() == {}


def test_extensions_are_frozen():
    made = (ext.Procs(Feature()), ext.Watermark(object()), ext.Constraint(object()),
            ext.Candidates((1,), torch.tensor([1])))
    for e in made:
        field = dataclasses.fields(e)[0].name
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(e, field, None)


def wm_batch(rows=3, capacity=11, width=4):
    key = WatermarkKey(bytes(range(32)))
    prompts = [tuple(range(1, 2 + i)) for i in range(rows)]
    return WatermarkBatch.build(key, prompts, capacity, width, CPU)


@pytest.mark.parametrize("rows, capacity, width, size", [(1, 5, 1, 1), (3, 11, 4, 8),
                                                         (2, 7, 3, 2)])
def test_watermark_static_inputs_are_a_real_batchs_inputs_shaped_and_padded(
        rows, capacity, width, size):
    b = wm_batch(rows, capacity, width)
    w = ext.Watermark(b)
    assert w.graph_key() == (width, capacity)
    real = w.graph_inputs()
    static = ext.Watermark.static_inputs(w.graph_key(), size, CPU)
    assert list(static) == list(INPUTS) == list(real)
    for name in INPUTS:
        t = static[name]
        assert t.shape == (size,) + tuple(real[name].shape[1:]), name
        assert t.dtype == torch.int64 == real[name].dtype and t.device == CPU
        assert bool((t == PADS[name]).all()), name
    pads = ext.Watermark.pads()
    assert pads == {"wm_words": 0, "wm_window": -1, "wm_record": 0, "wm_used": 0}
    pads["wm_window"] = 5
    assert ext.Watermark.pads()["wm_window"] == -1                   # a copy each call
    back = ext.Watermark.of_inputs(real).batch
    assert back.width == width and back.shape == (width, capacity)
    for a, b2 in zip((back.window, back.record, back.used, back.words),
                     (b.window, b.record, b.used, b.words)):
        assert torch.equal(a, b2)


def test_watermark_draws_next_draw_take_and_commit():
    seen = []
    fake = SimpleNamespace(marks=lambda tokens: seen.append(tokens) or "marks",
                           take=lambda idx: ("wm", tuple(idx)),
                           commit_=lambda t, n: seen.append(("commit", t, n)))
    w = ext.Watermark(fake)
    lens = torch.tensor([4, 2, 9])
    assert w.next_draw(lens) == "marks"
    tokens, = seen
    assert tokens.shape == (3, 0) and tokens.dtype == torch.int64           # T = 0: the next
    w.commit_("t", "n")
    assert seen[-1] == ("commit", "t", "n") and w.take([0]) == ext.Watermark(("wm", (0,)))
    b = wm_batch()
    d = ext.Watermark(b).draws("noise")
    assert isinstance(d, KeyedDraws)


def test_candidates_build_and_take_row_by_row():
    assert ext.Candidates.build([None], CPU) is None
    assert ext.Candidates.build([None, None, None], CPU) is None
    req = [None, 3, 1, None, 2 ** 31 - 1]
    c = ext.Candidates.build(req, CPU)
    assert c.requested == tuple(req)
    assert c.per_row.tolist() == [0 if k is None else k for k in req]
    assert c.per_row.dtype == torch.int64
    for idx in ([4, 0, 2], [1], [], [3, 3]):
        t = c.take(idx)
        assert t.requested == tuple(req[i] for i in idx)
        assert t.per_row.tolist() == [0 if req[i] is None else req[i] for i in idx]
    assert ext.Candidates.build([5], CPU).per_row.tolist() == [5]


def requests(*params):
    return [Request((1 + i, 2, 3), p) for i, p in enumerate(params)]


VOCAB = 16
PLAIN = SamplingParams()


def kinds(exts):
    return [type(e).__name__ for e in exts]


@pytest.mark.parametrize("field", [dict(logit_bias={1: 2.0}), dict(logprobs=1), dict(min_p=0.1),
                                   dict(repetition_penalty=1.2), dict(frequency_penalty=0.5),
                                   dict(presence_penalty=-0.5)])
def test_build_without_a_vocabulary_refuses_a_processed_request_even_beside_plain_ones(field):
    for params in ([SamplingParams(**field)], [PLAIN, SamplingParams(**field)],
                   [SamplingParams(**field), PLAIN, PLAIN]):
        with pytest.raises(ValueError, match="needs the vocabulary size"):
            ext.build(requests(*params), None, CPU)


def test_build_without_a_vocabulary_refuses_a_constraint():
    a = TokenAutomaton([[0] * VOCAB])
    with pytest.raises(ValueError, match="needs the vocabulary size"):
        ext.build(requests(PLAIN, SamplingParams(constraint=a)), None, CPU)


def test_build_keeps_the_hook_order_and_only_the_features_in_use():
    a = TokenAutomaton([[0] * VOCAB])
    wm = wm_batch(2)
    bias, con, cand = (SamplingParams(logit_bias={1: 2.0}), SamplingParams(constraint=a),
                       SamplingParams(num_candidates=2))
    assert ext.build(requests(PLAIN, PLAIN), VOCAB, CPU) == ()
    assert ext.build(requests(PLAIN, PLAIN), None, CPU) == ()
    assert kinds(ext.build(requests(PLAIN, cand), None, CPU)) == ["Candidates"]
    assert kinds(ext.build(requests(PLAIN, PLAIN), None, CPU, wm)) == ["Watermark"]
    cases = {(bias, PLAIN): ["Procs"], (PLAIN, con): ["Constraint"], (cand, PLAIN): ["Candidates"],
             (con, bias): ["Procs", "Constraint"], (cand, con): ["Constraint", "Candidates"]}
    for params, want in cases.items():
        assert kinds(ext.build(requests(*params), VOCAB, CPU)) == want
        assert kinds(ext.build(requests(*params), VOCAB, CPU, wm)) == \
            [k for k in ("Procs", "Watermark", "Constraint", "Candidates")
             if k in want or k == "Watermark"]
    got = ext.build(requests(bias, con, cand), VOCAB, CPU, wm)
    assert kinds(got) == ["Procs", "Watermark", "Constraint", "Candidates"]
    assert got[1].batch is wm and got[3].requested == (None, None, 2)
