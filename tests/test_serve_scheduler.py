"""The server's engine loop on its own (``serve/scheduler.py``), in a thread, without HTTP: what
it refuses, how many requests its queue takes, the events each request hears, the run stats it
keeps for /metrics and the stats line, and a close that waits for the loop."""

from __future__ import annotations

import threading
import time

import pytest

from dflash2rt import get_backend
from dflash2rt.engine.engine import Engine
from dflash2rt.engine.request import Request, SamplingParams
from dflash2rt.errors import InvalidInputError
from dflash2rt.models.pair import ModelPair
from dflash2rt.serve.jobs import Job, Overloaded
from dflash2rt.serve.scheduler import Scheduler

from tiny_models import tiny_pair

WAIT_S = 120.0
TRAINED = 4                                  # tiny_pair's selector_top_k


@pytest.fixture(scope="module")
def engine():
    return Engine(tiny_pair("dflash2", block=4, seed=4), get_backend("cpu"))


class Heard:
    """A job's sink: its events in order, and a flag once it has ended."""

    def __init__(self) -> None:
        self.events, self.ended = [], threading.Event()

    def __call__(self, event) -> None:
        self.events.append(event)
        if event.kind != "tokens":
            self.ended.set()

    @property
    def tokens(self) -> list[int]:
        return [t for e in self.events if e.kind == "tokens" for t in e.tokens]


def _jobs(params: list[SamplingParams]) -> tuple[list[Job], list[Heard]]:
    heard = [Heard() for _ in params]
    return [Job(Request((3 + i, 5, 7 + i), p), h)
            for i, (p, h) in enumerate(zip(params, heard))], heard


def _hold(job: Job, heard: Heard) -> tuple[threading.Event, threading.Event]:
    """Make ``job``'s sink hold the engine thread at its first tokens: → (reached, go), set
    once the thread is held, and set by the test to let it go on."""
    reached, go = threading.Event(), threading.Event()

    def held(event) -> None:
        heard(event)
        if event.kind == "tokens" and not reached.is_set():
            reached.set()
            go.wait(WAIT_S)
    job.sink = held
    return reached, go


@pytest.mark.parametrize("block", [2, 4, None])
def test_speculation_needs_a_draft(engine, block):
    alone = Engine(ModelPair(engine.pair.target, None), engine.backend)
    with pytest.raises(InvalidInputError, match="needs a draft model.*--no-spec"):
        Scheduler(alone, block, slots=2, max_model_len=64, max_queue=4)
    Scheduler(alone, 1, slots=2, max_model_len=64, max_queue=4)


@pytest.mark.parametrize("slots,max_queue", [(0, 4), (2, -1), (0, -1)])
def test_a_loop_without_a_slot_or_with_a_negative_queue_is_refused(engine, slots, max_queue):
    with pytest.raises(InvalidInputError, match="slots must be >= 1 and max_queue >= 0"):
        Scheduler(engine, 4, slots=slots, max_model_len=64, max_queue=max_queue)
    Scheduler(engine, 4, slots=1, max_model_len=64, max_queue=0)


@pytest.mark.parametrize("slots,max_queue", [(1, 0), (2, 3), (4, 1)])
def test_the_queue_takes_free_slots_plus_max_queue_all_or_none(engine, slots, max_queue):
    """Before the loop has taken any: ``slots`` + ``max_queue`` requests wait, one more is
    refused; a group that does not fit is refused whole, and nothing of it waits."""
    sched = Scheduler(engine, 4, slots=slots, max_model_len=64, max_queue=max_queue)
    room = slots + max_queue
    jobs, _ = _jobs([SamplingParams(max_new_tokens=2)] * (room + 1))
    with pytest.raises(Overloaded, match=f"queue is full \\({max_queue} waiting"):
        sched.submit(jobs)
    assert sched.waiting == 0
    sched.submit(jobs[:room - 1])
    with pytest.raises(Overloaded):
        sched.submit(jobs[room - 1:])
    assert sched.waiting == room - 1
    sched.submit(jobs[room - 1:room])
    assert sched.waiting == room
    with pytest.raises(Overloaded):
        sched.submit(jobs[room:])


