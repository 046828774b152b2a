"""The plumbing of ``scripts/device_check.py``: sections under one deadline, bounded steps (each
in its own process group, killed with its children on timeout or on a signal), the reports'
figures, the smoke probe, and the three files written to the output folder. Standard library
only: the driver must run before dflash2rt is installed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tarfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

TGZ_LIMIT = 50 * 2**20            # results.tgz stays under this (largest files dropped first)
OUT_FILES = ("summary.txt", "summary.json", "results.tgz")


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


@dataclass
class Section:
    name: str
    title: str
    budget_s: float
    status: str = "SKIPPED"       # PASS, FAIL or SKIPPED
    seconds: float = 0.0
    reason: str = ""
    figures: dict = field(default_factory=dict)
    steps: list = field(default_factory=list)

    def fail(self, why: str) -> None:
        self.status = "FAIL"
        self.reason = "; ".join(filter(None, (self.reason, why)))


class Runner:
    """The clock, the running child and the work folder (logs and reports, tarred at the end)."""

    def __init__(self, work: Path, deadline_s: float, reserve_s: float) -> None:
        self.t0 = time.monotonic()
        self.work, self.deadline_s, self.reserve_s = work, deadline_s, reserve_s
        self.child: subprocess.Popen | None = None
        self.section_end = float("inf")
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
        print(line, flush=True)
        with open(self.work / "driver.log", "a") as fh:
            fh.write(line + "\n")

    def _on_signal(self, signum, _frame) -> None:
        self.kill_child()
        raise Interrupted(signal.Signals(signum).name)

    def kill_child(self) -> None:
        p, self.child = self.child, None
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

    def run_section(self, sec: Section, body, *args) -> None:
        """Run ``body(sec, *args)`` if the deadline leaves the section's whole budget."""
        left = self.left()
        if left < sec.budget_s:
            sec.reason = f"deadline: {max(left, 0):.0f} s left, section budget {sec.budget_s:.0f} s"
            self.say(f"{sec.name}: SKIPPED ({sec.reason})")
            return
        start = time.monotonic()
        self.section_end = start + sec.budget_s
        sec.status = "PASS"            # running: a signal from here on fails the section
        try:
            self.say(f"{sec.name}: {sec.title} (budget {sec.budget_s:.0f} s)")
            body(sec, *args)
        except Interrupted as exc:
            sec.fail(f"interrupted by {exc}")
            raise
        except Exception as exc:  # noqa: BLE001 - a driver error fails this section only
            sec.fail(f"driver error: {type(exc).__name__}: {exc}")
        finally:
            sec.seconds = round(time.monotonic() - start, 1)
        self.say(f"{sec.name}: {sec.status} in {sec.seconds:.0f} s"
                 + (f" ({sec.reason})" if sec.reason else ""))

    def step(self, sec: Section, label: str, cmd: list[str], cap_s: float,
             env: dict | None = None, log: str | None = None,
             stdout: Path | None = None) -> Step:
        """One bounded command: output to logs/<log>.log (stdout to ``stdout`` if given);
        timeout = min(cap, the section's budget left, the deadline left); rc 124 on timeout
        (the whole process group killed)."""
        name = log or f"{sec.name}-{label}"
        path = self.work / "logs" / f"{name}.log"
        timeout = min(cap_s, self.section_end - time.monotonic(), self.left() + self.reserve_s)
        if timeout < 1:
            sec.fail(f"{label}: not started, no time left in the section's budget")
            sec.steps.append(Step(label, None, 0.0, 0.0, str(path.relative_to(self.work))))
            return sec.steps[-1]
        start = time.monotonic()
        st = Step(label, None, 0.0, round(timeout, 1), str(path.relative_to(self.work)))
        sec.steps.append(st)
        with open(path, "w") as fh, open(stdout or os.devnull, "w") as out:
            fh.write(f"$ {' '.join(cmd)}\n")
            fh.flush()
            try:
                self.child = subprocess.Popen(
                    cmd, stdout=out if stdout else fh, stderr=fh if stdout else subprocess.STDOUT,
                    env={**os.environ, **(env or {})}, process_group=0)
                st.rc = self.child.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill_child()
                st.rc, st.timed_out = 124, True
                fh.write(f"\n!! timed out after {timeout:.0f} s: process group killed\n")
            except Interrupted as exc:
                fh.write(f"\n!! interrupted by {exc}: process group killed\n")
                raise
            finally:
                self.child = None
                st.seconds = round(time.monotonic() - start, 1)
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


