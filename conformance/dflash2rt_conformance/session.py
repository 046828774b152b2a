"""The run's recorder, registered by the plugin for a conformance session: it sees every
collection report (a suite module that fails to import), every test phase (setup/teardown
errors, skips for an undeclared dtype), the final selection, and writes the verdict into the
JSON / Markdown / JUnit reports, the terminal summary and the exit status."""

from __future__ import annotations

import re
from typing import Any

import pytest

from . import env, reports
from .capability import NO_FP64_SKIP, TP_ELSEWHERE_SKIP

_LEVEL_FILE = re.compile(r"test_(l\d|graphs)[^/\\]*\.py")


def level_of_path(path: str) -> str | None:
    """The level a suite module belongs to, from its file name (test_l1_ops.py → L1)."""
    m = _LEVEL_FILE.search(str(path))
    return None if m is None else ("graphs" if m.group(1) == "graphs" else m.group(1).upper())


def _dtype_name(x: Any) -> str:
    return str(x).replace("torch.", "")


def _message(report) -> str:
    if report.skipped and isinstance(report.longrepr, tuple):
        return str(report.longrepr[-1])
    text = report.longreprtext or ""
    lines = [ln[2:].strip() for ln in text.splitlines() if ln.startswith("E ")]
    return "\n".join(lines) or text[-1500:]


class Recorder:
    """Per-session hooks (a plugin object, so no module globals): owns ``state.results``."""

    def __init__(self, state) -> None:
        self.st = state
        self.items: dict[str, tuple[str, str | None]] = {}   # nodeid -> (level, dtype or None)
        backend = None if state.error else state.selection.backend
        self.declared = {_dtype_name(d) for d in getattr(backend, "dtypes", ())}

    def pytest_collectreport(self, report) -> None:
        if report.passed:
            return
        where = report.nodeid or str(getattr(report, "fspath", "?"))
        msg = _message(report) if report.failed else f"skipped at collection: {_message(report)}"
        self.st.results.error(where, "collect", msg, level_of_path(where))

    def pytest_collection_finish(self, session) -> None:
        res = self.st.results
        for item in session.items:
            m = item.get_closest_marker("dflash2rt_level")
            if m is None:
                continue
            params = getattr(getattr(item, "callspec", None), "params", {})
            dtype = _dtype_name(params["dtype"]) if "dtype" in params else None
            self.items[item.nodeid] = (m.args[0], dtype)
            res.selected[m.args[0]] = res.selected.get(m.args[0], 0) + 1
            if dtype is not None:
                res.typed[m.args[0]] = res.typed.get(m.args[0], 0) + 1

    def pytest_runtest_logreport(self, report) -> None:
        """Count each test once: its call phase, or a setup that failed or skipped; a failed
        teardown is an error of its level."""
        info = self.items.get(report.nodeid)
        if info is None:
            return
        level, dtype = info
        res = self.st.results
        if report.when == "teardown":
            if report.failed:
                res.error(report.nodeid, "teardown", _message(report), level)
            return
        if report.when == "setup" and report.passed:
            return
        outcome = report.outcome
        if hasattr(report, "wasxfail"):
            outcome = "xfailed" if report.skipped else "xpassed"
        elif report.failed and report.when == "setup":
            outcome = "error"
            res.error(report.nodeid, "setup", _message(report), level)
        msg = report.wasxfail if hasattr(report, "wasxfail") else \
            ("" if report.passed else _message(report))
        # A skip for a dtype the backend does not declare does not count against its level;
        # nor does one for float64 arithmetic on a backend without float64 (the watermark), or
        # for tensor parallelism where it is not qualified (capability.py).
        undeclared = dtype is not None and dtype not in self.declared
        no_fp64 = NO_FP64_SKIP in msg and "float64" not in self.declared
        by_design = TP_ELSEWHERE_SKIP in msg
        res.outcome(level, report.nodeid, outcome, msg, typed=dtype is not None,
                    dtype_skip=outcome == "skipped" and (undeclared or no_fp64 or by_design))

    def pytest_keyboard_interrupt(self, excinfo) -> None:
        self.st.results.interrupted = str(excinfo.value) or excinfo.typename

    @pytest.hookimpl(tryfirst=True)          # before the JUnit plugin writes its file
    def pytest_sessionfinish(self, session, exitstatus) -> None:
        st, res = self.st, self.st.results
        if st.error:
            res.run_reasons.append(f"backend {st.backend_name!r} is unavailable: {st.error}")
        else:
            backend = st.selection.backend
            res.implementation, refused = env.implementation(backend, st.selection.how,
                                                             st.allow_fallback)
            if refused:
                res.run_reasons.append(refused)
            if getattr(backend, "graph_adapter", None) is None:
                res.not_applicable["graphs"] = (f"backend {backend.name} captures no graphs "
                                                "(graph mode: none)")
        if exitstatus == pytest.ExitCode.INTERRUPTED and not res.interrupted:
            res.interrupted = "pytest exit status 2"
        st.report = d = res.as_dict(st.environment)
        if st.json_path:
            reports.write_json(st.json_path, d)
        if st.markdown_path:
            reports.write_markdown(st.markdown_path, d)
        reports.junit(session.config, d)
        if d["result"] == "fail" and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter) -> None:
        d = self.st.report or self.st.results.as_dict(self.st.environment)
        terminalreporter.section("dflash2rt conformance")
        for line in reports.terminal_lines(d):
            terminalreporter.write_line(line)