@pytest.mark.parametrize("block", [4, 2, 1])
def test_each_request_hears_its_tokens_then_its_end_and_the_stats_count_them(engine, block):
    """Requests of different lengths in one loop: each hears its tokens, in order, then "done"
    with the same tokens, which are the engine's alone; the loop's stats count every token,
    step and sync, its prefill time, and (speculative) each request's candidate count."""
    params = [SamplingParams(max_new_tokens=n) for n in (3, 9, 6)] + \
        [SamplingParams(max_new_tokens=7, temperature=1.0, seed=11)]
    jobs, heard = _jobs(params)
    sched = Scheduler(engine, block, slots=4, max_model_len=64, max_queue=4)
    t0 = time.perf_counter()
    sched.start()
    try:
        sched.submit(jobs)
        for h in heard:
            assert h.ended.wait(WAIT_S)
    finally:
        sched.close(WAIT_S)
    elapsed = time.perf_counter() - t0
    total = 0
    for job, h in zip(jobs, heard):
        assert [e.kind for e in h.events][-1] == "done"
        assert all(e.kind == "tokens" for e in h.events[:-1])
        out = h.events[-1].output
        assert h.tokens == out.token_ids and len(out.token_ids) == job.request.params.max_new_tokens
        alone, _ = engine.generate([job.request], spec=block > 1,
                                   block_size=block if block > 1 else None)
        assert out.token_ids == alone[0].token_ids
        assert job.finished and job.first_token is not None
        total += len(out.token_ids)
    s = sched.stats
    assert (s.mode, s.adaptive, s.block_size) == ("spec" if block > 1 else "target-only",
                                                  False, block)
    assert s.generated == total
    assert s.steps > 0 and s.syncs == s.steps
    assert 0 < s.time["prefill"] < elapsed and s.time["graphs"] >= 0
    assert s.candidates == ({TRAINED: len(jobs)} if block > 1 else {})
    assert s.block_sizes == {block: s.steps}
    assert sum(s.accept_hist) == s.request_steps >= s.steps
    assert total - len(jobs) <= s.committed     # the first tokens come from the prefill


def test_close_returns_once_the_loop_has_ended_every_request(engine):
    """``close`` while the engine thread is busy (held inside a request's sink): it returns
    only after the loop has ended, every request told "done" or "aborted" by then, nothing
    left running or waiting."""
    jobs, heard = _jobs([SamplingParams(max_new_tokens=40)] * 3)
    reached, go = _hold(jobs[0], heard[0])
    sched = Scheduler(engine, 4, slots=2, max_model_len=64, max_queue=4)
    sched.start()
    sched.submit(jobs)
    assert reached.wait(WAIT_S)
    closing = threading.Thread(target=sched.close, args=(WAIT_S,))
    closing.start()
    for _ in range(10_000):                   # bounded: close takes the lock at once
        if sched._closing:
            break
        closing.join(0.01)
    assert sched._closing and closing.is_alive()       # waiting for the held loop
    go.set()
    closing.join(WAIT_S)
    assert not closing.is_alive()
    for h in heard:
        assert h.ended.is_set() and h.events[-1].kind in ("aborted", "done")
    assert heard[2].events[-1].kind == "aborted"       # never had a slot
    assert sched.running == 0 and sched.waiting == 0


@pytest.mark.parametrize("block", [4, 1])
def test_requests_that_end_at_their_first_token_leave_no_batch_behind(engine, block):
    """A loop whose first requests all end at their prefill's token (max_new_tokens=1) has no
    batch afterwards; the next requests are served as on a fresh loop."""
    sched = Scheduler(engine, block, slots=2, max_model_len=64, max_queue=4)
    sched.start()
    try:
        for params in ([SamplingParams(max_new_tokens=1)] * 2,
                       [SamplingParams(max_new_tokens=5), SamplingParams(max_new_tokens=1)]):
            jobs, heard = _jobs(params)
            sched.submit(jobs)
            for job, h in zip(jobs, heard):
                assert h.ended.wait(WAIT_S)
                assert h.events[-1].kind == "done", h.events[-1]
                assert len(h.tokens) == job.request.params.max_new_tokens
        assert sched.failed is None
    finally:
        sched.close(WAIT_S)


