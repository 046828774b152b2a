"""The Collector on its own: the horizon it gives the adaptive schedule, the logprobs it keeps
in step with the tokens (and refuses out of step), and the streamed tokens after a cut."""

from __future__ import annotations

import pytest

from dflash2rt.engine.output import Collector
from dflash2rt.engine.request import Request, SamplingParams

EOS = 2


def _collector(*params: SamplingParams, on_tokens=None) -> Collector:
    return Collector([Request((5, 6, 7), p) for p in params], None, (EOS,), on_tokens, 64)


def _lp(tokens):
    return [(-0.5 - t, {t: -0.5 - t}) for t in tokens]


def test_remaining_counts_down_to_one():
    """Tokens a request may still emit: max_new_tokens less what it has, never below 1 (a
    live row always has a next token to plan for)."""
    out = _collector(SamplingParams(max_new_tokens=5), SamplingParams(max_new_tokens=9))
    assert out.remaining([0, 1]) == [5, 9]
    out.add(0, [10])
    out.add(1, [10, 11, 12])
    assert out.remaining([0, 1]) == [4, 6]
    assert out.remaining([1]) == [6]
    out.add(0, [13, 14, 15])
    assert out.remaining([0]) == [1]
    out.add(1, [16, 17, 18, 19, 20, 21])
    assert out.outputs[1].finish_reason == "length" and out.remaining([1]) == [1]


def test_logprobs_follow_the_tokens_and_their_cut():
    out = _collector(SamplingParams(max_new_tokens=8, logprobs=1))
    out.add(0, [10, 11], _lp([10, 11]))
    out.add(0, [12, EOS, 13], _lp([12, EOS, 13]))              # cut at the EOS
    o = out.outputs[0]
    assert o.token_ids == [10, 11, 12] and o.finish_reason == "stop_token"
    assert o.logprobs == [-10.5, -11.5, -12.5]
    assert o.top_logprobs == [{10: -10.5}, {11: -11.5}, {12: -12.5}]


@pytest.mark.parametrize("got", [None, 1, 3], ids=["none", "fewer", "more"])
def test_logprobs_out_of_step_with_the_tokens_are_refused(got):
    """A request that asked for logprobs and a step that returned none, or not one per
    token: an error naming the counts, never tokens without their logprobs."""
    out = _collector(SamplingParams(max_new_tokens=8, logprobs=0))
    tokens = [10, 11]
    lps = None if got is None else _lp(range(10, 10 + got))
    with pytest.raises(RuntimeError, match=f"returned {got} for 2 tokens"):
        out.add(0, tokens, lps)


def test_without_logprobs_asked_none_are_kept():
    out = _collector(SamplingParams(max_new_tokens=8))
    out.add(0, [10, 11], _lp([10, 11]))
    assert out.outputs[0].logprobs is None and out.outputs[0].top_logprobs is None


def test_on_tokens_gets_the_new_tokens_up_to_the_cut_only():
    sent = []
    out = _collector(SamplingParams(max_new_tokens=4), SamplingParams(max_new_tokens=8),
                     on_tokens=lambda i, ids: sent.append((i, ids)))
    out.add(1, [10])
    out.add(0, [10, 11, 12, 13, 14])                         # cut at max_new_tokens
    out.add(1, [EOS])                                        # nothing new: nothing sent
    assert sent == [(1, [10]), (0, [10, 11, 12, 13])]
    assert [o.finish_reason for o in out.outputs] == ["length", "stop_token"]
    assert out.done(0) and out.done(1)
