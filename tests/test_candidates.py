"""A request's candidate count (``SamplingParams.num_candidates``, ``engine/candidates.py``):
a row limited to its count inside a wider batch selects what it selects alone; every count is
lossless; the count is checked, reported, keyed in the adaptive table and taken by the server.
Mixed counts in batches with every other option: ``test_batch_independence.py``."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dflash2rt import get_backend
from dflash2rt.cli import stats_line
from dflash2rt.engine.candidates import counts, limit
from dflash2rt.engine.engine import Engine
from dflash2rt.engine.extensions import EAGER_PROCS, Candidates
from dflash2rt.engine.policy.adaptive import law_of, mode_of
from dflash2rt.engine.policy.schedule import AdaptiveSchedule
from dflash2rt.engine.request import Request, SamplingParams
from dflash2rt.errors import DFlash2Error, InvalidInputError, SamplingParamsError
from dflash2rt.ops.batch import SamplingBatch
from dflash2rt.ops.selector import SelectorParams, select
from dflash2rt.serve.errors import APIError
from dflash2rt.serve.jobs import Job
from dflash2rt.serve.protocol import Limits, sampling_params
from dflash2rt.serve.scheduler import Scheduler

from tiny_models import VOCAB, tiny_pair

CPU = torch.device("cpu")
TRAINED = 4                                   # tiny_pair's selector_top_k


@st.composite
def batches(draw):
    """Rows of draft logits on a coarse grid (ties), some −inf, at times a NaN row; each row's
    requested count (None: the trained one), temperature and walk uniforms."""
    r, gamma, v = draw(st.integers(1, 4)), draw(st.integers(1, 3)), draw(st.integers(2, 24))
    g = np.random.default_rng(draw(st.integers(0, 2**16)))
    logits = g.integers(-3, 3, (r, gamma, v)).astype(np.float32) / 2
    logits[g.random((r, gamma, v)) < draw(st.sampled_from([0.0, 0.3, 0.9]))] = -np.inf
    if draw(st.booleans()) and r > 1:
        logits[0, 0, g.integers(v)] = np.nan
    asked = [draw(st.one_of(st.none(), st.integers(1, v))) for _ in range(r)]
    trained = draw(st.integers(1, v))
    temps = [draw(st.sampled_from([0.0, 1.0, 0.6])) for _ in range(r)]
    rank = 3
    f32 = lambda x: torch.tensor(x, dtype=torch.float32)      # noqa: E731
    return (torch.tensor(logits), f32(g.normal(0, 1, (r, gamma, rank))),
            torch.tensor(g.integers(0, v, r)), f32(g.normal(0, 1, (v, rank))),
            f32(g.normal(0, 1, (v, rank))), asked, trained, temps, f32(g.random((r, gamma))))


@settings(max_examples=150, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(case=batches())
def test_a_row_limited_to_its_count_selects_as_it_would_alone(case):
    logits, proj, anchor, a, b, asked, trained, temps, u = case
    ext = Candidates.build(asked, CPU)
    if ext is None:
        assert all(k is None for k in asked)
        return
    w, limited = ext.limit(logits, trained)
    own = [trained if k is None else k for k in asked]
    assert w == max(own)
    out = select(limited, proj, anchor, a, b, SelectorParams(w),
                 SamplingBatch.build(temps, [0] * len(asked), [1.0] * len(asked), CPU), u)
    for i, k in enumerate(own):
        one = select(logits[i:i + 1], proj[i:i + 1], anchor[i:i + 1], a, b, SelectorParams(k),
                     SamplingBatch.build(temps[i:i + 1], [0], [1.0], CPU), u[i:i + 1])
        assert bool(out.bad[i]) == bool(one.bad[0]), f"row {i}: flagged differently"
        if one.bad[0]:
            continue                       # a NaN row: its draft carries no meaning
        assert bool(out.bad_lattice[i]) == bool(one.bad_lattice[0]), f"row {i}"
        assert torch.equal(out.candidates[i, :, :k], one.candidates[0]), f"row {i} (K={k})"
        assert torch.equal(out.draft[i], one.draft[0]), f"row {i} (K={k}, T={temps[i]})"
        torch.testing.assert_close(out.q[i, :, :k], one.q[0], rtol=0, atol=1e-6)
        assert not out.q[i, :, k:].any(), f"row {i}: mass past its {k} candidates"


def test_limit_leaves_a_batch_of_one_count_as_it_is():
    logits = torch.randn(2, 3, 10)
    w, same = limit(logits, [5, 5], torch.tensor([5, 5]), 4)
    assert w == 5 and same is logits
    w, same = limit(logits, [None, 4], torch.tensor([0, 4]), 4)
    assert w == 4 and same is logits
    w, cut = limit(logits, [2, None], torch.tensor([2, 0]), 4)
    assert w == 4 and torch.isfinite(cut).sum(-1).tolist() == [[2] * 3, [4] * 3]


@pytest.fixture(scope="module")
def engine():
    return Engine(tiny_pair("dflash2", block=4, seed=4), get_backend("cpu"))


def _greedy(n: int | None) -> Request:
    return Request((1, 2, 3), SamplingParams(max_new_tokens=12, num_candidates=n))


def test_greedy_output_is_target_only_s_at_every_count(engine):
    want, _ = engine.generate([_greedy(None)], spec=False)
    for n in (1, 2, TRAINED, 9, VOCAB):
        got, stats = engine.generate([_greedy(n)], block_size=4)
        assert got[0].token_ids == want[0].token_ids, f"num_candidates={n}"
        assert stats.candidates == {n: 1}


def test_the_count_changes_the_proposal(engine):
    """Not vacuous: at T = 1 the drafts (and so the acceptance) follow the count."""
    def accepted(n):
        reqs = [Request((1, 2, 3), SamplingParams(max_new_tokens=40, temperature=1.0, seed=s,
                                                  num_candidates=n), key=s) for s in range(6)]
        _, stats = engine.generate(reqs, block_size=4)
        return stats.accept_hist
    assert accepted(1) != accepted(VOCAB)


def test_rows_keep_their_counts_when_others_finish(engine):
    """Rows that end early leave the batch (compacted): every row left keeps its own count, so
    each sampled request's tokens stay its own."""
    counts_ = (1, VOCAB, 2, None, 9)
    reqs = [Request((1 + i, 2, 3), SamplingParams(max_new_tokens=3 if i in (0, 2) else 30,
                                                  temperature=1.0, seed=7 + i,
                                                  num_candidates=k), key=i)
            for i, k in enumerate(counts_)]
    batch, _ = engine.generate(reqs, block_size=4)
    for i, q in enumerate(reqs):
        alone, _ = engine.generate([q], block_size=4)
        assert batch[i].token_ids == alone[0].token_ids, f"request {i} (K={counts_[i]})"


