"""Sampling parameters under speculation (logit bias, penalties, min-p, logprobs): validation,
greedy spec == target-only with each parameter, logprobs equal to target-only's, requests
without them unchanged."""

from __future__ import annotations

import pytest
import torch

from dflash2rt import get_backend
from dflash2rt.engine.engine import Engine
from dflash2rt.engine.request import Request, SamplingParams
from dflash2rt.errors import InvalidInputError, SamplingParamsError
from dflash2rt.ops.procs import ProcBatch, block_counts

from tiny_models import oracle_pair, tiny_pair

PROMPTS = [(1, 2), (3, 4, 5, 6, 7), (8,)]
PARAMS = {
    "repetition": dict(repetition_penalty=3.0),
    "frequency": dict(frequency_penalty=2.0),
    "presence": dict(presence_penalty=-2.0),
    "bias": dict(logit_bias={5: 3.0, 7: -100.0}),
    "min_p": dict(min_p=0.3),
    "all": dict(repetition_penalty=1.3, frequency_penalty=0.5, presence_penalty=0.5,
                logit_bias={4: 1.0}, min_p=0.1, logprobs=3),
}


@pytest.mark.parametrize("bad,match", [
    (dict(repetition_penalty=0.0), "repetition_penalty"),
    (dict(frequency_penalty=2.5), "frequency_penalty"),
    (dict(presence_penalty=float("nan")), "presence_penalty"),
    (dict(min_p=1.5), "min_p"), (dict(min_p=True), "min_p"),
    (dict(logit_bias={3: 101.0}), r"logit_bias\[3\]"), (dict(logit_bias={-1: 1.0}), "keys"),
    (dict(logit_bias=[(1, 2.0)]), "mapping"), (dict(logprobs=-1), "logprobs"),
    (dict(logprobs=21), "logprobs")])
def test_bad_parameters_raise(bad, match):
    with pytest.raises(SamplingParamsError, match=match):
        SamplingParams(**bad)


def test_out_of_vocabulary_bias_is_refused():
    eng = Engine(tiny_pair("dflash2", block=4), get_backend("cpu"))
    with pytest.raises(InvalidInputError, match="logit_bias token ids"):
        eng.generate([Request((1, 2), SamplingParams(logit_bias={10**6: 1.0}))], spec=False)


def test_block_counts_add_the_drafts_row_by_row():
    counts = torch.tensor([[0, 2, 0, 0, 1]], dtype=torch.int32)
    rows = block_counts(counts, torch.tensor([[3, 3, 1]]))
    assert rows[0].tolist() == [[0, 2, 0, 0, 1], [0, 2, 0, 1, 1], [0, 2, 0, 2, 1],
                                [0, 3, 0, 2, 1]]


def test_requests_without_parameters_have_no_processing_state():
    assert ProcBatch.build([SamplingParams()] * 2, [(1,), (2,)], 10, "cpu") is None


@pytest.mark.parametrize("name", list(PARAMS))
@pytest.mark.parametrize("pair_kind", ["oracle", "random"])
def test_greedy_spec_equals_target_only(name, pair_kind):
    pair = oracle_pair(8) if pair_kind == "oracle" else tiny_pair("dflash2", block=8, seed=3)
    eng = Engine(pair, get_backend("cpu"))
    reqs = [Request(p, SamplingParams(max_new_tokens=40, **PARAMS[name])) for p in PROMPTS]
    spec, _ = eng.generate(reqs, spec=True, block_size=8)
    ref, _ = eng.generate(reqs, spec=False)
    assert [o.token_ids for o in spec] == [o.token_ids for o in ref]
    plain = [Request(p, SamplingParams(max_new_tokens=40)) for p in PROMPTS]
    base, _ = eng.generate(plain, spec=False)
    if pair_kind == "random" and name in ("repetition", "frequency", "bias"):  # it matters
        assert [o.token_ids for o in ref] != [o.token_ids for o in base]


def test_mixed_batch_leaves_plain_requests_unchanged_and_logprobs_match():
    pair = oracle_pair(8)
    eng = Engine(pair, get_backend("cpu"))
    reqs = [Request(PROMPTS[0], SamplingParams(max_new_tokens=30, frequency_penalty=2.0,
                                               logprobs=2)),
            Request(PROMPTS[1], SamplingParams(max_new_tokens=30)),
            Request(PROMPTS[2], SamplingParams(max_new_tokens=30, temperature=0.8, seed=5,
                                               logprobs=0))]
    spec, _ = eng.generate(reqs, spec=True, block_size=8)
    ref, _ = eng.generate(reqs, spec=False)
    alone, _ = eng.generate([reqs[1]], spec=True, block_size=8)
    assert spec[1].token_ids == alone[0].token_ids and spec[1].logprobs is None
    for s, r in zip((spec[0], spec[2]), (ref[0], ref[2])):
        assert len(s.logprobs) == len(s.token_ids) == len(s.top_logprobs)
        if s.token_ids == r.token_ids:
            assert s.logprobs == pytest.approx(r.logprobs, abs=1e-4)
    assert len(spec[0].top_logprobs[0]) == 2 and spec[2].top_logprobs[0] == {}
    assert spec[0].token_ids == ref[0].token_ids
    assert all(lp <= 0 for lp in spec[0].logprobs)


