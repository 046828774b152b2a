"""The logit processors (``ops.procs``) against their documented definitions written anew in
Python loops and float64: bias, then repetition / frequency / presence penalties per verify
row with the drafts' counts, the batch's host facts and rows, committed counts, packed
logprobs; and ``check_proc_params`` one bad field at a time beside good ones."""

from __future__ import annotations

import dataclasses
import math
import struct
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest
import torch

from dflash2rt.engine.request import SamplingParams
from dflash2rt.errors import SamplingParamsError
from dflash2rt.ops.batch import SamplingBatch
from dflash2rt.ops.procs import (ProcBatch, block_counts, check_proc_params, penalize,
                                 token_logprobs, unpack_logprobs)

GOOD = dict(repetition_penalty=1.0, frequency_penalty=0.0, presence_penalty=0.0, min_p=0.0,
            logit_bias={}, logprobs=None)


# ---- check_proc_params: each field alone, the others good --------------------------------

@pytest.mark.parametrize("field,value", [
    ("repetition_penalty", True), ("repetition_penalty", Decimal("1.5")),
    ("repetition_penalty", math.inf), ("repetition_penalty", 0.0),
    ("frequency_penalty", True), ("frequency_penalty", Decimal("0.5")),
    ("frequency_penalty", -math.inf), ("frequency_penalty", -2.5),
    ("presence_penalty", False), ("presence_penalty", Decimal("0.5")),
    ("presence_penalty", math.nan), ("presence_penalty", 2.5),
    ("min_p", True), ("min_p", Decimal("0.5")), ("min_p", math.nan), ("min_p", -0.1),
    ("logit_bias", {1: True}), ("logit_bias", {1: Decimal("1")}), ("logit_bias", {1: math.inf}),
    ("logit_bias", {0: 1.0, 2: -100.5}), ("logit_bias", {False: 1.0}),
    ("logit_bias", {"3": 1.0}), ("logit_bias", {2**31: 1.0}), ("logit_bias", (1, 2)),
    ("logprobs", True), ("logprobs", 2.0), ("logprobs", -1), ("logprobs", 21),
])
def test_each_bad_field_alone_is_refused_naming_it(field, value):
    name = "logit_bias" if field == "logit_bias" else field
    with pytest.raises(SamplingParamsError, match=name):
        check_proc_params(**{**GOOD, field: value})


@pytest.mark.parametrize("field,value", [
    ("repetition_penalty", Fraction(3, 2)), ("repetition_penalty", np.float32(1e6)),
    ("repetition_penalty", 1e-6), ("frequency_penalty", -2), ("frequency_penalty", 2.0),
    ("presence_penalty", np.float64(-2.0)), ("min_p", 0), ("min_p", 1.0),
    ("logit_bias", {0: -100, np.int64(2**31 - 1): 100.0, 5: Fraction(1, 3)}),
    ("logprobs", 0), ("logprobs", np.int64(20)),
])
def test_each_good_value_passes(field, value):
    check_proc_params(**{**GOOD, field: value})


# ---- penalize / block_counts: loops over the definitions ----------------------------------

def ref_block_counts(counts, draft):
    """Row j: the committed counts plus one for each of d_1..d_j."""
    out = []
    for i, row in enumerate(counts):
        rows = [list(row)]
        for d in (draft[i] if draft is not None else []):
            nxt = list(rows[-1])
            nxt[d] += 1
            rows.append(nxt)
        out.append(rows)
    return out


def ref_penalize(logits, counts, prompt, rep, freq, pres):
    """vLLM / transformers: over prompt + output, l / r where l > 0 else l · r; then over the
    output, minus f · count minus s where count > 0 (float64, per element)."""
    out = []
    for i, block in enumerate(logits):
        rows = []
        for j, row in enumerate(block):
            new = []
            for v, x in enumerate(row):
                c = counts[i][j][v]
                if prompt[i][v] or c > 0:
                    x = x / rep[i] if x > 0 else x * rep[i]
                x = x - freq[i] * c - (pres[i] if c > 0 else 0.0)
                new.append(x)
            rows.append(new)
        out.append(rows)
    return out


def test_block_counts_against_a_loop():
    g = torch.Generator().manual_seed(1)
    counts = torch.randint(0, 3, (3, 6), generator=g, dtype=torch.int32)
    draft = torch.tensor([[0, 0, 5], [2, 4, 2], [5, 1, 0]])
    got = block_counts(counts, draft)
    assert got.dtype == torch.int32 and got.shape == (3, 4, 6)
    assert got.tolist() == ref_block_counts(counts.tolist(), draft.tolist())
    assert counts.tolist() == got[:, 0].tolist()


