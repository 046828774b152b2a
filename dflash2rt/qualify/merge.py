"""``dflash2rt report merge``: several qualification reports side by side. The first screen is
the per-backend verdict matrix (backend × level: PASS/FAIL, executed / minimum; the
implementation, fallbacks, speed, device, commit); below it, a checks × backends matrix with the
rows whose values differ between backends highlighted. HTML, Markdown and JSON."""

from __future__ import annotations

import json
from html import escape
from pathlib import Path
from typing import Any

from ..errors import InvalidInputError
from . import fmt
from .summary import (LEVELS, NOT_RECORDED, Summary, executed_text, implementation_text, ops_text,
                      summarize)


def _checks(r: dict[str, Any]) -> dict[str, Any]:
    sec = r.get("sections", {})
    conf = sec.get("conformance", {})
    s = summarize(r)
    out: dict[str, Any] = {"verdict": s.verdict or NOT_RECORDED, "device": s.device,
                           "commit": s.commit, "complete": r.get("complete"),
                           "conformance": conf.get("status", "not run")}
    out["conformance L2-L4 sizes"] = conf.get("environment", {}).get("dflash2rt.sizes", "n/a")
    for lv in s.levels:
        out[f"conformance {lv.name}"] = lv.result
        out[f"conformance {lv.name} executed / minimum"] = executed_text(lv)
    out["kernels"] = s.kernels
    out["per-op implementation"] = ops_text(s)
    out["graph mode"] = s.graphs
    for o in conf.get("ops", []):
        out[f"op {o['op']} {o['dtype']}"] = "pass" if o.get("passed") else "fail"
    for sp in s.speed:
        out[f"target-only tok/s (batch {sp.batch})"] = _round(sp.target_only)
        out[f"speculative tok/s (batch {sp.batch})"] = _round(sp.speculative)
        out[f"tau (batch {sp.batch})"] = _round(sp.tau)
        out[f"speedup vs target-only (batch {sp.batch})"] = _round(sp.ratio)
    b1 = sec.get("end_to_end", {}).get("batch1", {})
    out["greedy spec == target-only"] = b1.get("greedy_equal")
    out["graph replay == eager"] = sec.get("graphs", {}).get("replay_equals_eager", "n/a")
    out["recommended block size"] = s.block_size
    out["fallbacks"] = len(s.fallbacks) if s.fallbacks is not None else NOT_RECORDED
    return out


def _round(x: Any) -> Any:
    return round(x, 2) if isinstance(x, float) else x


def _verdict_row(s: Summary) -> dict[str, Any]:
    """One backend's line of the verdict matrix (JSON, and the source of both views)."""
    b1 = next((sp for sp in s.speed if sp.batch == 1), None)
    return {"backend": s.backend, "verdict": s.verdict or NOT_RECORDED, "reasons": s.reasons,
            "levels": {lv.name: {"result": lv.result, "executed": lv.executed,
                                 "minimum": lv.minimum} for lv in s.levels},
            "implementation": implementation_text(s),
            "fallbacks": NOT_RECORDED if s.fallbacks is None else s.fallbacks,
            "speedup_batch1": _round(b1.ratio) if b1 else None,
            "tau_batch1": _round(b1.tau) if b1 else None, "block_size": s.block_size,
            "device": s.device or NOT_RECORDED, "commit": s.commit or NOT_RECORDED}


def _times(x: Any) -> str:
    return "–" if x is None else "×" + fmt.num(x)


def _short_commit(c: str) -> str:
    return c if c == NOT_RECORDED else c[:12] + ("+dirty" if c.endswith("+dirty") else "")


def _level_names(rows: list[dict[str, Any]]) -> list[str]:
    seen = dict.fromkeys(n for r in rows for n in r["levels"])
    return [lv for lv in LEVELS if lv in seen] + [lv for lv in seen if lv not in LEVELS]


def _cell_text(d: dict[str, Any] | None) -> str:
    if not d:
        return "not run"
    ex = "–" if d["executed"] is None else d["executed"]
    mn = "?" if d["minimum"] is None else d["minimum"]
    return f"{d['result'].upper()} {ex}/{mn}"


