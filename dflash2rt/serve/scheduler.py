"""The server's engine loop: one thread owns the Engine and runs continuous batching.

Between two decode steps the loop drops the rows of finished and cancelled requests
(``BatchState.keep``), admits queued requests while the batch has free slots (their prefill,
as one cohort, then ``batching.merge``), and steps the batch with the block ``blocks.Blocks``
chooses (a fixed one, 1 for target-only decoding, or adaptive). Requests wait in a bounded
queue; ``submit`` refuses with ``Overloaded`` when it is full. Each request's tokens and its
end go to the request's ``sink`` (called on this thread), and ``after_turn`` is called once
the join's first tokens and again once the step's are all out: the HTTP side keeps a turn's
events and hands them to its event loop together. A failing prefill fails its cohort; a
failing step fails the requests in the batch, and the caches are made again for the next
ones.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from typing import Any, Callable

import torch

from ..backend import Fallbacks
from ..engine.candidates import check_no_counts, counts as candidate_counts
from ..engine.verification import block_rows, check_rule
from ..engine.engine import Engine
from ..engine.output import Collector
from ..engine.policy.table import bucket_of
from ..engine.request import Request, SamplingParams
from ..engine.stages import selector_params
from ..engine.stats import RunStats
from ..errors import InvalidInputError
from ..ops.procs import unpack_logprobs
from . import batching
from .blocks import Blocks
from .jobs import Event, Job, Overloaded


CALIBRATION_PROMPT = 128   # placeholder prompt tokens the adaptive cost table is timed over
# An idle loop wakes this often. ``dflash2rt serve`` runs it on the main thread, the only one
# that runs Python's signal handlers, and only between bytecodes: a SIGTERM that the kernel
# hands to another thread (uvicorn's, an executor's) only sets a flag, which a main thread
# blocked in an untimed wait would never look at, and the server would never drain.
IDLE_WAIT_S = 0.5


class Scheduler:
    """The engine loop (module docstring). ``block``: the fixed block of every step (>= 2,
    speculative), 1 (target-only) or None (adaptive); ``slots``: the largest batch;
    ``max_model_len``: prompt + output tokens a request may take; ``max_queue``: requests
    that may wait for a slot."""

    def __init__(self, engine: Engine, block: int | None, slots: int, max_model_len: int,
                 max_queue: int) -> None:
        pair = engine.pair
        if (block is None or block > 1) and pair.draft is None:
            raise InvalidInputError("speculative decoding needs a draft model: this pair has "
                                    "none (serve it with --no-spec)")
        if slots < 1 or max_queue < 0:
            raise InvalidInputError(f"slots must be >= 1 and max_queue >= 0, got {slots}, "
                                    f"{max_queue}")
        self.engine, self.block, self.slots = engine, block, slots
        self.max_model_len, self.max_queue = max_model_len, max_queue
        self.vocab = pair.target.cfg.vocab_size
        self.trained_k = selector_params(pair).top_k if pair.draft is not None else 1
        self.stats = RunStats("spec" if block is None or block > 1 else "target-only",
                              engine.backend.name, str(engine.backend.device), 1,
                              adaptive=block is None)
        self.blocks = Blocks(engine, block, self.stats)
        self.stats.block_size = self.blocks.room
        self.fallbacks = Fallbacks(engine.backend.standing_fallbacks)
        self._cv = threading.Condition()
        self._pending: deque[Job] = deque()
        self._live: dict[int, Job] = {}
        self._st = None
        self._caches: batching.Caches | None = None
        self._ids = itertools.count()
        self._closing = False
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="dflash2rt-engine", daemon=True)
        self._here = False            # run_here runs the loop instead of a thread of its own
        self.after_turn: Callable[[], None] = lambda: None   # each turn's events go out here

    # ---- the HTTP side ---------------------------------------------------------------------
    def start(self) -> None:
        """Start the loop (in a thread of its own, unless ``loop_in_caller`` said that
        ``run_here`` runs it); returns once the caches are allocated (raises what failed)."""
        if not self._here:
            self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error

    def submit(self, jobs: list[Job]) -> None:
        """Queue ``jobs`` (all or none): ``Overloaded`` when the queue cannot take them;
        ``InvalidInputError`` for a request this loop cannot decode as asked (``validate``'s
        checks, a candidate count on a target-only loop: no drafts to shape)."""
        for j in jobs:
            j.request.validate(self.vocab)
        if self.block == 1:
            check_no_counts([j.request for j in jobs])
        check_rule([j.request for j in jobs], self.block != 1)
        with self._cv:
            if self._error is not None:
                raise Overloaded(f"the engine loop stopped: {self._error}")
            if self._closing:
                raise Overloaded("the server is shutting down")
            if len(self._pending) + len(jobs) > self.max_queue + max(
                    self.slots - self._busy(), 0):
                raise Overloaded(f"the queue is full ({self.max_queue} waiting requests)")
            self._pending.extend(jobs)
            self._cv.notify()

    def loop_in_caller(self) -> None:
        """Say, before ``start``, that the loop will run in ``run_here``'s thread."""
        self._here = True

    def run_here(self) -> None:
        """Run the loop in this thread until the server closes (``loop_in_caller`` first).
        ``dflash2rt serve`` runs it on the main thread, which loaded the models: each thread
        that runs parallel torch ops on the CPU gets an OpenMP team of its own, and once the
        teams outnumber the cores every wait between two parallel regions sleeps, so a loop
        in a second thread steps far slower than the same steps on the first."""
        if not self._here:
            raise RuntimeError("run_here needs loop_in_caller() before start()")
        self._run()

    def cancel(self, job: Job) -> None:
        """The client went away: the request leaves the batch before the next step."""
        job.cancelled = True
        with self._cv:
            self._cv.notify()

    def close(self, timeout: float) -> None:
        """Cancel what is left and stop the loop (joined for up to ``timeout`` seconds)."""
        with self._cv:
            self._closing = True
            self._cv.notify()
        if self._thread.is_alive():                # (run_here's loop returns by itself)
            self._thread.join(timeout)

    @property
    def failed(self) -> BaseException | None:
        """What stopped the engine loop (None: it runs)."""
        return self._error

    def _busy(self) -> int:
        """Rows that hold a slot: live requests not yet finished (a finished one, whose client
        may already send its next request, leaves the batch at the loop's next turn)."""
        return sum(not job.finished for job in self._live.values())

    @property
    def running(self) -> int:
        return len(self._live)

    @property
    def waiting(self) -> int:
        return len(self._pending)

    # ---- the engine thread ------------------------------------------------------------------
    def _run(self) -> None:
        try:
            with torch.inference_mode(), self.engine.backend.run_context():
                self.stats.compile_s, _ = self.engine.compiler.run(
                    self.blocks.candidates, self.fallbacks.report)
                self._allocate()
                self._calibrate_ahead()
                self._ready.set()
                while self._iterate():
                    self.after_turn()
                self.after_turn()
        except BaseException as exc:       # noqa: BLE001 - reported to every request and start
            self._error = exc
            self._ready.set()
            with self._cv:
                jobs = list(self._pending) + list(self._live.values())
                self._pending.clear()
            self._live.clear()
            for job in jobs:
                self._fail(job, exc)
            self.after_turn()

    def _allocate(self) -> None:
        self._st = None
        self._caches = batching.allocate(self.engine, self.blocks.spec, self.blocks.room,
                                         self.slots, self.max_model_len, self.fallbacks.report,
                                         self.stats.time)

    def _calibrate_ahead(self) -> None:
        """Adaptive blocks: the cost table timed before the first request, greedy and sampled
        (``Blocks.calibrate_ahead``), on every slot filled with a placeholder prompt of
        ``CALIBRATION_PROMPT`` tokens (fewer if the context is shorter); the slots are scratch
        again afterwards, as before any request."""
        if not self.blocks.adaptive:
            return
        room = self.blocks.room
        n = max(1, min(CALIBRATION_PROMPT, self.max_model_len - room - 2))
        prompt = tuple(1 + i % (self.vocab - 1) for i in range(n))
        for params in (SamplingParams(max_new_tokens=room + 1),
                       SamplingParams(max_new_tokens=room + 1, temperature=1.0)):
            reqs = [Request(prompt, params, key=i) for i in range(self.slots)]
            st = batching.cohort(self._caches, 0, reqs, [-1 - i for i in range(self.slots)],
                                 self.engine.pair.device, self.vocab)
            self.engine.runner.prefill(st, [prompt] * self.slots)
            self.blocks.calibrate_ahead(st, reqs)

    def _iterate(self) -> bool:
        with self._cv:
            while not (self._pending or self._live or self._closing):
                self._cv.wait(IDLE_WAIT_S)
            if self._closing:
                for job in [*self._pending, *self._live.values()]:
                    job.cancelled = True
            for job in [j for j in self._pending if j.cancelled]:
                self._pending.remove(job)          # gone before its turn: no slot taken
                self._abort(job)
            joining = []
            while self._pending and self._busy() + len(joining) < self.slots:
                joining.append(self._pending.popleft())
        self._drop()
        if joining:
            try:
                self._join(joining)
            except Exception as exc:       # noqa: BLE001 - the cohort fails, the batch stays
                for job in joining:
                    self._live = {r: j for r, j in self._live.items() if j is not job}
                    if not job.finished:
                        self._fail(job, exc)
            self.after_turn()              # the first tokens out before the step
        if self._st is not None and self._st.size:
            try:
                self._step()
            except Exception as exc:       # noqa: BLE001 - the batch fails, the server stays
                for job in self._live.values():
                    self._fail(job, exc)
                self._live.clear()
                self.engine.close()        # graphs released; the caches made again
                self._allocate()
        if self._st is None or not self._st.size:
            self.blocks.idle()
        return not (self._closing and not self._live and not self._pending)

    def _join(self, jobs: list[Job]) -> None:
        """Prefill ``jobs`` as a cohort in the slots after the batch, then merge (the slots
        past the batch are scratch until the merge: a failure here leaves the batch as is)."""
        pair = self.engine.pair
        start = 0 if self._st is None else self._st.size
        self.blocks.before_join(self._st, len(jobs))
        rows = [next(self._ids) for _ in jobs]
        c = batching.cohort(self._caches, start, [j.request for j in jobs], rows, pair.device,
                            self.vocab)
        t0 = time.perf_counter()
        host = self.engine.runner.prefill(c, [j.request.prompt_ids for j in jobs])
        self.stats.time["prefill"] += time.perf_counter() - t0
        if self.blocks.spec:
            for k, n in candidate_counts([j.request for j in jobs], self.trained_k).items():
                self.stats.candidates[k] = self.stats.candidates.get(k, 0) + n
            self.stats.block_verified += block_rows([j.request for j in jobs])
        for i, (job, h) in enumerate(zip(jobs, host)):
            job.collector = Collector([job.request], pair.tokenizer, pair.eos_token_ids, None,
                                      self.vocab)
            self._live[rows[i]] = job
            lp = None if len(h) == 2 else unpack_logprobs(h[2:], 1, c.procs.logprobs,
                                                          c.procs.wants[i])
            self._add(job, [h[0]], lp)
        c = self._keep(c)
        if not c.size:                     # every joining request ended at its first token
            return
        parts = [p for p in (self._st, c) if p is not None and p.size]
        jobs_of = [self._live[r] for p in parts for r in p.rows]
        self._st = batching.merge(self._caches, parts, [j.request for j in jobs_of],
                                  [j.collector.outputs[0].token_ids for j in jobs_of],
                                  self.vocab)

    def _step(self) -> None:
        st = self._st
        jobs = [self._live[r] for r in st.rows]
        block = self.blocks.choose(st, [j.request for j in jobs],
                                   [j.collector.remaining([0])[0] for j in jobs])
        step = self.engine.runner.step(st, block)
        self.stats.steps += 1
        self.stats.syncs += 1
        self.stats.time["graphs"] += step.device_s
        self.stats.record_accepts(step.accepted, step.block)
        for i, h in enumerate(step.host):
            self._add(jobs[i], step.tokens(i), step.logprobs(i, st))
            st.host_lens[i] += h[0] + 1
        self._drop()
        seconds = time.perf_counter() - step.t0 - step.capture_s
        self.stats.record_step_time(step.block, bucket_of(len(step.rows)), seconds)
        self.blocks.observe(step, seconds)

    def _add(self, job: Job, tokens: list[int], logprobs: Any) -> None:
        """A row's committed tokens into its collector; the new ones (after any stop) and
        its end, if it ended, to its sink."""
        o = job.collector.outputs[0]
        before = len(o.token_ids)
        job.collector.add(0, tokens, logprobs)
        new = o.token_ids[before:]
        self.stats.generated += len(new)
        if new:
            if job.first_token is None:
                job.first_token = time.monotonic()
            job.sink(Event("tokens", list(new),
                           None if o.logprobs is None else o.logprobs[before:],
                           None if o.top_logprobs is None else o.top_logprobs[before:]))
        if o.finish_reason:
            job.finished = True
            job.sink(Event("done", output=job.collector.finish()[0]))

    def _drop(self) -> None:
        """Finished and cancelled rows out of the batch (cancelled ones told "aborted")."""
        if self._st is not None:
            self._st = self._keep(self._st)

    def _keep(self, st):
        alive = []
        for i, row in enumerate(st.rows):
            job = self._live[row]
            if job.cancelled and not job.finished:
                self._abort(job)
            if job.finished:
                del self._live[row]
            else:
                alive.append(i)
        return st.retain(alive)

    def _abort(self, job: Job) -> None:
        job.finished = True
        job.sink(Event("aborted"))

    def _fail(self, job: Job, exc: BaseException) -> None:
        job.finished = True
        job.sink(Event("error", error=exc))