def test_block_counts_with_one_draft_has_two_rows():
    counts = torch.tensor([[0, 1, 2], [3, 0, 1]], dtype=torch.int32)
    got = block_counts(counts, torch.tensor([[1], [0]]))
    assert got.tolist() == [[[0, 1, 2], [0, 2, 2]], [[3, 0, 1], [4, 0, 1]]]


@pytest.mark.parametrize("draft", [None, torch.zeros(2, 0, dtype=torch.int64)])
def test_block_counts_without_drafts_is_one_row_of_the_counts(draft):
    counts = torch.tensor([[0, 1, 2], [3, 0, 1]], dtype=torch.int32)
    got = block_counts(counts, draft)
    assert got.shape == (2, 1, 3) and got[:, 0].tolist() == counts.tolist()


LOGITS = [[[2.0, -1.5, 0.0, 3.0, -0.5, 1.0, -2.0, 0.5]],
          [[-1.0, 4.0, 0.0, -3.0, 2.5, 0.25, 1.5, -0.75]],
          [[1.0, 1.0, -1.0, -1.0, 2.0, -2.0, 0.0, 3.0]]]
# each row: tokens only in the prompt, only in the output (count 1 and 2), in both, in neither
PROMPT = [[0, 1, 4], [2, 3, 6], [0, 2, 7]]
COUNTS = [[0, 0, 1, 2, 1, 0, 0, 0], [0, 1, 0, 1, 2, 0, 0, 3], [0, 0, 0, 1, 2, 1, 0, 0]]
REP, FREQ, PRES = [1.5, 3.0, 0.8], [0.7, -0.4, 2.0], [-0.3, 1.1, 0.6]


def prompt_mask(prompts, v):
    return torch.tensor([[t in p for t in range(v)] for p in prompts])


def test_penalize_against_the_definition():
    logits = torch.tensor(LOGITS)
    counts = torch.tensor(COUNTS, dtype=torch.int32).unsqueeze(1)
    got = penalize(logits, counts, prompt_mask(PROMPT, 8), torch.tensor(REP),
                   torch.tensor(FREQ), torch.tensor(PRES))
    want = ref_penalize(LOGITS, counts.tolist(), prompt_mask(PROMPT, 8).tolist(),
                        REP, FREQ, PRES)
    assert got.dtype == torch.float32
    assert np.allclose(got.numpy(), np.array(want), rtol=1e-6, atol=1e-6)


def params_rows():
    return [SamplingParams(repetition_penalty=REP[i], frequency_penalty=FREQ[i],
                           presence_penalty=PRES[i], logit_bias=bias)
            for i, bias in enumerate([{3: 2.0, 6: -1.0}, {}, {0: -3.0, 7: 1.5}])]


@pytest.mark.parametrize("gamma", [0, 1, 3])
def test_process_is_bias_then_penalties_with_each_verify_row_s_counts(gamma):
    """Bias first (so a biased logit that turns positive is divided), then the penalties with
    row j's counts = committed + d_1..d_j."""
    params = params_rows()
    pb = ProcBatch.build(params, PROMPT, 8, "cpu")
    pb.counts.copy_(torch.tensor(COUNTS, dtype=torch.int32))
    draft = torch.tensor([[3, 5, 3], [1, 0, 7], [6, 6, 2]])[:, :gamma] if gamma else None
    t = gamma + 1
    g = torch.Generator().manual_seed(7)
    logits = (torch.randn(3, t, 8, generator=g) * 3).to(torch.bfloat16)
    got = pb.process(logits, draft)
    x = logits.double().tolist()
    biased = [[[xv + params[i].logit_bias.get(v, 0.0) for v, xv in enumerate(row)]
               for row in x[i]] for i in range(3)]
    counts = ref_block_counts(COUNTS, draft.tolist() if gamma else None)
    want = ref_penalize(biased, counts, prompt_mask(PROMPT, 8).tolist(), REP, FREQ, PRES)
    assert got.dtype == torch.float32 and got.shape == (3, t, 8)
    assert np.allclose(got.numpy(), np.array(want), rtol=1e-6, atol=1e-5)