def test_a_cancelled_request_is_told_aborted_and_frees_its_slot(engine):
    """A request cancelled while it decodes (here by its own sink, on the engine thread, at
    its first tokens) leaves the batch at the next turn: it hears "aborted", no more tokens,
    and the request waiting for its one slot is served in full."""
    jobs, heard = _jobs([SamplingParams(max_new_tokens=40), SamplingParams(max_new_tokens=6)])
    sched = Scheduler(engine, 4, slots=1, max_model_len=64, max_queue=4)
    first = heard[0]

    def cancelling(event) -> None:
        first(event)
        if event.kind == "tokens":
            sched.cancel(jobs[0])
    jobs[0].sink = cancelling
    sched.start()
    try:
        sched.submit(jobs)
        assert heard[0].ended.wait(WAIT_S) and heard[1].ended.wait(WAIT_S)
    finally:
        sched.close(WAIT_S)
    kinds = [e.kind for e in heard[0].events]
    assert kinds[-1] == "aborted" and kinds.count("aborted") == 1
    assert 0 < len(heard[0].tokens) < 40
    assert heard[1].events[-1].kind == "done" and len(heard[1].tokens) == 6
    assert sched.running == 0 and sched.waiting == 0


def test_a_failing_prefill_fails_its_cohort_and_the_loop_goes_on(engine, monkeypatch):
    """A cohort's prefill raises while another request decodes: each request of the cohort
    hears "error" with the exception (none is left waiting), the decoding request goes on
    to its end, and later requests are served in full."""
    runner = engine.runner
    real, calls = runner.prefill, []

    def prefill(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("prefill broke")
        return real(*args, **kwargs)
    monkeypatch.setattr(runner, "prefill", prefill)
    sched = Scheduler(engine, 4, slots=3, max_model_len=64, max_queue=4)
    running, running_heard = _jobs([SamplingParams(max_new_tokens=40)])
    bad, bad_heard = _jobs([SamplingParams(max_new_tokens=5)] * 2)
    reached, go = _hold(running[0], running_heard[0])    # it waits for the bad cohort
    sched.start()
    try:
        sched.submit(running)
        assert reached.wait(WAIT_S)          # joined alone: the bad cohort comes after
        sched.submit(bad)
        go.set()
        for h in bad_heard:
            assert h.ended.wait(WAIT_S)
            assert h.events[-1].kind == "error" and "prefill broke" in str(h.events[-1].error)
        assert running_heard[0].ended.wait(WAIT_S)
        assert running_heard[0].events[-1].kind == "done" and len(running_heard[0].tokens) == 40
        good, good_heard = _jobs([SamplingParams(max_new_tokens=5)])
        sched.submit(good)
        assert good_heard[0].ended.wait(WAIT_S)
        assert good_heard[0].events[-1].kind == "done" and len(good_heard[0].tokens) == 5
    finally:
        sched.close(WAIT_S)
    assert sched.failed is None and sched.running == 0


def test_a_loop_that_dies_tells_every_request_and_refuses_more(engine):
    """An error the loop cannot keep to one batch (here its end-of-turn hook) stops it: every
    request running or waiting hears "error", ``failed`` says why, and ``submit`` refuses."""
    sched = Scheduler(engine, 4, slots=1, max_model_len=64, max_queue=4)
    turns = []

    def broken() -> None:
        turns.append(1)
        if len(turns) == 2:                   # after the first cohort's first tokens
            raise RuntimeError("hook broke")
    sched.after_turn = broken
    jobs, heard = _jobs([SamplingParams(max_new_tokens=40)] * 3)
    sched.submit(jobs)                       # before start: all three wait
    sched.start()
    try:
        for h in heard:
            assert h.ended.wait(WAIT_S)
            assert h.events[-1].kind == "error" and "hook broke" in str(h.events[-1].error)
        assert "hook broke" in str(sched.failed)
        with pytest.raises(Overloaded, match="engine loop stopped"):
            sched.submit(_jobs([SamplingParams()])[0])
    finally:
        sched.close(WAIT_S)
