"""The run's results (per op × dtype errors, per level outcomes, metrics, exemptions, errors
outside tests, the implementation that ran) and the JSON report written from them.

A level passes only on evidence: the rule (minimum executed per level, dtype skips, "not
selected", "skipped" for a level that cannot apply) is in ``verdict.py``; ``reports.py`` writes
the Markdown, the terminal summary and the JUnit verdict from ``as_dict``.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from . import verdict

LEVELS = ("L0", "L1", "L2", "L3", "L4", "graphs")
LEVEL_TITLES = {
    "L0": "reference self-check (exact laws, mutation detection)",
    "L1": "op and decision conformance vs the float64 reference",
    "L2": "induced law of the verifier on a uniform lattice",
    "L3": "joint law over several rounds (context-dependent tables)",
    "L4": "end to end on a model through the Engine",
    "graphs": "graph replay == eager",
}


@dataclass
class OpStat:
    op: str
    dtype: str
    kind: str
    max_abs: float = 0.0
    max_rel: float = 0.0
    atol: float | None = None
    rtol: float | None = None
    reason: str = ""
    checks: int = 0
    mismatches: int = 0
    passed: bool = True


@dataclass
class Results:
    """Filled during the session by ``compare.check`` and the level tests."""

    ops: dict[tuple[str, str], OpStat] = field(default_factory=dict)
    levels: dict[str, dict[str, Any]] = field(default_factory=lambda: {
        lv: {"passed": 0, "failed": 0, "skipped": 0, "tests": []} for lv in LEVELS})
    metrics: dict[str, dict[str, Any]] = field(default_factory=dict)
    exemptions: list[dict[str, Any]] = field(default_factory=list)
    started: float = field(default_factory=time.time)
    selected: dict[str, int] = field(default_factory=dict)   # level -> tests left after -k
    typed: dict[str, int] = field(default_factory=dict)      # of them, parametrized by dtype
    errors: list[dict[str, Any]] = field(default_factory=list)   # collect / setup / teardown
    not_applicable: dict[str, str] = field(default_factory=dict)   # level -> why it cannot run
    run_reasons: list[str] = field(default_factory=list)     # failures outside any level
    implementation: dict[str, Any] = field(default_factory=dict)
    interrupted: str | None = None

    def _stat(self, ctx, op: str, kind: str) -> OpStat:
        key = (op, ctx.dtype)
        if key not in self.ops:
            self.ops[key] = OpStat(op, ctx.dtype, kind)
        return self.ops[key]

    def record_float(self, ctx, op: str, max_abs: float, max_rel: float, tol, ok: bool) -> None:
        s = self._stat(ctx, op, "float")
        s.max_abs, s.max_rel = max(s.max_abs, max_abs), max(s.max_rel, max_rel)
        s.atol, s.rtol, s.reason = tol.atol, tol.rtol, tol.reason
        s.checks += 1
        s.passed &= ok

    def record_exact(self, ctx, op: str, mismatches: int, size: int) -> None:
        s = self._stat(ctx, op, "exact")
        s.checks += 1
        s.mismatches += mismatches
        s.passed &= mismatches == 0

    def metric(self, level: str, name: str, value: Any) -> None:
        self.metrics.setdefault(level, {})[name] = value

    def exempt(self, level: str, what: str, **detail: Any) -> None:
        self.exemptions.append({"level": level, "what": what, **detail})

    def outcome(self, level: str, nodeid: str, outcome: str, message: str = "",
                typed: bool = False, dtype_skip: bool = False) -> None:
        """One test's outcome: passed, failed, skipped, xfailed, xpassed or error (its setup or
        teardown failed). ``typed``: parametrized by dtype; ``dtype_skip``: skipped because the
        backend does not declare that dtype (verdict.py)."""
        lv = self.levels.setdefault(level, {"passed": 0, "failed": 0, "skipped": 0, "tests": []})
        key = "errors" if outcome == "error" else outcome
        lv[key] = lv.get(key, 0) + 1
        if typed and outcome in verdict.EXECUTED:
            lv["typed_executed"] = lv.get("typed_executed", 0) + 1
        if dtype_skip:
            lv["dtype_skipped"] = lv.get("dtype_skipped", 0) + 1
        lv["tests"].append({"test": nodeid, "outcome": outcome,
                            **({"message": message[:2000]} if message else {})})

    def error(self, where: str, phase: str, message: str, level: str | None = None) -> None:
        """An error outside a test body: phase "collect" (a suite module failed to import),
        "setup" or "teardown"."""
        self.errors.append({"where": where, "phase": phase, "message": message[:2000],
                            **({"level": level} if level else {})})
        if level and phase == "teardown":       # a setup error is the test's own outcome
            lv = self.levels.setdefault(level, {"passed": 0, "failed": 0, "skipped": 0,
                                                "tests": []})
            lv["teardown_errors"] = lv.get("teardown_errors", 0) + 1

    def as_dict(self, environment: dict[str, str]) -> dict[str, Any]:
        judged, reasons = verdict.judge(self, LEVELS)
        levels = {}
        for lv, v in judged.items():
            d = self.levels.get(lv, {})
            levels[lv] = {"title": LEVEL_TITLES.get(lv, lv), "result": v["result"],
                          **{k: d.get(k, 0) for k in ("passed", "failed", "skipped", "xfailed",
                                                       "xpassed", "dtype_skipped")},
                          "errors": d.get("errors", 0) + d.get("teardown_errors", 0),
                          "executed": v["executed"], "minimum": v["minimum"],
                          "declared_minimum": verdict.MINIMUM.get(lv, 1),
                          "selected": self.selected.get(lv, 0), "reasons": v["reasons"],
                          "note": v["note"], "metrics": self.metrics.get(lv, {}),
                          "tests": d.get("tests", [])}
        return {
            "schema": "dflash2rt-conformance/1",
            "environment": environment,
            "duration_s": round(time.time() - self.started, 3),
            "result": "fail" if reasons else "pass",
            "reasons": reasons,
            "errors": self.errors,
            "implementation": self.implementation,
            "ops": [s.__dict__ for s in sorted(self.ops.values(), key=lambda s: (s.op, s.dtype))],
            "levels": levels,
            "exemptions": self.exemptions,
        }

    def write_json(self, path: str, environment: dict[str, str]) -> None:
        with open(path, "w") as f:
            json.dump(self.as_dict(environment), f, indent=2, default=str)

    def write_markdown(self, path: str, environment: dict[str, str]) -> None:
        from .reports import markdown

        with open(path, "w") as f:
            f.write(markdown(self.as_dict(environment)))