def _cell_html(d: dict[str, Any] | None) -> str:
    """The result in bold over its counts ("NOT RUN" stays one result)."""
    if not d:
        return f"<b>{escape(_cell_text(d))}</b>"
    result, _, counts = _cell_text(d).rpartition(" ")
    return f"<b>{escape(result)}</b><br>{escape(counts)}"


def markdown(names: list[str], vrows: list[dict[str, Any]], rows: list[dict[str, Any]]) -> str:
    levels = _level_names(vrows)
    md = ["# dflash2rt cross-backend matrix", "",
          "## Verdict per backend", "",
          "Level cells: result and tests executed / minimum required (`?`: minimum not "
          "recorded).", "",
          "| backend | verdict | " + " | ".join(levels) + " | implementation | fallbacks | "
          "speedup b1 | τ b1 | block | device | commit |",
          "|---|---|" + "---|" * len(levels) + "---|---|---|---|---|---|---|"]
    for v in vrows:
        fb = v["fallbacks"] if isinstance(v["fallbacks"], str) else \
            ("; ".join(v["fallbacks"]) or "none")
        cells = [f"**{v['verdict'].upper()}**"] + [_cell_text(v["levels"].get(lv))
                                                  for lv in levels]
        cells += [v["implementation"], fb, _times(v["speedup_batch1"]),
                  fmt.text(v["tau_batch1"]), fmt.text(v["block_size"]), v["device"],
                  f"`{v['commit']}`"]
        md.append(f"| {v['backend']} | " + " | ".join(c.replace("|", "\\|") if not
                                                      c.startswith("`") else c
                                                      for c in cells) + " |")
    failing = [v for v in vrows if v["reasons"]]
    if failing:
        md += ["", "### Reasons", ""]
        md += [f"- **{v['backend']}**: {r}" for v in failing for r in v["reasons"]]
    md += ["", "## All checks", "", "Rows in bold differ between backends.", "",
           "| check | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    md += [f"| {'**' if r['differs'] else ''}{r['check']}{'**' if r['differs'] else ''} | "
           + " | ".join(fmt.text(v) for v in r["values"]) + " |" for r in rows]
    return "\n".join(md) + "\n"


CSS = ("body{font-family:'DejaVu Sans',Arial,sans-serif;max-width:1240px;margin:0 auto;"
       "padding:6px 16px;font-size:14px;color:#222}h1{font-size:20px;margin:4px 0}h2{font-size:"
       "17px;margin:16px 0 6px}table{border-collapse:collapse}td,th{border:1px solid #ccc;"
       "padding:3px 7px;font-size:13px;text-align:left;vertical-align:top}th{background:#f6f6f6}"
       ".diff{background:#ffd}.pass{color:#116329}.fail{color:#a40e26;font-weight:bold}"
       "td.lv.pass{background:#dafbe1}td.lv.fail{background:#ffebe9}td.lv{font-size:12px}"
       ".big{font-size:18px;font-weight:800;text-align:center}td.big.pass{background:#1a7f37;"
       "color:#fff}td.big.fail{background:#cf222e;color:#fff}.note{color:#666;font-size:12px}"
       "ul.reasons{color:#a40e26;font-size:13px;margin:4px 0}.small{font-size:12px}"
       "td.impl{min-width:220px}table.checks{width:100%;table-layout:fixed}"
       "table.checks td{overflow-wrap:anywhere}")


