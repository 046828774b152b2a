"""The run's results (per op × dtype errors, per level outcomes, metrics, exemptions) and the
JSON and Markdown reports written from them."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

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

    def outcome(self, level: str, nodeid: str, outcome: str, message: str = "") -> None:
        lv = self.levels.setdefault(level, {"passed": 0, "failed": 0, "skipped": 0, "tests": []})
        lv[outcome] = lv.get(outcome, 0) + 1
        lv["tests"].append({"test": nodeid, "outcome": outcome,
                            **({"message": message[:2000]} if message else {})})

    def as_dict(self, environment: dict[str, str]) -> dict[str, Any]:
        levels = {}
        for lv, d in self.levels.items():
            verdict = "fail" if d["failed"] else ("pass" if d["passed"] else "skipped")
            levels[lv] = {"title": LEVEL_TITLES.get(lv, lv), "result": verdict,
                          **{k: d.get(k, 0) for k in ("passed", "failed", "skipped", "xfailed",
                                                       "xpassed")},
                          "metrics": self.metrics.get(lv, {}), "tests": d["tests"]}
        return {
            "schema": "dflash2rt-conformance/1",
            "environment": environment,
            "duration_s": round(time.time() - self.started, 3),
            "result": "fail" if any(d["failed"] for d in self.levels.values()) else "pass",
            "ops": [s.__dict__ for s in sorted(self.ops.values(), key=lambda s: (s.op, s.dtype))],
            "levels": levels,
            "exemptions": self.exemptions,
        }

    def write_json(self, path: str, environment: dict[str, str]) -> None:
        with open(path, "w") as f:
            json.dump(self.as_dict(environment), f, indent=2, default=str)

    def write_markdown(self, path: str, environment: dict[str, str]) -> None:
        d = self.as_dict(environment)
        out = [f"# dflash2rt conformance: backend `{environment.get('dflash2rt.backend')}` — "
               f"**{d['result'].upper()}**", "",
               f"Device: {environment.get('device')}; torch {environment.get('torch')}, "
               f"numpy {environment.get('numpy')}, triton {environment.get('triton')}; plugin "
               f"{environment.get('plugin.distribution')} {environment.get('plugin.version')}; "
               f"commit {environment.get('git.commit')}; {d['duration_s']:.1f} s.", "",
               f"Mode: {'quick' if environment.get('dflash2rt.quick') == 'True' else 'full'}; "
               f"L2-L4 sizes: {environment.get('dflash2rt.sizes', 'full')}.", "",
               "| level | what | result | passed | failed | skipped |", "|---|---|---|---|---|---|"]
        for lv, r in d["levels"].items():
            out.append(f"| {lv} | {r['title']} | {r['result']} | {r['passed']} | {r['failed']} "
                       f"| {r['skipped']} |")
        out += ["", "## Metrics", ""]
        for lv, m in d["levels"].items():
            for k, v in m["metrics"].items():
                out.append(f"- {lv} {k}: {v}")
        out += ["", "## Ops (max error vs the float64 reference)", "",
                "| op | dtype | kind | max abs | max rel | atol | rtol | checks | ok |",
                "|---|---|---|---|---|---|---|---|---|"]
        for s in d["ops"]:
            fmt = (lambda x: "-" if x is None else f"{x:.3g}")
            out.append(f"| {s['op']} | {s['dtype']} | {s['kind']} | {fmt(s['max_abs'])} | "
                       f"{fmt(s['max_rel'])} | {fmt(s['atol'])} | {fmt(s['rtol'])} | "
                       f"{s['checks']} | {'yes' if s['passed'] else 'NO'} |")
        out += ["", f"## Exemptions (near-ties within dtype noise): {len(d['exemptions'])}", ""]
        out += [f"- {e}" for e in d["exemptions"]] or ["- none"]
        failed = [t for r in d["levels"].values() for t in r["tests"] if t["outcome"] == "failed"]
        if failed:
            out += ["", "## Failures", ""]
            out += [f"- `{t['test']}`: {t.get('message', '').splitlines()[0] if t.get('message') else ''}"
                    for t in failed]
        with open(path, "w") as f:
            f.write("\n".join(out) + "\n")
