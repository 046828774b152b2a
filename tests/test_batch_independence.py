"""Batch independence: every request's whole output in a mixed batch equals its output alone."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dflash2rt import get_backend
from dflash2rt.constraints import TokenAutomaton
from dflash2rt.engine.engine import Engine
from dflash2rt.engine.request import Request, SamplingParams
from dflash2rt.models.tokenizer import TextTokenizer
from dflash2rt.watermark import WatermarkKey

from tiny_models import VOCAB, tiny_pair

# The comparison is the metamorphic relation itself: the batch and the lone run share every
# line of the engine, so only what differs between them (how per-request options are gathered,
# staged, compacted when a row finishes and unpacked) can make them differ. Float64 weights:
# the batched and the lone forward differ by rounding only, far below the tolerances here.
EOS, BLOCK = 12, 4
WORDS = [chr(97 + i % 26) + str(i // 26) for i in range(VOCAB)]
WORDS[40], WORDS[41] = "<0xC3>", "<0xA9>"          # byte fallback: alone, 40 is "\ufffd"
KEY = WatermarkKey(bytes(range(7, 39)))


def tokenizer() -> TextTokenizer:
    """Two characters a token ("b0"), two byte-fallback tokens that make "é"; EOS is "m0"."""
    from tokenizers import Tokenizer, decoders, models

    tok = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(WORDS)}, unk_token="a0"))
    tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Fuse()])
    return TextTokenizer(tok, eos_token_ids=(EOS,), bos_token_id=None)


TOK = tokenizer()


class ThirdsHook:
    """A generic constraint hook (host masks): token ids ≡ state (mod 3), the state cycling."""

    def initial(self):
        return 0

    def allowed(self, state):
        return np.arange(VOCAB) % 3 == state

    def advance(self, state, token):
        return (state + 1) % 3

    def accepting(self, state):
        return True


def _parity() -> TokenAutomaton:
    t = np.full((2, VOCAB), -1)
    t[0, 0::2], t[1, 1::2] = 1, 0
    return TokenAutomaton(t)


CONSTRAINTS = [None, TokenAutomaton.token_set(range(0, VOCAB, 3), VOCAB, eos=[EOS]), _parity(),
               TokenAutomaton.from_regex("([a-f][01])+", TOK, VOCAB, eos=[EOS]),
               TokenAutomaton.from_regex("[a-c]0[d-f]1", TOK, VOCAB, eos=[EOS]), ThirdsHook()]


def _one_of(*values):
    """Each option with its default (off) first: a failing example shrinks to the options that
    matter."""
    return st.sampled_from(values)


@st.composite
def params(draw, max_new: int) -> SamplingParams:
    t = draw(_one_of(0.0, 1.0, 0.7, 1.5))
    return SamplingParams(
        max_new_tokens=draw(st.integers(1, max_new)), temperature=t,
        top_k=draw(_one_of(0, 5)), top_p=draw(_one_of(1.0, 0.8)), min_p=draw(_one_of(0.0, 0.1)),
        seed=draw(st.integers(0, 3)),
        stop_token_ids=draw(_one_of((), (7,), (3, 30))),
        stop_strings=draw(_one_of((), ("c",), ("é", "b1"), ("0d",))),
        include_stop_str_in_output=draw(st.booleans()), ignore_eos=draw(st.booleans()),
        repetition_penalty=draw(_one_of(1.0, 1.3)), frequency_penalty=draw(_one_of(0.0, 0.5)),
        presence_penalty=draw(_one_of(0.0, -0.5)),
        logit_bias=draw(_one_of({}, {5: 3.0}, {EOS: -100.0, 20: 1.5})),
        logprobs=draw(_one_of(None, 0, 1, 3)), logprobs_mode=draw(_one_of("raw", "processed")),
        constraint=draw(st.sampled_from(CONSTRAINTS)),
        num_candidates=draw(_one_of(None, 1, 2, 9, VOCAB)),     # the draft's trained K is 4
        verification=draw(_one_of("token", "block")))


@st.composite
def batches(draw, max_rows: int, max_new: int) -> tuple[list[Request], bool]:
    """(requests with keys 0..n-1, watermarked)."""
    n = draw(st.integers(2, max_rows))
    reqs = [Request(tuple(draw(st.lists(st.integers(0, VOCAB - 2), min_size=1, max_size=5))),
                    draw(params(max_new)), key=i) for i in range(n)]
    return reqs, draw(st.booleans())


@pytest.fixture(scope="module")
def engine():
    pair = tiny_pair("dflash2", block=BLOCK, seed=4)
    pair.tokenizer = TOK
    return Engine(pair, get_backend("cpu"))


def _same(got, want, where: str) -> None:
    """The whole output: tokens, text and finish reason exactly; log-probabilities, and the ids
    and values of the top alternatives, up to the forwards' rounding."""
    assert (got.token_ids, got.text, got.finish_reason) == \
        (want.token_ids, want.text, want.finish_reason), where
    assert (got.logprobs is None) == (want.logprobs is None), where
    if want.logprobs is not None:
        np.testing.assert_allclose(got.logprobs, want.logprobs, rtol=0, atol=1e-5, err_msg=where)
        assert [list(t) for t in got.top_logprobs] == [list(t) for t in want.top_logprobs], where
        for g, w in zip(got.top_logprobs, want.top_logprobs):
            np.testing.assert_allclose(list(g.values()), list(w.values()), rtol=0, atol=1e-5,
                                       err_msg=where)


