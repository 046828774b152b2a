"""The human and CI views of a run's report dict (``Results.as_dict``): the Markdown summary,
the terminal summary, and the verdict in JUnit (suite properties and one ``verdict`` test case).
Every view carries the verdict with its reasons, the implementation that ran and the L4 model."""

from __future__ import annotations

import json
from typing import Any


def write_json(path: str, d: dict[str, Any]) -> None:
    with open(path, "w") as f:
        json.dump(d, f, indent=2, default=str)


def write_markdown(path: str, d: dict[str, Any]) -> None:
    with open(path, "w") as f:
        f.write(markdown(d))


def implementation_line(impl: dict[str, Any]) -> str:
    if not impl:
        return "implementation: unknown (the backend was not created)"
    return (f"implementation: {impl.get('kernels')}; graphs: {impl.get('graphs')}; fallbacks: "
            f"{'; '.join(impl.get('fallbacks') or []) or 'none'}")


def level_line(lv: str, r: dict[str, Any]) -> str:
    if r["result"] == "not selected":
        return f"{lv:<6} NOT SELECTED"
    counts = (f"executed {r['executed']} (minimum {r['minimum']}): passed {r['passed']}, failed "
              f"{r['failed']}, skipped {r['skipped']}, errors {r['errors']}")
    why = "; ".join(r["reasons"]) or r.get("note", "")
    return f"{lv:<6} {r['result'].upper():<12} {counts}" + (f" — {why}" if why else "")


def terminal_lines(d: dict[str, Any]) -> list[str]:
    env = d["environment"]
    out = [f"verdict: {d['result'].upper()}" + (f" — {len(d['reasons'])} reason(s)"
                                                 if d["reasons"] else ""),
           *[f"  - {r}" for r in d["reasons"]],
           implementation_line(d["implementation"]),
           f"L4 model: {env.get('dflash2rt.l4_model', '?')}"]
    for lv, r in d["levels"].items():
        out.append(level_line(lv, r))
        out += [f"         {k}: {v}" for k, v in r["metrics"].items()]
    if d["exemptions"]:
        out.append(f"near-tie exemptions: {len(d['exemptions'])} (listed in the reports)")
    return out


def markdown(d: dict[str, Any]) -> str:
    env, impl = d["environment"], d["implementation"]
    out = [f"# dflash2rt conformance: backend `{env.get('dflash2rt.backend')}` — "
           f"**{d['result'].upper()}**", ""]
    if d["reasons"]:
        out += ["## Why it failed", "", *[f"- {r}" for r in d["reasons"]], ""]
    out += [f"Device: {env.get('device')}; torch {env.get('torch')}, numpy {env.get('numpy')}, "
            f"triton {env.get('triton')}; plugin {env.get('plugin.distribution')} "
            f"{env.get('plugin.version')}; commit {env.get('git.commit')}; "
            f"{d['duration_s']:.1f} s.", "",
            f"Mode: {'quick' if env.get('dflash2rt.quick') == 'True' else 'full'}; "
            f"L2-L4 sizes: {env.get('dflash2rt.sizes', 'full')}; "
            f"L4 model: {env.get('dflash2rt.l4_model', '?')}.", "",
            "## Implementation", "", f"- {implementation_line(impl)}"]
    out += [f"- {op}: {how}" for op, how in impl.get("ops", {}).items()]
    out += [f"- allow fallback: {'yes (--allow-fallback)' if impl.get('allow_fallback') else 'no'}",
            "", "## Levels", "",
            "| level | what | result | executed | minimum | passed | failed | skipped | errors "
            "| why |", "|---|---|---|---|---|---|---|---|---|---|"]
    for lv, r in d["levels"].items():
        why = "; ".join(r["reasons"]) or r.get("note", "")
        out.append(f"| {lv} | {r['title']} | {r['result']} | {r['executed']} | {r['minimum']} "
                   f"| {r['passed']} | {r['failed']} | {r['skipped']} | {r['errors']} | {why} |")
    if d["errors"]:
        out += ["", "## Errors outside tests", ""]
        out += [f"- {e['phase']} `{e['where']}`: {_first(e['message'])}" for e in d["errors"]]
    out += ["", "## Metrics", ""]
    for lv, m in d["levels"].items():
        out += [f"- {lv} {k}: {v}" for k, v in m["metrics"].items()]
    out += ["", "## Ops (max error vs the float64 reference)", "",
            "| op | dtype | kind | max abs | max rel | atol | rtol | checks | ok |",
            "|---|---|---|---|---|---|---|---|---|"]
    fmt = (lambda x: "-" if x is None else f"{x:.3g}")
    for s in d["ops"]:
        out.append(f"| {s['op']} | {s['dtype']} | {s['kind']} | {fmt(s['max_abs'])} | "
                   f"{fmt(s['max_rel'])} | {fmt(s['atol'])} | {fmt(s['rtol'])} | "
                   f"{s['checks']} | {'yes' if s['passed'] else 'NO'} |")
    out += ["", f"## Exemptions (near-ties within dtype noise): {len(d['exemptions'])}", ""]
    out += [f"- {e}" for e in d["exemptions"]] or ["- none"]
    bad = [t for r in d["levels"].values() for t in r["tests"]
           if t["outcome"] in ("failed", "error")]
    if bad:
        out += ["", "## Failures", ""]
        out += [f"- `{t['test']}` ({t['outcome']}): {_first(t.get('message', ''))}" for t in bad]
    return "\n".join(out) + "\n"


def _first(text: str) -> str:
    return next((ln.strip() for ln in str(text).splitlines() if ln.strip()), "")[:300]


def junit(config, d: dict[str, Any]) -> None:
    """Add the environment, the verdict and the implementation to pytest's JUnit XML (when
    ``--junitxml`` is on), and a ``dflash2rt_conformance::verdict`` test case that fails with
    the reasons, so a CI view of the XML alone shows a failed verdict. Call before the JUnit
    plugin writes its file (``pytest_sessionfinish``, tryfirst)."""
    try:
        from _pytest.junitxml import xml_key
    except ImportError:                                      # pragma: no cover - pytest moved it
        return
    xml = config.stash.get(xml_key, None)
    if xml is None:
        return
    impl = d["implementation"]
    props = {**d["environment"], "dflash2rt.result": d["result"],
             "dflash2rt.reasons": " | ".join(d["reasons"]) or "none",
             "dflash2rt.implementation": impl.get("kernels", "unknown"),
             "dflash2rt.graphs": impl.get("graphs", "unknown"),
             "dflash2rt.fallbacks": " | ".join(impl.get("fallbacks") or []) or "none",
             "dflash2rt.allow_fallback": str(bool(impl.get("allow_fallback")))}
    props.update({f"dflash2rt.op.{op}": how for op, how in impl.get("ops", {}).items()})
    props.update({f"dflash2rt.level.{lv}": f"{r['result']} (executed {r['executed']}, minimum "
                  f"{r['minimum']})" for lv, r in d["levels"].items()})
    for k, v in props.items():
        xml.add_global_property(k, v)
    import pytest

    text = "\n".join(d["reasons"]) or "pass"
    for when, outcome in (("call", "failed" if d["reasons"] else "passed"),
                          ("teardown", "passed")):
        xml.pytest_runtest_logreport(pytest.TestReport(
            "dflash2rt_conformance::verdict", ("dflash2rt_conformance", None, "verdict"), {},
            outcome, text if outcome == "failed" else None, when))