def test_stats_report_each_request_s_count(engine):
    reqs = [_greedy(None), _greedy(9), _greedy(9), _greedy(1)]
    _, stats = engine.generate(reqs, block_size=4)
    assert stats.candidates == {1: 1, TRAINED: 1, 9: 2} == counts(reqs, TRAINED)
    assert EAGER_PROCS not in stats.fallbacks                  # the CPU backend has no graphs
    _, stats = engine.generate([_greedy(None)], block_size=4)
    assert stats.candidates == {TRAINED: 1}
    line = stats_line.stats_line(stats)
    assert "(block 4), candidates 4x1, accept histogram" in line, line
    _, stats = engine.generate([Request((1, 2), SamplingParams(max_new_tokens=3))], spec=False)
    assert stats.candidates == {} and "candidates" not in stats_line.stats_line(stats)
    assert stats_line.counts(SimpleNamespace(candidates={1: 1, 9: 2}, block_verified=0)) == "candidates 1x1, 9x2, "


@pytest.mark.parametrize("bad", [0, -3, 2.0, True, "4", 2**31])
def test_bad_counts_are_refused_by_name(bad):
    with pytest.raises(SamplingParamsError, match="num_candidates"):
        SamplingParams(num_candidates=bad)


def test_counts_past_the_vocabulary_and_target_only_runs_are_refused(engine):
    with pytest.raises(InvalidInputError, match="more candidates .* than the vocabulary"):
        engine.generate([_greedy(VOCAB + 1)], block_size=4)
    with pytest.raises(InvalidInputError, match="target-only"):
        engine.generate([_greedy(3)], spec=False)
    assert SamplingParams(num_candidates=np.int64(7)).num_candidates == 7