def check_batch(engine: Engine, reqs: list[Request], watermarked: bool, spec: bool) -> None:
    """Each request of ``reqs`` run in the batch and alone (same key, same mode; target-only
    requests without a candidate count or block verification, which only drafts take, and
    watermarked ones verified token by token, as the watermark asks)."""
    if not spec or watermarked:          # target-only: no drafts; watermarked: token by token
        reqs = [dataclasses.replace(q, params=dataclasses.replace(
            q.params, verification="token",
            num_candidates=q.params.num_candidates if spec else None)) for q in reqs]
    kw = dict(spec=spec, block_size=BLOCK if spec else None, watermark=KEY if watermarked else None)
    batch, _ = engine.generate(reqs, **kw)
    for i, q in enumerate(reqs):
        alone, _ = engine.generate([q], **kw)
        _same(batch[i], alone[0], f"request {i} of {len(reqs)} ({'spec' if spec else 'target-only'}"
                                  f"{', watermarked' if watermarked else ''}): {q}")


FAST = settings(max_examples=20, deadline=None, database=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
SLOW = settings(FAST, max_examples=120)


@FAST
@given(case=batches(max_rows=4, max_new=10))
def test_speculative_fixed_block_output_is_the_requests_own(engine, case):
    check_batch(engine, *case, spec=True)


@FAST
@given(case=batches(max_rows=4, max_new=10))
def test_target_only_output_is_the_requests_own(engine, case):
    check_batch(engine, *case, spec=False)


@pytest.mark.slow                       # a long run (over 10 s on 2 cores)
@SLOW
@given(case=batches(max_rows=7, max_new=24), spec=st.booleans())
def test_larger_batches_output_is_the_requests_own(engine, case, spec):
    check_batch(engine, *case, spec=spec)


def test_the_relation_sees_a_row_that_differs(engine):
    """The comparison is not vacuous: two requests that differ only in their logprobs mode
    differ in their log-probabilities, and each equals itself alone."""
    p = dict(max_new_tokens=6, temperature=0.7, top_k=5, seed=1, logprobs=2)
    reqs = [Request((1, 2), SamplingParams(**p), key=0),
            Request((1, 2), SamplingParams(**p, logprobs_mode="processed"), key=0)]
    out, _ = engine.generate(reqs, block_size=BLOCK)
    assert out[0].token_ids == out[1].token_ids
    assert not np.allclose(out[0].logprobs, out[1].logprobs, atol=1e-3)
    check_batch(engine, reqs, False, spec=True)
