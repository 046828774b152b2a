"""The Runner (``engine/runner.py``) against its docstrings, with every time read from a scripted
clock (``time.perf_counter`` replaced: graph capture, replay and catch-up advance it by fixed
seconds, nothing else does), so each figure is exact and independent of the machine:

- a graphed step's device time is its replays' time, and ``host_t0 - t0``; a step reports only
  the capture seconds it spent; eager steps report no device time;
- ``trial`` returns its step's seconds, capture excluded, and changes nothing of the batch;
- target-only steps of a speculative run defer their draft context; the next speculative step
  of any block (2 included) or ``settle`` projects it once, reporting positions and seconds;
- ``max_len``: prompt + max_new_tokens up to the target's max_position_embeddings is accepted,
  past it refused with that figure; the static caches hold the rows rounded up to LEN_STEP, are
  kept for a batch that fits exactly, and a pair without a draft runs and grows them;
- ``start`` makes the rope tables the caches need before any step, and a watermark record
  holds max_new_tokens + one block + 1 positions;
- a Step built without catch-up fields has none."""

from __future__ import annotations

import time

import pytest
import torch

from dflash2rt import get_backend
from dflash2rt.backend import Fallbacks
from dflash2rt.engine import stages
from dflash2rt.engine.engine import Engine
from dflash2rt.engine.request import Request, SamplingParams
from dflash2rt.engine.runner import LEN_STEP, Step
from dflash2rt.errors import InvalidInputError
from dflash2rt.models.pair import ModelPair
from dflash2rt.watermark import WatermarkKey

from fake_clock import Clock
from test_engine_graphs import ReplayAdapter, _backend
from tiny_models import tiny_pair

CAPTURE, REPLAY, CATCH_UP = 100.0, 2.0, 5.0
PROMPTS = [(1, 2, 3), (4, 5, 6, 7, 8), (9,)]


class TimedAdapter(ReplayAdapter):
    """Captures take CAPTURE seconds, replays REPLAY seconds, on the scripted clock."""

    def __init__(self, clock: Clock) -> None:
        super().__init__()
        self.clock = clock

    def capture(self, fn, pool):
        self.clock.now += CAPTURE
        graph, clock = super().capture(fn, pool), self.clock

        class Timed:
            def replay(self_inner):
                clock.now += REPLAY
                graph.replay()
        return Timed()


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(time, "perf_counter", c)
    real = stages.catch_up_draft

    def catch_up(*a, **k):
        c.now += CATCH_UP
        return real(*a, **k)
    monkeypatch.setattr(stages, "catch_up_draft", catch_up)
    return c


def _reqs(temps=(0.0, 1.0, 0.6), n=24, prompts=PROMPTS):
    return [Request(p, SamplingParams(max_new_tokens=n, temperature=t, seed=4, ignore_eos=True))
            for p, t in zip(prompts, temps)]


def _started(backend, spec=True, room=4, pair=None):
    engine = Engine(pair or tiny_pair("dflash2", block=4, seed=1), backend)
    reqs = _reqs()
    st = engine.runner.start(reqs, spec, room, None, Fallbacks().report, {})
    engine.runner.prefill(st, [q.prompt_ids for q in reqs])
    return engine.runner, st


def _step(runner, st, block):
    step = runner.step(st, block)
    st.host_lens = st.lens.tolist()
    return step


def test_graphed_steps_report_their_replays_as_device_time_and_only_their_capture(clock):
    adapter = TimedAdapter(clock)
    with torch.inference_mode():
        runner, st = _started(_backend(adapter))
        for k in range(3):
            before = adapter.replays
            step = _step(runner, st, 4)
            if k == 0:
                assert step.capture_s >= CAPTURE
                continue
            device = REPLAY * (adapter.replays - before)
            assert device > 0 and step.capture_s == 0.0, k
            assert step.device_s == device and step.host_t0 - step.t0 == device, k


def test_eager_steps_report_no_device_or_capture_time(clock):
    with torch.inference_mode():
        runner, st = _started(get_backend("cpu"))
        for block in (4, 1, 4):
            step = _step(runner, st, block)
            assert step.device_s == 0.0 and step.capture_s == 0.0
            assert step.host_t0 >= step.t0


def test_trial_returns_its_steps_seconds_without_capture_and_changes_nothing(clock):
    adapter = TimedAdapter(clock)
    with torch.inference_mode():
        runner, st = _started(_backend(adapter))
        lens, anchor = st.lens.clone(), st.anchor.clone()
        first = runner.trial(st, 2)                  # a new block: captured inside the trial
        assert 0.0 <= first < CAPTURE
        for _ in range(2):
            before = adapter.replays
            seconds = runner.trial(st, 2)
            assert seconds == REPLAY * (adapter.replays - before) > 0
        assert torch.equal(st.lens, lens) and torch.equal(st.anchor, anchor)


