"""The plumbing of ``scripts/device_check.py``: sections under one deadline, bounded steps (each
in its own process group, killed with its children on timeout or on a signal), run one after
another or side by side (a phase of sections in threads, their steps sharing a fixed number of
process slots, longest expected step first). Standard library only: the driver must run before
dflash2rt is installed. The reports' figures and the three output files: device_check_report."""

from __future__ import annotations

import heapq
import itertools
import os
import signal
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable



class Interrupted(Exception):
    """A signal (SIGTERM, SIGINT, SIGHUP) arrived: stop, then write what was gathered."""


@dataclass
class Step:
    label: str
    rc: int | None                # None: not started, or interrupted
    seconds: float
    timeout_s: float
    log: str
    timed_out: bool = False
    waited_s: float = 0.0         # time spent waiting for a process slot


@dataclass
class Section:
    name: str
    title: str
    budget_s: float               # the section's time limit
    need_s: float = 0.0           # time it needs left before the deadline to start (0: budget)
    status: str = "SKIPPED"       # PASS, FAIL or SKIPPED
    seconds: float = 0.0
    reason: str = ""
    figures: dict = field(default_factory=dict)
    steps: list = field(default_factory=list)
    phase: str = "serial"         # "serial" or "parallel" (started with the others of its phase)
    end: float = field(default=float("inf"), repr=False)    # monotonic time limit

    def fail(self, why: str) -> None:
        self.status = "FAIL"
        if why not in (self.reason or "").split("; "):     # said once, however many say it
            self.reason = "; ".join(filter(None, (self.reason, why)))


class Slots:
    """At most ``n`` child processes at once; a waiting step with a higher priority (its expected
    seconds: the longest first) gets the next free slot."""

    def __init__(self, n: int) -> None:
        self.n, self.free = max(1, n), max(1, n)
        self.cv = threading.Condition()
        self.waiting: list[tuple[float, int]] = []
        self.seq = itertools.count()

    def acquire(self, priority: float, give_up: Callable[[], bool]) -> bool:
        with self.cv:
            ticket = (-priority, next(self.seq))
            heapq.heappush(self.waiting, ticket)
            while not (self.free and self.waiting[0] == ticket):
                if give_up():
                    self.waiting.remove(ticket)
                    heapq.heapify(self.waiting)
                    self.cv.notify_all()
                    return False
                self.cv.wait(0.2)
            heapq.heappop(self.waiting)
            self.free -= 1
            self.cv.notify_all()
            return True

    def release(self) -> None:
        with self.cv:
            self.free += 1
            self.cv.notify_all()


