"""``on_finish`` (the Collector and ``Engine.generate``) and ``LLM.generate(use_tqdm=...)``,
checked against finish orders worked out by hand and a bar that records what it is told."""

from __future__ import annotations

import sys

import pytest

import dflash2rt
from dflash2rt import progress
from dflash2rt.engine.output import Collector
from dflash2rt.engine.request import Request, SamplingParams
from dflash2rt.errors import InvalidInputError, MissingExtraError

from fake_clock import Clock

EOS = 2


class Bar:
    """A tqdm stand-in: records how it was made and each call."""

    made: list["Bar"] = []

    def __init__(self, **kw):
        self.kw, self.n, self.postfix, self.closed = kw, 0, [], 0
        Bar.made.append(self)

    def update(self, n=1):
        self.n += n

    def set_postfix_str(self, s, refresh=True):
        self.postfix.append(s)
        self.refreshes = getattr(self, "refreshes", []) + [refresh]

    def close(self):
        self.closed += 1


@pytest.fixture(autouse=True)
def _fresh_bars():
    Bar.made = []


# ---- the Collector ----------------------------------------------------------------------------

def collector(*params, events):
    return Collector([Request((5, 6, 7), p) for p in params], None, (EOS,),
                     lambda i, ids: events.append(("tokens", i, list(ids))), 64,
                     lambda i: events.append(("finish", i)))


def test_collector_finishes_each_request_once_after_its_last_tokens():
    events = []
    out = collector(SamplingParams(max_new_tokens=3), SamplingParams(max_new_tokens=9),
                    SamplingParams(max_new_tokens=9, stop_token_ids=[40]), events=events)
    out.add(0, [10, 11])
    out.add(1, [10, EOS, 12])               # EOS: kept up to it, finished
    out.add(0, [12, 13])                    # over the length: cut to 3, finished
    out.add(2, [30, 40])                    # a stop token
    assert events == [("tokens", 0, [10, 11]), ("tokens", 1, [10]), ("finish", 1),
                      ("tokens", 0, [12]), ("finish", 0), ("tokens", 2, [30]), ("finish", 2)]


def test_collector_finishes_a_request_whose_step_kept_no_token():
    events = []
    out = collector(SamplingParams(max_new_tokens=5), events=events)
    out.add(0, [7])
    out.add(0, [EOS, 8])
    assert events == [("tokens", 0, [7]), ("finish", 0)]
    assert out.outputs[0].token_ids == [7] and out.outputs[0].finish_reason == "stop_token"


def test_collector_does_not_finish_a_live_request_or_finish_twice():
    events = []
    out = collector(SamplingParams(max_new_tokens=4), events=events)
    for t in (10, 11, 12):
        out.add(0, [t])
    assert [e for e in events if e[0] == "finish"] == []
    out.add(0, [13])
    out.add(0, [14])                        # a finished request fed again: no second finish
    assert [e for e in events if e[0] == "finish"] == [("finish", 0)]


def test_collector_without_on_finish_is_unchanged():
    out = Collector([Request((5, 6), SamplingParams(max_new_tokens=1))], None, (EOS,), None, 64)
    out.add(0, [9, 9])
    assert out.outputs[0].token_ids == [9] and out.outputs[0].finish_reason == "length"


# ---- the bar ----------------------------------------------------------------------------------

@pytest.mark.parametrize("value", [None, 0, 1, 1.0, "yes", [True]])
def test_use_tqdm_outside_its_domain(value):
    with pytest.raises(InvalidInputError, match="use_tqdm"):
        progress.bar_factory(value)


def test_use_tqdm_values():
    assert progress.bar_factory(False) is None
    assert progress.bar_factory(Bar) is Bar
    from tqdm import tqdm
    assert progress.bar_factory(True) is tqdm


