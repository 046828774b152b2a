"""The verdict of a run: a level passes only on evidence, and the run only when every reason to
fail is absent. ``judge`` turns the recorded outcomes into per-level results and the reasons.

The rule, per level (``MINIMUM`` holds the declared numbers):

- *selected*: the level's tests left after ``-k`` and ``--dflash2rt-quick``. None selected →
  ``"not selected"`` (neither a pass nor a fail), unless a suite module of the level failed to
  import: a collection error always fails its level and the run.
- *executed*: passed + failed + xfailed + xpassed (the test body ran). Skips and setup errors
  are not evidence.
- *dtype skips*: a test parametrized by ``dtype`` that skipped while the backend does not declare
  that dtype. They do not count against the level: ``minimum = min(MINIMUM[level], selected −
  dtype skips)``. Any other skip does count, beyond ``MINIMUM``.
- fail when: a test failed; a setup/teardown error; nothing executed ("everything skipped");
  fewer executed than the minimum; the level has dtype-parametrized tests selected and none ran
  (the backend declares none of the dtypes they test); selected tests never ran (the session
  stopped early). Otherwise pass.
- a level that cannot apply to the backend (``Results.not_applicable``: the graphs level on a
  backend without a graph adapter, i.e. graph mode "none") and executed nothing is
  ``"skipped"`` with that reason; it does not fail the run.

``MINIMUM`` is what a backend declaring a single dtype (float32, the narrowest declaration the
suite tests fully) executes of each level in the quick tier when the whole level is selected;
the full tier executes more. The run fails as well for reasons outside any level
(``Results.run_reasons``: backend unavailable, a refused kernel fallback, nothing selected).
"""

from __future__ import annotations

from typing import Any

MINIMUM = {
    "L0": 17,     # every reference self-check (none depends on the backend or a dtype),
                  # incl. 4 adaptive-schedule laws in Fractions and the peeking-schedule mutant
    "L1": 114,    # float32: 79 op samples (10 at V = 151,936 / 202,048, 9 of attention, 3 of
                  # watermark values) + 4 spec steps; 31 error inputs (4 of the watermark)
    "L2": 3,      # the quarter-table law and two float32 float-table laws
    "L3": 8,      # one float32 sampled joint law and the greedy chain; adaptive block sizes:
                  # 4 reference schedules + the engine's AdaptiveSchedule (float32) and the
                  # peeking-schedule sharpness check
    "L4": 3,      # greedy batch 3 and batch 1, the sampled law of the first tokens
    "graphs": 5,  # all but the second-stream test (skipped on devices without streams) and
                  # the watermarked one (skipped without float64: the watermark raises there)
}
EXECUTED = ("passed", "failed", "xfailed", "xpassed")


def _first_skip(tests: list[dict[str, Any]]) -> str:
    msg = next((t.get("message", "") for t in tests if t["outcome"] == "skipped"), "")
    return f" (first: {msg.splitlines()[0][:200]})" if msg else ""


def level_result(level: str, d: dict[str, Any], selected: int, typed: int, collect_errors: int,
                 not_applicable: str | None) -> dict[str, Any]:
    """→ {"result", "executed", "minimum", "reasons", "note"} for one level's counts ``d``."""
    executed = sum(d.get(k, 0) for k in EXECUTED)
    errors, skipped, dskip = d.get("errors", 0), d.get("skipped", 0), d.get("dtype_skipped", 0)
    teardown = d.get("teardown_errors", 0)
    out: dict[str, Any] = {"executed": executed, "minimum": 0, "reasons": [], "note": ""}
    reasons = out["reasons"]
    if collect_errors:
        reasons.append(f"{collect_errors} suite module(s) of this level failed to import "
                       "(collection error)")
    if selected == 0 and not collect_errors:
        out["result"], out["note"] = "not selected", "no test of this level was selected"
        return out
    if not_applicable and executed == 0 and not errors + teardown and not collect_errors:
        out["result"], out["note"] = "skipped", not_applicable
        return out
    out["minimum"] = minimum = min(MINIMUM.get(level, 1), max(selected - dskip, 0))
    if d.get("failed"):
        reasons.append(f"{d['failed']} test(s) failed")
    if errors:
        reasons.append(f"{errors} setup error(s)")
    if teardown:
        reasons.append(f"{teardown} teardown error(s)")
    unrun = selected - executed - skipped - errors
    if unrun > 0:
        reasons.append(f"{unrun} selected test(s) never ran (the session stopped early)")
    if selected and executed == 0:
        reasons.append(f"nothing executed: {skipped} of {selected} selected test(s) skipped"
                       + _first_skip(d.get("tests", [])))
    elif executed < minimum:
        reasons.append(f"executed {executed} < minimum {minimum} ({skipped} skipped, {dskip} of "
                       f"them for an undeclared dtype){_first_skip(d.get('tests', []))}")
    if executed and typed and d.get("typed_executed", 0) == 0:
        reasons.append(f"none of the {typed} dtype-parametrized test(s) ran: the backend "
                       "declares none of the dtypes they test")
    out["result"] = "fail" if reasons else "pass"
    return out


def judge(results, levels: tuple[str, ...]) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """(per-level verdicts, the run's reasons to fail; empty = pass)."""
    per_level: dict[str, dict[str, Any]] = {}
    reasons = list(results.run_reasons)
    collect: dict[str | None, int] = {}
    for e in results.errors:
        if e["phase"] == "collect":
            collect[e.get("level")] = collect.get(e.get("level"), 0) + 1
            reasons.append(f"collection error in {e['where']}: {_line(e['message'])}")
    same: dict[tuple[str, str], list[str]] = {}     # one reason per distinct error message
    for e in results.errors:
        if e["phase"] != "collect":
            same.setdefault((e["phase"], _line(e["message"])), []).append(e["where"])
    for (phase, msg), where in same.items():
        more = f" (and {len(where) - 1} more with this message)" if len(where) > 1 else ""
        reasons.append(f"{phase} error in {where[0]}{more}: {msg}")
    for lv in dict.fromkeys([*levels, *results.levels]):
        v = level_result(lv, results.levels.get(lv, {}), results.selected.get(lv, 0),
                         results.typed.get(lv, 0), collect.get(lv, 0),
                         results.not_applicable.get(lv))
        per_level[lv] = v
        reasons += [f"{lv}: {r}" for r in v["reasons"]]
    if results.interrupted:
        reasons.append(f"the session was interrupted: {results.interrupted}")
    if not results.run_reasons and all(v["result"] in ("not selected", "skipped")
                                       for v in per_level.values()):
        reasons.append("no conformance level executed a test (check the -k selection)")
    return per_level, list(dict.fromkeys(reasons))


def _line(text: str) -> str:
    lines = [ln for ln in str(text).splitlines() if ln.strip()]
    return (lines[-1] if lines else "")[:300]
