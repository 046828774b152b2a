"""The verdict and its evidence, read out of a qualification report dict: what the first screen
of report.html and the merged matrix show. Fields a report does not carry are ``None`` (the
views say "not recorded"); nothing here is inferred beyond counting what was recorded."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

LEVELS = ("L0", "L1", "L2", "L3", "L4", "graphs")
NOT_RECORDED = "not recorded"


@dataclass
class Level:
    name: str
    title: str
    result: str                     # "pass" | "fail" | "skipped" | "not selected" | "not run"
    executed: int | None
    minimum: int | None
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    why: str = ""                   # the level's reasons, or its note


@dataclass
class Speed:
    batch: int
    target_only: float | None       # tokens/s
    speculative: float | None       # tokens/s
    ratio: float | None             # speculative / target-only
    tau: float | None               # mean tokens committed per verify step
    greedy_equal: bool | None


@dataclass
class Summary:
    backend: str
    verdict: str | None             # "pass" | "fail" | None (the report records no verdict)
    reasons: list[str]
    complete: bool
    conformance: str                # the conformance section's result or status
    levels: list[Level]
    kernels: str | None
    graphs: str | None
    ops: dict[str, str] | None      # op -> what executed it
    fallbacks: list[str] | None
    allow_fallback: bool | None
    speed: list[Speed]
    block_size: int | None
    device: str | None
    commit: str | None
    quick: bool | None
    model: str | None
    errors: list[dict[str, Any]] = field(default_factory=list)
    # the synced profiling pass: sampled / greedy spec step cost at the same block size, per
    # batch and temperature ({"batch", "temperature", "block_size", "ratio", ...}); [] if absent
    sampled_over_greedy: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ops_uniform(self) -> str | None:
        """The one implementation every op used, or None when they differ (or none recorded)."""
        kinds = set((self.ops or {}).values())
        return kinds.pop() if len(kinds) == 1 else None


def _level(name: str, d: dict[str, Any]) -> Level:
    counted = any(k in d for k in ("passed", "failed", "xfailed", "xpassed"))
    executed = d.get("executed")
    if executed is None and counted:
        executed = sum(int(d.get(k, 0)) for k in ("passed", "failed", "xfailed", "xpassed"))
    return Level(name, d.get("title", name), d.get("result", NOT_RECORDED), executed,
                 d.get("minimum"), int(d.get("passed", 0)), int(d.get("failed", 0)),
                 int(d.get("skipped", 0)), "; ".join(d.get("reasons") or []) or d.get("note", ""))


def _speed(batch: int, d: dict[str, Any]) -> Speed:
    # reports before the rename carry only the deprecated ar_* keys
    tonly = d.get("target_only_tokens_per_s", d.get("ar_tokens_per_s"))
    spec = d.get("spec_tokens_per_s")
    ratio = d.get("speedup_vs_target_only", d.get("speedup_vs_ar"))
    if ratio is None and tonly and spec is not None:
        ratio = spec / tonly
    return Speed(batch, tonly, spec, ratio, d.get("tau"), d.get("greedy_equal"))


def summarize(r: dict[str, Any]) -> Summary:
    sec = r.get("sections", {})
    conf = sec.get("conformance", {})
    env = conf.get("environment", {})
    sysd = r.get("system", {})
    impl = conf.get("implementation")
    verdict = r.get("verdict") or {}
    levels = conf.get("levels", {})
    names = list(dict.fromkeys([*(lv for lv in LEVELS if lv in levels), *levels]))
    if not names:
        names = list(LEVELS)
    fallbacks: list[str] | None = None
    if "fallbacks" in r or impl is not None:
        fallbacks = list(dict.fromkeys([*r.get("fallbacks", []),
                                        *((impl or {}).get("fallbacks") or [])]))
    e2e = sec.get("end_to_end", {})
    speed = [_speed(int(k[5:]), v) for k, v in e2e.items()
             if k.startswith("batch") and k[5:].isdigit() and isinstance(v, dict)]
    return Summary(
        backend=str(r.get("backend", "?")),
        verdict=verdict.get("result"),
        reasons=list(verdict.get("reasons") or []),
        complete=bool(r.get("complete")),
        conformance=str(conf.get("result") or conf.get("status") or "not run"),
        levels=[_level(n, levels.get(n, {"result": "not run"})) for n in names],
        kernels=(impl or {}).get("kernels") or sysd.get("kernels"),
        graphs=(impl or {}).get("graphs") or sysd.get("graphs"),
        ops=dict(impl["ops"]) if impl and impl.get("ops") else None,
        fallbacks=fallbacks,
        allow_fallback=(impl or {}).get("allow_fallback"),
        speed=sorted(speed, key=lambda s: s.batch),
        block_size=sec.get("block_sweep", {}).get("recommended_block_size"),
        device=sysd.get("device") or env.get("device"),
        commit=sysd.get("commit") or env.get("git.commit"),
        quick=r.get("quick"),
        model=r.get("model"),
        errors=list(conf.get("errors") or []),
        sampled_over_greedy=list((e2e.get("step_profile") or {}).get("sampled_over_greedy")
                                 or []),
    )


def ops_text(s: Summary) -> str:
    """"torch ops (all ops)", or grouped by what ran them when they differ: "triton kernel:
    conv_prepare, select; torch ops: verify"."""
    if not s.ops:
        return NOT_RECORDED
    if s.ops_uniform:
        return f"{s.ops_uniform} (all ops)"
    by: dict[str, list[str]] = {}
    for op, how in s.ops.items():
        by.setdefault(how, []).append(op)
    return "; ".join(f"{how}: {', '.join(ops)}" for how, ops in by.items())


def implementation_text(s: Summary) -> str:
    """The per-op line when recorded, else the backend's kernels description."""
    return ops_text(s) if s.ops else f"{s.kernels or NOT_RECORDED} (per op {NOT_RECORDED})"


def executed_text(lv: Level) -> str:
    """"198 / 85" (executed / minimum); "198 / not recorded" for reports without minimums."""
    ex = "–" if lv.executed is None else str(lv.executed)
    return f"{ex} / {NOT_RECORDED if lv.minimum is None else lv.minimum}"
