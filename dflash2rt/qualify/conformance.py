"""Runs the conformance suite (a separate package, reached only as a pytest subprocess)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape


def run_conformance(backend: str, out: Path, quick: bool, select: str | None = None,
                    small: bool = False, timeout_s: int = 900,
                    allow_fallback: bool = False) -> dict[str, Any]:
    """→ the suite's JSON (levels, ops, reasons, implementation) plus the exit code; writes
    out/junit.xml. ``small``: L2-L4 on the suite's small instances (``--dflash2rt-small``, for
    the interpreter lane). "status" is "pass" only when the suite's verdict is pass *and* it
    exited 0; "fail", "error", "timeout" or "not run" otherwise, with "reasons"."""
    junit, report = out / "junit.xml", out / "conformance.json"
    if importlib.util.find_spec("dflash2rt_conformance") is None:
        reason = "dflash2rt-conformance is not installed (pip install ./conformance)"
        _skipped_junit(junit, backend, reason)
        return {"status": "not run", "reason": reason}
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--pyargs",
           "dflash2rt_conformance", "--dflash2rt-backend", backend, "--junitxml", str(junit),
           "--dflash2rt-json", str(report), "--continue-on-collection-errors"] \
        + (["--dflash2rt-quick"] if quick else []) + (["--dflash2rt-small"] if small else []) \
        + (["--dflash2rt-allow-fallback"] if allow_fallback else []) \
        + (["-k", select] if select else [])
    report.unlink(missing_ok=True)              # never read a previous run's verdict
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "reason": f"the suite ran past {timeout_s} s"}
    if not report.is_file():
        tail = (proc.stdout + proc.stderr)[-2000:]
        if not junit.is_file():
            _skipped_junit(junit, backend, f"the suite did not run: {tail[-300:]}")
        return {"status": "error", "exit_code": proc.returncode, "reason": tail}
    data = json.loads(report.read_text(encoding="utf-8"))
    data["status"] = data.get("result", "error")
    data.setdefault("reasons", [])
    if data["status"] == "pass" and proc.returncode != 0:
        data["status"] = "fail"
        data["reasons"].append(f"the suite exited with code {proc.returncode}")
    data["selection"] = select or "all levels"
    data["exit_code"] = proc.returncode
    data["summary_line"] = (proc.stdout.strip().splitlines() or [""])[-1]
    return data


def _skipped_junit(path: Path, backend: str, reason: str) -> None:
    path.write_text(
        '<?xml version="1.0" encoding="utf-8"?>\n<testsuites><testsuite name="dflash2rt-'
        f'conformance" tests="1" skipped="1" failures="0" errors="0"><testcase classname='
        f'"qualify" name="conformance[{escape(backend)}]"><skipped message="{escape(reason)}"/>'
        "</testcase></testsuite></testsuites>\n")