def test_deferred_draft_context_is_projected_once_by_the_next_spec_step_or_settle(clock):
    with torch.inference_mode():
        runner, st = _started(get_backend("cpu"))
        got = [(s.deferred, s.catch_up_s) for s in (_step(runner, st, b) for b in (1, 1, 2, 4))]
        assert got == [(0, 0.0), (0, 0.0), (2, CATCH_UP), (0, 0.0)]
        _step(runner, st, 1)
        assert runner.settle(st) == (1, CATCH_UP)
        assert runner.settle(st) == (0, 0.0)
        step = _step(runner, st, 3)
        assert (step.deferred, step.catch_up_s) == (0, 0.0)
        assert runner.settle(None) == (0, 0.0)


def test_a_step_built_without_catch_up_has_none():
    step = Step([0], 1, 1, [[0, 0, 7]], 0.0, 0.0, 0.0, 0.0)
    assert step.catch_up_s == 0.0 and step.deferred == 0
    assert step.tokens(0) == [7] and step.accepted == [0]


@pytest.mark.parametrize("block", [1, 2, 4, 8])
def test_max_len_accepts_up_to_max_position_embeddings_and_names_the_excess(block):
    pair = tiny_pair("dflash2", block=4, seed=1)
    runner = Engine(pair, get_backend("cpu")).runner
    limit = pair.target.cfg.max_position_embeddings
    prompt = tuple(range(1, 11))
    for total in (limit - 1, limit):
        reqs = [Request(prompt, SamplingParams(max_new_tokens=total - len(prompt))),
                Request((1,), SamplingParams(max_new_tokens=3))]
        assert runner.max_len(reqs, block) >= total + block - 1
    for total in (limit + 1, limit + 3):
        reqs = [Request(prompt, SamplingParams(max_new_tokens=total - len(prompt)))]
        with pytest.raises(InvalidInputError, match=rf"\({total}\) exceeds .*={limit}"):
            runner.max_len(reqs, block)


def test_static_caches_round_rows_up_and_are_kept_for_a_batch_that_fits_exactly():
    pair = tiny_pair("dflash2", block=4, seed=1)
    runner = Engine(pair, _backend(ReplayAdapter())).runner
    room = 4
    for n_new in (20, 300):
        reqs = _reqs(n=n_new)
        need = runner.max_len(reqs, room)
        runner.start(reqs, True, room, None, Fallbacks().report, {})
        rows = runner.static[0].max_len
        assert rows % LEN_STEP == 0 and need <= rows < need + LEN_STEP, (n_new, need, rows)
    runner.close()
    exact = [Request((1, 2, 3), SamplingParams(max_new_tokens=LEN_STEP - 3 - room - 1))]
    assert runner.max_len(exact, room) == LEN_STEP
    runner.start(exact, True, room, None, Fallbacks().report, {})
    kept = runner.static
    runner.start(exact, True, room, None, Fallbacks().report, {})
    assert runner.static is kept


def test_start_makes_every_models_rope_table_for_the_caches(monkeypatch):
    pair = tiny_pair("dflash2", block=4, seed=1)
    for p in (pair, ModelPair(pair.target, None)):
        covers = {}
        for m in (p.target, p.draft):
            if m is not None:
                real = m.rope_table
                monkeypatch.setattr(m, "rope_table", lambda d, t, n, m=m, real=real: (
                    covers.setdefault(id(m), []).append(n), real(d, t, n))[1])
        runner = Engine(p, get_backend("cpu")).runner
        st = runner.start(_reqs(), p.draft is not None, 4, None, Fallbacks().report, {})
        models = [m for m in (p.target, p.draft) if m is not None]
        assert {id(m): max(covers.get(id(m), [0])) for m in models} \
            == {id(m): st.target_storage.max_len for m in models}
        monkeypatch.undo()


def test_a_pair_without_a_draft_replays_and_grows_its_static_caches():
    """Target-only runs of a draft-less pair on a graph backend: a batch that fits, then one
    that outgrows the caches, give the eager tokens."""
    target_only = ModelPair(tiny_pair("dflash2", block=4, seed=1).target, None)
    adapter = ReplayAdapter()
    engine = Engine(target_only, _backend(adapter))
    eager = Engine(target_only, get_backend("cpu"))
    for temps in ((0.0, 1.0, 0.6), (1.0, 0.0, 0.7), (0.5,) * 5):
        prompts = (PROMPTS * 2)[:len(temps)]
        reqs = _reqs(temps, n=6, prompts=prompts)
        got, _ = engine.generate(reqs, spec=False)
        want, _ = eager.generate(reqs, spec=False)
        assert [o.token_ids for o in got] == [o.token_ids for o in want]
        assert engine.runner.static[1] is None
    assert engine.runner.static[0].batch_size >= 5 and adapter.replays > 0


@pytest.mark.parametrize("room", [2, 4, 8])
def test_a_watermark_record_holds_max_new_tokens_plus_a_block_plus_one(room):
    runner = Engine(tiny_pair("dflash2", block=4, seed=1), get_backend("cpu")).runner
    key = WatermarkKey(bytes(range(32)))
    for n_new in range(LEN_STEP - room - 4, LEN_STEP - room + 2):
        reqs = _reqs(n=n_new)[:2] + _reqs(n=3)[2:]
        st = runner.start(reqs, True, room, key, Fallbacks().report, {})
        assert st.wm.record.shape[1] >= n_new + room + 1, (room, n_new)