class Runner:
    """The clock, the running children and the work folder (logs and reports, tarred at the
    end). ``slots``: child processes that may run at once in a parallel phase."""

    def __init__(self, work: Path, deadline_s: float, reserve_s: float, slots: int = 1) -> None:
        self.t0 = time.monotonic()
        self.work, self.deadline_s, self.reserve_s = work, deadline_s, reserve_s
        self.slots = Slots(slots)
        self.children: set[subprocess.Popen] = set()
        self.lock = threading.RLock()     # re-entered by the signal handler
        self.interrupted = ""         # the signal's name once one arrived
        (work / "logs").mkdir(parents=True, exist_ok=True)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._on_signal)

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def left(self) -> float:
        """Seconds until the deadline, less the time kept for packing the results."""
        return self.deadline_s - self.elapsed() - self.reserve_s

    def say(self, msg: str) -> None:
        line = f"== [{self.elapsed():5.1f}s] {msg}"
        with self.lock:
            print(line, flush=True)
            with open(self.work / "driver.log", "a") as fh:
                fh.write(line + "\n")

    def _on_signal(self, signum, _frame) -> None:
        self.interrupted = signal.Signals(signum).name
        self.kill_children()
        raise Interrupted(self.interrupted)

    def kill_children(self) -> None:
        with self.lock:
            children = list(self.children)
        for p in children:
            _kill_group(p)

    def _start(self, sec: Section) -> bool:
        left = self.left()
        need = sec.need_s or sec.budget_s
        if left < need:
            sec.reason = (f"deadline: {max(left, 0):.0f} s left, section needs {need:.0f} s "
                          f"(budget {sec.budget_s:.0f} s)")
            self.say(f"{sec.name}: SKIPPED ({sec.reason})")
            return False
        sec.end = time.monotonic() + min(sec.budget_s, left)
        sec.status = "PASS"            # running: a signal from here on fails the section
        self.say(f"{sec.name}: {sec.title} (budget {sec.budget_s:.0f} s)")
        return True

    def _body(self, sec: Section, body, start: float) -> None:
        """``body(sec)`` of a started section; its outcome and seconds said when it ends."""
        try:
            body(sec)
        except Interrupted as exc:
            sec.fail(f"interrupted by {exc}")
            raise
        except Exception as exc:  # noqa: BLE001 - a driver error fails this section only
            sec.fail(f"driver error: {type(exc).__name__}: {exc}")
        finally:
            self._ended(sec, start)

    def _ended(self, sec: Section, start: float) -> None:
        sec.seconds = round(time.monotonic() - start, 1)
        self.say(f"{sec.name}: {sec.status} in {sec.seconds:.0f} s"
                 + (f" ({sec.reason})" if sec.reason else ""))

    def run_section(self, sec: Section, body) -> None:
        """Run ``body(sec)`` if the deadline leaves the time the section needs."""
        start, started = time.monotonic(), False
        try:
            started = self._start(sec)
        except Interrupted as exc:       # between its start and its body
            if sec.status == "PASS":
                sec.fail(f"interrupted by {exc}")
                self._ended(sec, start)
            raise
        if started:
            self._body(sec, body, start)

    def run_parallel(self, items: list[tuple[Section, Callable]]) -> None:
        """Start every section that fits the deadline at once, each in a thread; their steps
        share the process slots. Returns when all have ended; a signal kills every child and
        fails every section still running."""
        threads: dict[str, threading.Thread] = {}
        ran: set[str] = set()            # sections whose body returned (a thread a signal
        start = time.monotonic()         # hit inside t.start() may die before its body)
        try:
            for sec, body in items:
                if self._start(sec):
                    threads[sec.name] = t = threading.Thread(
                        target=self._thread_body, args=(sec, body, time.monotonic(), ran),
                        name=sec.name, daemon=True)
                    t.start()
            for t in threads.values():
                while t.is_alive():
                    t.join(0.2)
        except Interrupted as exc:
            self.kill_children()
            for t in threads.values():
                waited = time.monotonic() + 2    # a signal inside t.start() may come before
                while t.ident is None and time.monotonic() < waited:   # or after the thread
                    time.sleep(0.01)                                   # began
                if t.ident is not None:
                    t.join(15)
            for sec, _ in items:         # started, but its body never ran or never ended
                if sec.status == "PASS" and sec.name not in ran:
                    sec.fail(f"interrupted by {exc}")
                    self._ended(sec, start)
            raise

    def _thread_body(self, sec: Section, body, start: float, ran: set[str]) -> None:
        try:
            self._body(sec, body, start)
            ran.add(sec.name)
        except Interrupted:
            pass                        # the main thread raises it too

    def steps(self, sec: Section, specs: list[dict]) -> list[Step]:
        """Several ``step`` calls (keyword dicts) of one section side by side, each taking a
        process slot; their Steps in the order given."""
        if not specs:
            return []
        with ThreadPoolExecutor(max_workers=len(specs)) as pool:
            futures = [pool.submit(self.step, sec, **s) for s in specs]
            return [f.result() for f in futures]

    def step(self, sec: Section, label: str, cmd: list[str], cap_s: float,
             env: dict | None = None, log: str | None = None, stdout: Path | None = None,
             expect_s: float = 0.0) -> Step:
        """One bounded command, in a process slot: output to logs/<log>.log (stdout to
        ``stdout`` if given); timeout = min(cap, the section's time left, the deadline's);
        rc 124 on timeout (the whole process group killed). ``expect_s``: its expected seconds
        (the longest waiting step gets the next slot)."""
        name = log or f"{sec.name}-{label}"
        path = self.work / "logs" / f"{name}.log"
        st = Step(label, None, 0.0, 0.0, str(path.relative_to(self.work)))
        sec.steps.append(st)
        asked = time.monotonic()

        def give_up() -> bool:
            return bool(self.interrupted) or time.monotonic() >= sec.end - 1
        if not self.slots.acquire(expect_s, give_up):
            if self.interrupted:
                raise Interrupted(self.interrupted)
            sec.fail(f"{label}: not started, no time left in the section's budget")
            return st
        try:
            return self._run(sec, st, cmd, cap_s, env, path, stdout, asked)
        finally:
            self.slots.release()

    def _run(self, sec, st, cmd, cap_s, env, path, stdout, asked) -> Step:
        start = time.monotonic()
        st.waited_s = round(start - asked, 1)
        timeout = min(cap_s, sec.end - start, self.left() + self.reserve_s)
        st.timeout_s = round(max(timeout, 0), 1)
        if timeout < 1:
            sec.fail(f"{st.label}: not started, no time left in the section's budget")
            return st
        with open(path, "w") as fh, open(stdout or os.devnull, "w") as out:
            fh.write(f"$ {' '.join(cmd)}\n")
            fh.flush()
            child = None
            try:
                with self.lock:
                    if self.interrupted:
                        raise Interrupted(self.interrupted)
                    child = subprocess.Popen(
                        cmd, stdout=out if stdout else fh,
                        stderr=fh if stdout else subprocess.STDOUT,
                        env={**os.environ, **(env or {})}, process_group=0)
                    self.children.add(child)
                st.rc = child.wait(timeout)
            except Interrupted as exc:            # the signal arrived in this (main) thread
                fh.write(f"\n!! interrupted by {exc}: process group killed\n")
                raise
            except subprocess.TimeoutExpired:
                _kill_group(child)
                st.rc, st.timed_out = 124, True
                fh.write(f"\n!! timed out after {timeout:.0f} s: process group killed\n")
            finally:
                if child is not None:
                    with self.lock:
                        self.children.discard(child)
                st.seconds = round(time.monotonic() - start, 1)
            if self.interrupted:
                st.rc = None
                fh.write(f"\n!! interrupted by {self.interrupted}: process group killed\n")
                raise Interrupted(self.interrupted)
        return st

    def tail(self, st: Step, lines: int = 1) -> str:
        text = (self.work / st.log).read_text(errors="replace").strip().splitlines()
        return " | ".join(x.strip() for x in text[-lines:])

    def why(self, st: Step) -> str:
        if st.rc is None:
            return f"{st.label}: not started"
        if st.timed_out:
            return f"{st.label}: timed out after {st.timeout_s:.0f} s"
        return f"{st.label}: exit {st.rc}: {self.tail(st)[-300:]}"


def _kill_group(p: subprocess.Popen | None) -> None:
    """SIGTERM, then SIGKILL, to the child's whole process group."""
    if p is None or p.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
        try:
            os.killpg(p.pid, sig)
            p.wait(wait)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue
