"""``dflash2rt report merge``: a backends × checks matrix from several qualification reports,
with rows whose values differ between backends highlighted (HTML and Markdown)."""

from __future__ import annotations

import json
from html import escape
from pathlib import Path
from typing import Any

from ..errors import InvalidInputError


def _checks(r: dict[str, Any]) -> dict[str, Any]:
    sec = r.get("sections", {})
    conf = sec.get("conformance", {})
    out: dict[str, Any] = {"device": r.get("system", {}).get("device"),
                           "complete": r.get("complete"),
                           "conformance": conf.get("status", "not run")}
    out["conformance L2-L4 sizes"] = conf.get("environment", {}).get("dflash2rt.sizes", "n/a")
    for lv, d in conf.get("levels", {}).items():
        out[f"conformance {lv}"] = d.get("result")
    for o in conf.get("ops", []):
        out[f"op {o['op']} {o['dtype']}"] = "pass" if o.get("passed") else "fail"
    b1 = sec.get("end_to_end", {}).get("batch1", {})
    out["tau (batch 1)"] = _round(b1.get("tau"))
    out["speedup vs target-only (batch 1)"] = _round(b1.get("speedup_vs_ar"))
    out["greedy spec == target-only"] = b1.get("greedy_equal")
    g = sec.get("graphs", {})
    out["graph replay == eager"] = g.get("replay_equals_eager", "n/a")
    out["recommended block size"] = sec.get("block_sweep", {}).get("recommended_block_size")
    out["fallbacks"] = len(r.get("fallbacks", []))
    return out


def _round(x: Any) -> Any:
    return round(x, 2) if isinstance(x, float) else x


def merge(dirs: list[str | Path], out: str | Path) -> dict[str, Any]:
    reports = []
    for d in dirs:
        f = Path(d) / "report.json"
        if not f.is_file():
            raise InvalidInputError(f"{d}: no report.json (run dflash2rt qualify --out {d})")
        reports.append(json.loads(f.read_text()))
    names = [r["backend"] for r in reports]
    checks = [_checks(r) for r in reports]
    keys = list(dict.fromkeys(k for c in checks for k in c))
    rows = [{"check": k, "values": [c.get(k) for c in checks],
             "differs": len({json.dumps(c.get(k)) for c in checks}) > 1} for k in keys]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    matrix = {"backends": names, "rows": rows}
    (out / "matrix.json").write_text(json.dumps(matrix, indent=2, default=str))
    md = ["| check | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    md += [f"| {'**' if r['differs'] else ''}{r['check']}{'**' if r['differs'] else ''} | "
           + " | ".join(str(v) for v in r["values"]) + " |" for r in rows]
    (out / "matrix.md").write_text("# dflash2rt cross-backend matrix\n\nRows in bold differ "
                                   "between backends.\n\n" + "\n".join(md) + "\n")
    cell = lambda v: f'<td class="{v if v in ("pass", "fail") else ""}">{escape(str(v))}</td>'  # noqa: E731
    html = ["<!doctype html><html><head><meta charset='utf-8'><title>dflash2rt matrix</title>"
            "<style>td,th{border:1px solid #ccc;padding:3px 8px}.diff{background:#ffd}"
            ".pass{color:#070}.fail{color:#a00;font-weight:bold}table{border-collapse:collapse}"
            "</style></head><body><h1>dflash2rt cross-backend matrix</h1><p>Highlighted rows "
            "differ between backends.</p><table><tr><th>check</th>"
            + "".join(f"<th>{escape(n)}</th>" for n in names) + "</tr>"]
    html += [f"<tr class=\"{'diff' if r['differs'] else ''}\"><td>{escape(r['check'])}</td>"
             + "".join(cell(v) for v in r["values"]) + "</tr>" for r in rows]
    (out / "matrix.html").write_text("".join(html) + "</table></body></html>\n")
    return matrix