def load_json(path: Path) -> dict | list | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def conformance_figures(report: dict) -> dict:
    """Per level run: passed/executed and the result; the ops' checks; what ran."""
    fig = {"result": report.get("result"), "duration_s": report.get("duration_s")}
    for lv, d in report.get("levels", {}).items():
        if d.get("selected"):
            fig[lv] = f"{d['result']} {d['passed']}/{d['executed']} (skipped {d['skipped']})"
    ops = report.get("ops", [])
    if ops:
        fig["ops"] = (f"{sum(o['passed'] for o in ops)}/{len(ops)} op x dtype passed, "
                      f"{sum(o.get('checks', 0) for o in ops)} checks")
    impl = report.get("implementation", {})
    fig["implementation"] = impl.get("kernels")
    fig["kernel_fallbacks"] = impl.get("kernel_fallbacks", [])
    fig["sizes"] = report.get("environment", {}).get("dflash2rt.sizes")
    return fig


def conformance_verdict(sec: Section, runner: Runner, st: Step, report: dict | None,
                        prefix: str = "") -> None:
    """PASS needs exit 0 and a passing report; the figures go under ``prefix``."""
    if report is None:
        sec.fail(f"{runner.why(st)} (no JSON report)")
        return
    for k, v in conformance_figures(report).items():
        sec.figures[prefix + k] = v
    if st.rc != 0 or report.get("result") != "pass":
        sec.fail(f"{runner.why(st)}; " + "; ".join(report.get("reasons", [])[:5]))


def tar_results(work: Path, dest: Path) -> dict:
    """All of ``work`` into ``dest``; the largest files are dropped (and named) until it fits."""
    files = sorted((p for p in work.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    dropped: list[str] = []
    while True:
        with tarfile.open(dest, "w:gz") as tar:
            for p in files:
                tar.add(p, arcname=str(p.relative_to(work)))
        size = dest.stat().st_size
        if size < TGZ_LIMIT or not files:
            return {"bytes": size, "members": len(files), "dropped_over_50MB": dropped}
        big = files.pop()
        dropped.append(f"{big.relative_to(work)} ({big.stat().st_size} bytes)")


def write_outputs(out: Path, work: Path, meta: dict, sections: list[Section]) -> dict:
    """results.tgz (the work folder), then summary.json and summary.txt: nothing else."""
    out.mkdir(parents=True, exist_ok=True)
    for name in OUT_FILES:
        (out / name).unlink(missing_ok=True)
    meta["results_tgz"] = tar_results(work, out / "results.tgz")
    summary = {**meta, "sections": [asdict(s) for s in sections]}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / "summary.txt").write_text(summary_text(summary))
    return summary


def summary_text(s: dict) -> str:
    n = {k: sum(x["status"] == k for x in s["sections"]) for k in ("PASS", "FAIL", "SKIPPED")}
    lines = [f"dflash2rt device check: {s['result'].upper()} (exit {s['exit_status']}): "
             f"{n['PASS']} sections passed, {n['FAIL']} failed, {n['SKIPPED']} skipped; backend "
             f"{s['backend']}, float64-less lane {s['nofp64_backend']}"
             + ("; DRY RUN on the CPU" if s["dry_run"] else ""),
             f"deadline {s['deadline_s']:.0f} s; wall {s['wall_s']:.0f} s"
             + (f"; interrupted by {s['interrupted']}" if s["interrupted"] else ""),
             f"system: {s['system_line']}", ""]
    for sec in s["sections"]:
        lines.append(f"{sec['name']:<13} {sec['status']:<8} {sec['seconds']:6.1f} s  "
                     f"{sec['title']}")
        if sec["reason"]:
            lines.append(f"{'':<15}reason: {sec['reason']}")
        for k, v in sec["figures"].items():
            lines.append(f"{'':<15}{k}: {v}")
    t = s["results_tgz"]
    lines += ["", f"results.tgz: {t['members']} files, {t['bytes']} bytes"
              + (f"; dropped (over 50 MB): {', '.join(t['dropped_over_50MB'])}"
                 if t["dropped_over_50MB"] else "")]
    return "\n".join(lines) + "\n"