def test_process_bias_only_and_rows_without_processors_unchanged():
    params = [SamplingParams(logit_bias={1: 5.0}), SamplingParams(),
              SamplingParams(logprobs=2)]
    pb = ProcBatch.build(params, [(1,), (1, 2), (0,)], 4, "cpu")
    assert pb.bias is not None and not pb.penalized
    pb.counts.copy_(torch.tensor([[0, 3, 0, 0], [2, 2, 0, 0], [1, 0, 0, 1]], dtype=torch.int32))
    logits = torch.tensor([[[1.0, -2.0, 3.0, 0.5]], [[2.0, 1.0, -1.0, 0.0]],
                           [[-1.0, 0.25, 7.0, 2.0]]])
    got = pb.process(logits)
    assert got.tolist() == [[[1.0, 3.0, 3.0, 0.5]], [[2.0, 1.0, -1.0, 0.0]],
                            [[-1.0, 0.25, 7.0, 2.0]]]


def test_mixed_batch_leaves_plain_rows_bit_for_bit():
    params = [SamplingParams(repetition_penalty=2.0, frequency_penalty=1.0),
              SamplingParams()]
    pb = ProcBatch.build(params, [(0, 1), (0, 1)], 4, "cpu")
    pb.counts.copy_(torch.tensor([[1, 0, 2, 0], [1, 0, 2, 0]], dtype=torch.int32))
    logits = torch.tensor([[[0.3, -0.7, 1.9, 0.1]], [[0.3, -0.7, 1.9, 0.1]]])
    got = pb.process(logits)
    assert got[1].tolist() == logits[1].tolist()
    assert got[0, 0].tolist() == pytest.approx([0.15 - 1.0, -1.4, 1.9 / 2 - 2.0, 0.1],
                                               abs=1e-6)


# ---- build / take: the host facts, each condition alone ----------------------------------

@pytest.mark.parametrize("kw,penalized,biased,logprobs", [
    (dict(repetition_penalty=2.0), True, False, None),
    (dict(repetition_penalty=0.5), True, False, None),
    (dict(frequency_penalty=1.0), True, False, None),
    (dict(frequency_penalty=-0.5), True, False, None),
    (dict(presence_penalty=1.0), True, False, None),
    (dict(presence_penalty=-1.0), True, False, None),
    (dict(logit_bias={2: 0.0}), False, True, None),
    (dict(logprobs=0), False, False, 0),
    (dict(logprobs=5), False, False, 5),
])
def test_build_one_processor_alone_beside_a_plain_row(kw, penalized, biased, logprobs):
    pb = ProcBatch.build([SamplingParams(), SamplingParams(**kw)], [(0,), (3,)], 6, "cpu")
    assert pb is not None
    assert pb.penalized is penalized
    assert (pb.bias is not None) is biased
    assert pb.logprobs == logprobs and pb.wants == (None, logprobs)


@pytest.mark.parametrize("kw", [dict(min_p=0.5), dict(logprobs_mode="processed"),
                                dict(temperature=0.7, top_k=3)])
def test_build_none_when_no_row_uses_a_processor(kw):
    assert ProcBatch.build([SamplingParams(**kw), SamplingParams()], [(1,), (2,)], 5,
                           "cpu") is None


def test_build_stages_each_row_s_own_values():
    params = [SamplingParams(logprobs=3, logit_bias={4: -2.5, 0: 1.0}),
              SamplingParams(repetition_penalty=1.25, logprobs_mode="processed", logprobs=0),
              SamplingParams(frequency_penalty=0.5, presence_penalty=-1.5),
              SamplingParams(logprobs_mode="raw")]
    prompts = [(0, 2, 2), (), (5, 1), (3,)]
    pb = ProcBatch.build(params, prompts, 6, "cpu")
    assert pb.counts.dtype == torch.int32 and pb.counts.tolist() == [[0] * 6] * 4
    assert pb.prompt.dtype == torch.bool
    assert pb.prompt.tolist() == [[t in p for t in range(6)] for p in prompts]
    assert pb.rep.tolist() == [1.0, 1.25, 1.0, 1.0]
    assert pb.freq.tolist() == [0.0, 0.0, 0.5, 0.0]
    assert pb.pres.tolist() == [0.0, 0.0, -1.5, 0.0]
    assert pb.bias.tolist() == [[1.0, 0, 0, 0, -2.5, 0], [0] * 6, [0] * 6, [0] * 6]
    assert pb.penalized is True
    assert pb.logprobs == 3 and pb.wants == (3, 0, None, None)
    assert pb.raw.tolist() == [True, False, True, True]     # "raw" is the default mode
    assert pb.any_raw is True


@pytest.mark.parametrize("modes,wants,any_raw", [
    (("raw", "processed"), (None, 2), False),        # the raw row asks for no logprobs
    (("processed", "raw"), (None, 2), True),
    (("processed", "processed"), (1, 2), False),
    (("raw", "raw"), (0, None), True),
])
def test_any_raw_is_a_raw_row_that_wants_logprobs(modes, wants, any_raw):
    params = [SamplingParams(logprobs=w, logprobs_mode=m) for m, w in zip(modes, wants)]
    pb = ProcBatch.build(params, [(0,), (1,)], 4, "cpu")
    assert pb.any_raw is any_raw
    assert pb.raw.tolist() == [m == "raw" for m in modes]
    assert pb.logprobs == max(w for w in wants if w is not None)


def test_take_rows_in_any_order_with_repeats():
    params = [SamplingParams(repetition_penalty=1.0 + i / 4, frequency_penalty=i / 8,
                             presence_penalty=-i / 8, logit_bias={i: float(i + 1)},
                             logprobs=i if i % 2 else None,
                             logprobs_mode="raw" if i % 3 else "processed")
              for i in range(4)]
    pb = ProcBatch.build(params, [(i,) for i in range(4)], 5, "cpu")
    pb.counts.copy_(torch.arange(20, dtype=torch.int32).view(4, 5))
    idx = [3, 0, 3, 2]
    sub = pb.take(idx)
    for name in ("counts", "prompt", "rep", "freq", "pres", "bias", "raw"):
        full = getattr(pb, name)
        assert getattr(sub, name).tolist() == [full[i].tolist() for i in idx], name
    assert sub.wants == (3, None, 3, None)
    assert (sub.penalized, sub.logprobs, sub.any_raw) == (pb.penalized, pb.logprobs,
                                                         pb.any_raw)


def test_take_without_bias_or_raw_keeps_none():
    pb = ProcBatch.build([SamplingParams(frequency_penalty=1.0)] * 3, [(0,)] * 3, 4, "cpu")
    pb = ProcBatch(pb.counts, pb.prompt, pb.rep, pb.freq, pb.pres, None, True, None, pb.wants)
    assert pb.raw is None and pb.any_raw is False          # the defaults: no raw rows
    sub = pb.take([2, 1])
    assert sub.bias is None and sub.raw is None and sub.counts.shape == (2, 4)
    assert sub.any_raw is False


def test_the_host_facts_are_frozen():
    """Only ``counts`` changes, in place on the device; the host facts never do."""
    pb = ProcBatch.build([SamplingParams(logprobs=1)], [(0,)], 3, "cpu")
    for name, value in (("penalized", True), ("logprobs", 5), ("bias", None)):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(pb, name, value)


# ---- commit_: the first n[r] tokens of each row, token 0 included, -1 never --------------

def test_commit_counts_exactly_the_first_n_tokens():
    pb = ProcBatch.build([SamplingParams(frequency_penalty=1.0)] * 4, [()] * 4, 5, "cpu")
    tokens = torch.tensor([[0, 0, 3, 4], [2, -1, -1, -1], [1, 2, 1, 0], [4, 4, 4, 4]])
    n = torch.tensor([3, 1, 4, 0])
    pb.commit_(tokens, n)
    pb.commit_(torch.tensor([[0, -1], [-1, -1], [3, 3], [1, 1]]), torch.tensor([1, 2, 2, 1]))
    want = [[0] * 5 for _ in range(4)]
    for toks, ns in ((tokens.tolist(), n.tolist()),
                     ([[0, -1], [-1, -1], [3, 3], [1, 1]], [1, 2, 2, 1])):
        for r in range(4):
            for t in toks[r][:ns[r]]:
                if t >= 0:
                    want[r][t] += 1
    assert pb.counts.tolist() == want == [[3, 0, 0, 1, 0], [0, 0, 1, 0, 0], [1, 2, 1, 2, 0],
                                          [0, 1, 0, 0, 0]]


# ---- token_logprobs / unpack_logprobs: float64 log_softmax and hand-packed rows ----------

def ref_logprobs(row, temp, min_p=0.0):
    """log of the law at temperature ``temp`` (greedy: 1) with min-p, in float64."""
    t = temp if temp > 0 else 1.0
    z = [x / t for x in row]
    m = max(z)
    p = [math.exp(x - m) for x in z]
    keep = [q >= min_p * max(p) for q in p]
    s = sum(q for q, k in zip(p, keep) if k)
    return [math.log(q / s) if k else -math.inf for q, k in zip(p, keep)]


def floats_of(ints):
    return list(struct.unpack(f"{len(ints)}f", struct.pack(f"{len(ints)}i", *ints)))


def test_token_logprobs_raw_and_processed_rows_against_float64():
    g = torch.Generator().manual_seed(11)
    r, t, v, n = 3, 2, 7, 3
    raw_logits = torch.randn(r, t, v, generator=g) * 2
    logits = raw_logits + torch.randn(r, t, v, generator=g)       # "processed" logits
    tokens = torch.tensor([[0, 6], [0, 3], [5, 0]])
    temps, min_p = [0.5, 0.0, 2.0], [0.0, 0.0, 0.2]
    sampling = SamplingBatch.build(temps, [0] * r, [1.0] * r, min_p=min_p)
    raw = torch.tensor([False, True, False])
    packed = token_logprobs(logits, sampling, tokens, n, raw_logits=raw_logits, raw=raw)
    assert packed.dtype == torch.int64 and packed.shape == (r, t * (1 + 2 * n))
    for i in range(r):
        vals = floats_of(packed[i, :t * (1 + n)].tolist())
        ids = packed[i, t * (1 + n):].tolist()
        for j in range(t):
            src = raw_logits if raw[i] else logits
            want = ref_logprobs(src[i, j].double().tolist(), 1.0 if raw[i] else temps[i],
                                0.0 if raw[i] else min_p[i])
            own, top = vals[j * (1 + n)], vals[j * (1 + n) + 1:(j + 1) * (1 + n)]
            assert own == pytest.approx(want[tokens[i, j]], abs=1e-5)
            order = sorted(range(v), key=lambda k: -want[k])[:n]
            assert ids[j * n:(j + 1) * n] == order
            assert top == pytest.approx([want[k] for k in order], abs=1e-5)


@pytest.mark.parametrize("raw_logits,raw", [(True, None), (None, True)])
def test_token_logprobs_half_of_the_raw_pair_is_the_processed_law(raw_logits, raw):
    logits = torch.tensor([[[1.0, 2.0, 0.0]], [[0.5, -1.0, 3.0]]])
    sampling = SamplingBatch.build([1.0, 1.0], [0, 0], [1.0, 1.0])
    kw = dict(raw_logits=logits * 5 if raw_logits else None,
              raw=torch.tensor([True, True]) if raw else None)
    packed = token_logprobs(logits, sampling, torch.tensor([[1], [2]]), 1, **kw)
    for i in range(2):
        want = ref_logprobs(logits[i, 0].double().tolist(), 1.0)
        own, top = floats_of(packed[i, :2].tolist())
        assert own == pytest.approx(max(want), abs=1e-6) and top == own


def pack(entries, t, n):
    """A row by hand: per token (own, [(id, lp)] * n) → float bits then ids."""
    floats, ids = [], []
    for own, alts in entries:
        floats += [own] + [lp for _, lp in alts]
        ids += [i for i, _ in alts]
    bits = list(struct.unpack(f"{len(floats)}i", struct.pack(f"{len(floats)}f", *floats)))
    assert len(bits) == t * (1 + n)
    return bits + ids


@pytest.mark.parametrize("keep", [0, 1, 2, 4])
def test_unpack_hand_packed_rows(keep):
    entries = [(-0.5, [(7, -0.25), (3, -1.5), (9, -2.0), (0, -4.0)]),
               (-3.0, [(2, -0.125), (11, -0.75), (5, -3.0), (1, -5.0)]),
               (-0.0625, [(4, -0.0625), (8, -3.5), (6, -6.0), (10, -8.0)])]
    got = unpack_logprobs(pack(entries, 3, 4), 3, 4, keep)
    assert got == [(own, dict(alts[:keep])) for own, alts in entries]
    assert [list(top) for _, top in got] == [[i for i, _ in alts[:keep]] for _, alts in entries]


def test_unpack_none_and_one_token_one_alternative():
    assert unpack_logprobs(pack([(-1.0, [(2, -0.5)])], 1, 1), 1, 1, None) == []
    assert unpack_logprobs(pack([(-1.0, [(2, -0.5)])], 1, 1), 1, 1, 1) == [(-1.0, {2: -0.5})]