def test_use_tqdm_true_without_tqdm(monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm", None)
    with pytest.raises(MissingExtraError, match="pip install tqdm"):
        progress.bar_factory(True)


def test_progress_counts_prompts_and_output_tokens_per_second(monkeypatch):
    clock = Clock(now=50.0).install(monkeypatch, progress)
    seen = []
    p = progress.Progress(Bar, 3, lambda i, ids: seen.append((i, ids)))
    assert Bar.made[0].kw == {"total": 3, "desc": "Processed prompts", "dynamic_ncols": True}
    p.tokens(0, [1, 2, 3])
    p.tokens(1, [4])
    clock.now += 2.0
    p.finish(1)
    p.tokens(0, [5, 6, 7, 8])
    clock.now += 2.0
    p.finish(0)
    p.close()
    bar = Bar.made[0]
    assert seen == [(0, [1, 2, 3]), (1, [4]), (0, [5, 6, 7, 8])]
    assert (bar.n, bar.closed) == (2, 1)
    assert bar.postfix == ["est. speed output: 2.00 toks/s", "est. speed output: 2.00 toks/s"]


def test_progress_rate_before_any_time_has_passed_and_under_a_second(monkeypatch):
    """No time yet: 0 tokens/s (not a division by zero); half a second for one token: 2;
    the postfix is set without a redraw of its own (the update that follows redraws)."""
    clock = Clock(now=7.0).install(monkeypatch, progress)
    p = progress.Progress(Bar, 2)
    p.tokens(0, [1])
    p.finish(0)
    clock.now += 0.5
    p.finish(1)
    bar = Bar.made[0]
    assert bar.postfix == ["est. speed output: 0.00 toks/s", "est. speed output: 2.00 toks/s"]
    assert bar.refreshes == [False, False] and bar.n == 2


def test_progress_refuses_a_non_callable_on_tokens():
    with pytest.raises(InvalidInputError, match="on_tokens"):
        progress.Progress(Bar, 1, on_tokens=5)


# ---- LLM.generate -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def llm():
    with dflash2rt.LLM("stdlib-code", "cpu") as m:
        yield m


def test_engine_finish_order_target_only(llm):
    """One token a step: a request of n tokens ends at step n - 1 (its first comes from the
    prefill), so the finish order is the order of the lengths."""
    events = []
    lengths = [3, 1, 5, 2]
    params = [SamplingParams(max_new_tokens=n, ignore_eos=True) for n in lengths]
    outs, _ = llm.engine.generate(
        [Request(tuple(range(100, 104 + i)), p) for i, p in enumerate(params)], spec=False,
        on_tokens=lambda i, ids: events.append(("tokens", i, len(ids))),
        on_finish=lambda i: events.append(("finish", i)))
    assert [e[1] for e in events if e[0] == "finish"] == [1, 3, 0, 2]
    for i, n in enumerate(lengths):
        mine = [e for e in events if e[1] == i]
        assert mine[-1] == ("finish", i) and [e for e in mine if e[0] == "finish"] == mine[-1:]
        assert sum(e[2] for e in mine[:-1]) == n == len(outs[i].token_ids)


def test_engine_on_finish_speculative_once_each(llm):
    events = []
    params = [SamplingParams(max_new_tokens=n, ignore_eos=True) for n in (9, 4, 1)]
    llm.engine.generate([Request(tuple(range(200, 206)), p) for p in params], spec=True,
                        block_size=4, on_finish=lambda i: events.append(i))
    assert sorted(events) == [0, 1, 2] and events[0] == 2       # 1 token: the prefill's


def test_engine_refuses_a_non_callable_on_finish(llm):
    with pytest.raises(InvalidInputError, match="on_finish"):
        llm.engine.generate([Request((100, 101), SamplingParams(max_new_tokens=2))],
                            on_finish="print")


def test_generate_with_a_bar_equals_without(llm):
    prompts = ["import os\n", "def f(x):", [702, 605, 199]]
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in (6, 2, 4)]
    plain = llm.generate(prompts, params, spec=False)
    streamed = []
    barred = llm.generate(prompts, params, spec=False, use_tqdm=Bar,
                          on_tokens=lambda i, ids: streamed.append((i, list(ids))))
    assert [o.outputs[0].token_ids for o in barred] == [o.outputs[0].token_ids for o in plain]
    bar = Bar.made[-1]
    assert (bar.kw["total"], bar.n, bar.closed, len(bar.postfix)) == (3, 3, 1, 3)
    for i, o in enumerate(plain):
        assert [t for j, ids in streamed if j == i for t in ids] == o.outputs[0].token_ids


def test_generate_closes_the_bar_when_decoding_fails(llm):
    def boom(i, ids):
        raise RuntimeError("consumer failed")
    with pytest.raises(RuntimeError, match="consumer failed"):
        llm.generate(["import os\n"], SamplingParams(max_tokens=3), block_size=4, use_tqdm=Bar,
                     on_tokens=boom)
    assert (Bar.made[-1].closed, Bar.made[-1].n) == (1, 0)


def test_generate_checks_use_tqdm_before_decoding(llm):
    with pytest.raises(InvalidInputError, match="use_tqdm"):
        llm.generate(["import os\n"], use_tqdm="yes")
    assert Bar.made == []


def test_generate_with_tqdm_itself(llm, capsys):
    outs = llm.generate(["import os\n", "def f(x):"], SamplingParams(max_tokens=2), spec=False,
                        use_tqdm=True)
    assert len(outs) == 2
    err = capsys.readouterr().err
    assert "Processed prompts" in err and "2/2" in err