def _verdict_html(vrows: list[dict[str, Any]]) -> str:
    levels = _level_names(vrows)
    head = ("<tr><th>backend</th><th>verdict</th>" + "".join(f"<th>{escape(lv)}</th>"
                                                            for lv in levels)
            + "<th>implementation</th><th>fallbacks</th><th>speedup b1</th><th>τ b1</th>"
            "<th>block</th><th>device</th><th>commit</th></tr>")
    body = []
    for v in vrows:
        cls = v["verdict"].replace(" ", "-")
        results = {lv: (v["levels"].get(lv) or {}).get("result", "not run") for lv in levels}
        cells = "".join(f'<td class="lv {escape(results[lv].replace(" ", "-"))}">'
                        f"{_cell_html(v['levels'].get(lv))}</td>" for lv in levels)
        fb = v["fallbacks"] if isinstance(v["fallbacks"], str) else \
            ("; ".join(v["fallbacks"]) or "none")
        body.append(
            f'<tr data-backend="{escape(v["backend"])}"><th>{escape(v["backend"])}</th>'
            f'<td class="big {escape(cls)}">{escape(v["verdict"].upper())}</td>{cells}'
            f'<td class="small impl">{escape(v["implementation"])}</td>'
            f'<td class="small {"fail" if fb not in ("none", NOT_RECORDED) else ""}">'
            f"{escape(fb)}</td><td>{_times(v['speedup_batch1'])}</td>"
            f"<td>{fmt.html(v['tau_batch1'])}</td><td>{fmt.html(v['block_size'])}</td>"
            f"<td class=small>{escape(v['device'])}</td><td class=small>"
            f"{escape(_short_commit(v['commit']))}</td></tr>")
    reasons = "".join(f"<li><b>{escape(v['backend'])}</b>: {escape(r)}</li>"
                      for v in vrows for r in v["reasons"])
    return ('<section id="verdict-matrix"><h2>Verdict per backend</h2><p class=note>level '
            "cells: result, tests executed / minimum required (? = minimum not recorded)</p>"
            f"<table>{head}{''.join(body)}</table>"
            + (f'<ul id="reasons" class="reasons">{reasons}</ul>' if reasons else "")
            + "</section>")


def render_html(names: list[str], vrows: list[dict[str, Any]],
                rows: list[dict[str, Any]]) -> str:
    def cell(v: Any) -> str:
        return f'<td class="{v if v in ("pass", "fail") else ""}">{fmt.html(v)}</td>'

    html = ["<!doctype html><html><head><meta charset='utf-8'><title>dflash2rt matrix</title>"
            f"<style>{CSS}</style></head><body><h1>dflash2rt cross-backend matrix</h1>",
            _verdict_html(vrows),
            '<h2 id="checks">All checks</h2><p class=note>Highlighted rows differ between '
            "backends.</p><table class=checks><tr><th>check</th>"
            + "".join(f"<th>{escape(n)}</th>" for n in names) + "</tr>"]
    html += [f"<tr class=\"{'diff' if r['differs'] else ''}\"><td>{escape(r['check'])}</td>"
             + "".join(cell(v) for v in r["values"]) + "</tr>" for r in rows]
    return "".join(html) + "</table></body></html>\n"


def merge(dirs: list[str | Path], out: str | Path) -> dict[str, Any]:
    names, vrows, checks = [], [], []
    for d in dirs:
        f = Path(d) / "report.json"
        if not f.is_file():
            raise InvalidInputError(f"{d}: no report.json (run dflash2rt qualify --out {d})")
        try:
            r = json.loads(f.read_text(encoding="utf-8"))
            if not isinstance(r, dict):
                raise TypeError(f"a JSON {type(r).__name__}, not an object")
            name, vrow, c = str(r.get("backend", "?")), _verdict_row(summarize(r)), _checks(r)
            alone = [{"check": k, "values": [v], "differs": False} for k, v in c.items()]
            markdown([name], [vrow], alone)          # its values render, or it is refused here
            render_html([name], [vrow], alone)
            names.append(name)
            vrows.append(vrow)
            checks.append(c)
        except (ValueError, TypeError, KeyError, AttributeError, IndexError) as exc:
            raise InvalidInputError(f"{f} is not a report dflash2rt qualify wrote "
                                    f"({type(exc).__name__}: {exc}); run qualify again") \
                from None
    keys = list(dict.fromkeys(k for c in checks for k in c))
    rows = [{"check": k, "values": [c.get(k) for c in checks],
             "differs": len({json.dumps(c.get(k), default=str) for c in checks}) > 1}
            for k in keys]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    matrix = {"backends": names, "verdicts": vrows, "rows": rows}
    (out / "matrix.json").write_text(json.dumps(matrix, indent=2, default=str,
                                                ensure_ascii=False), encoding="utf-8")
    (out / "matrix.md").write_text(markdown(names, vrows, rows), encoding="utf-8")
    (out / "matrix.html").write_text(render_html(names, vrows, rows), encoding="utf-8")
    return matrix