def test_logprobs_are_log_softmax_finite_where_the_law_keeps_the_token():
    """A kept token whose probability underflows float32 (logit 150 below the top) gets its
    log-probability, not −inf; a token top-k dropped gets −inf."""
    from dflash2rt.ops.batch import SamplingBatch
    from dflash2rt.ops.procs import token_logprobs, unpack_logprobs

    logits = torch.tensor([[[0.0, -150.0, -1.0, -2.0]]])
    tokens = torch.tensor([[1]])
    finite = -150.0 - torch.logsumexp(torch.tensor([0.0, -1.0, -2.0]), 0).item()
    for top_k, want in ((0, finite), (4, finite), (3, float("-inf"))):
        sampling = SamplingBatch.build([1.0], [top_k], [1.0])
        packed = token_logprobs(logits, sampling, tokens, 4)
        lp, top = unpack_logprobs(packed[0].tolist(), 1, 4, 4)[0]
        assert (lp == pytest.approx(want, abs=1e-3)) if want > -1e9 else lp == want
        assert top[1] == lp
        assert torch.log(torch.softmax(logits[0, 0], -1))[1] == float("-inf")   # log(p) was


def test_logprobs_mode_raw_is_the_models_law_and_processed_the_final_one():
    """Same tokens (greedy), two modes: raw is log_softmax of the model's logits, processed is
    under temperature 0.5 (greedy rows: 1) — at T = 0.5 processed = 2·raw − c per position,
    and with a bias the two differ by the bias on the biased token."""
    pair = oracle_pair(8)
    eng = Engine(pair, get_backend("cpu"))

    def run(mode, **kw):
        req = Request(PROMPTS[0], SamplingParams(max_new_tokens=12, temperature=0.5, seed=3,
                                                 logprobs=4, logprobs_mode=mode, **kw))
        return eng.generate([req], block_size=8)[0][0]

    raw, proc = run("raw"), run("processed")
    assert raw.token_ids == proc.token_ids
    for r_top, p_top in zip(raw.top_logprobs, proc.top_logprobs):
        assert set(r_top) == set(p_top)
        diffs = [p_top[t] - 2 * r_top[t] for t in r_top]
        assert max(diffs) - min(diffs) < 1e-3
    for r, p in zip(raw.logprobs, proc.logprobs):
        assert r <= 0 and p <= 0
    assert raw.logprobs != pytest.approx(proc.logprobs, abs=1e-3)
    with pytest.raises(SamplingParamsError, match="logprobs_mode"):
        SamplingParams(logprobs=1, logprobs_mode="logits")


@pytest.mark.parametrize("r,t,v,n,keep", [(1, 1, 5, 1, 1), (2, 3, 7, 4, 2), (3, 4, 9, 3, 3),
                                          (2, 2, 6, 2, None)])
def test_packed_logprobs_unpack_to_each_token_s_own_and_top(r, t, v, n, keep):
    """``token_logprobs`` → ``unpack_logprobs`` round trip, for every token of a block and
    every row: the token's log-probability and the top-``keep`` alternatives, against
    log_softmax computed here."""
    from dflash2rt.ops.batch import SamplingBatch
    from dflash2rt.ops.procs import token_logprobs, unpack_logprobs

    g = torch.Generator().manual_seed(r * 100 + t * 10 + v)
    logits = torch.randn(r, t, v, generator=g)
    tokens = torch.randint(0, v, (r, t), generator=g)
    packed = token_logprobs(logits, SamplingBatch.build([1.0] * r, [0] * r, [1.0] * r),
                            tokens, n)
    want = torch.log_softmax(logits, -1)
    for i in range(r):
        got = unpack_logprobs(packed[i].tolist(), t, n, keep)
        if keep is None:
            assert got == []
            continue
        assert len(got) == t
        for j, (lp, top) in enumerate(got):
            assert lp == pytest.approx(want[i, j, tokens[i, j]].item(), abs=1e-6)
            ids = torch.topk(want[i, j], keep).indices.tolist()
            assert list(top) == ids
            assert all(top[k] == pytest.approx(want[i, j, k].item(), abs=1e-6) for k in ids)