def test_an_in_process_target_only_loop_refuses_a_count_and_queues_nothing(engine):
    """The HTTP side refuses first; ``Scheduler.submit`` must too, for in-process callers."""
    sched = Scheduler(engine, 1, slots=2, max_model_len=64, max_queue=4)
    plain = Job(_greedy(None), lambda e: None)
    for bad in (_greedy(3), Request((1, VOCAB), SamplingParams())):
        with pytest.raises(InvalidInputError, match="target-only|outside the vocabulary"):
            sched.submit([plain, Job(bad, lambda e: None)])
        assert sched.waiting == 0
    sched.submit([plain])
    assert sched.waiting == 1
    Scheduler(engine, 4, slots=2, max_model_len=64, max_queue=4).submit(
        [Job(_greedy(3), lambda e: None)])


def test_adaptive_keys_costs_and_acceptance_by_count():
    plain = [Request((1,), SamplingParams()), Request((2,), SamplingParams())]
    assert mode_of(plain) == "greedy" and law_of(plain) == (0.0, 1.0, 0)
    wide = [Request((1,), SamplingParams(num_candidates=32)), Request((2,), SamplingParams())]
    assert mode_of(wide) == "greedy, candidates 32 trained"
    assert law_of(wide) == "mixed"
    assert law_of(wide[:1]) == (0.0, 1.0, 0, 32) != law_of([Request((1,), SamplingParams(
        num_candidates=8))])
    sampled = [Request((1,), SamplingParams(temperature=1.0, num_candidates=8))]
    assert mode_of(sampled) == "sampled, candidates 8"
    s = AdaptiveSchedule([1, 2, 4])
    s.begin(mode_of(sampled))
    assert s.mode == "sampled, candidates 8"
    with pytest.raises(InvalidInputError, match="schedule mode"):
        s.begin("warm, candidates 8")


def test_an_adaptive_run_times_its_own_width(engine):
    """The adaptive table measures steps at a new count apart from the trained one's."""
    engine.generate([_greedy(None)])
    before = {m for (_, _, m) in engine.table.samples}
    engine.generate([_greedy(VOCAB)])
    after = {m for (_, _, m) in engine.table.samples}
    assert after - before == {f"greedy, candidates {VOCAB}"}


LIMITS = Limits(("m",), 64, 8, VOCAB, lambda p: None)


def test_the_server_takes_and_checks_a_count():
    assert sampling_params({"num_candidates": 9}, LIMITS, 4, None, "logprobs") \
        .num_candidates == 9
    assert sampling_params({}, LIMITS, 4, None, "logprobs").num_candidates is None
    for body, where in (({"num_candidates": 0}, "num_candidates"),
                        ({"num_candidates": VOCAB + 1}, "num_candidates"),
                        ({"num_candidates": 2.5}, "num_candidates")):
        with pytest.raises(APIError) as info:
            sampling_params(body, LIMITS, 4, None, "logprobs")
        assert info.value.status == 400 and info.value.param == where
    target_only = Limits(("m",), 64, 1, VOCAB, lambda p: None)
    with pytest.raises(APIError, match="target-only"):
        sampling_params({"num_candidates": 9}, target_only, 4, None, "logprobs")
    assert issubclass(SamplingParamsError, DFlash2Error)
