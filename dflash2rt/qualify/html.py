"""report.html: self-contained (inline CSS and SVG), tables and plots of a qualification."""

from __future__ import annotations

import json
from html import escape
from typing import Any

from . import svg

CSS = ("body{font-family:sans-serif;max-width:1100px;margin:auto}table{border-collapse:collapse;"
       "margin:8px 0}td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px}"
       ".pass{background:#dfd}.fail{background:#fdd}.skipped,.none{background:#eee}")


def _table(rows: list[dict[str, Any]], cols: list[str]) -> str:
    head = "".join(f"<th>{escape(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{_fmt(r.get(c))}</td>" for c in cols) + "</tr>"
                   for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, (dict, list)):
        return escape(json.dumps(v, default=str))[:300]
    return escape(str(v)) if v is not None else "–"


def render(r: dict[str, Any]) -> str:
    sec = r.get("sections", {})
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>dflash2rt qualification "
             f"{escape(r['backend'])}</title><style>{CSS}</style></head><body>",
             f"<h1>dflash2rt qualification: {escape(r['backend'])}</h1>",
             f"<p>{'complete' if r.get('complete') else 'INCOMPLETE (interrupted or running)'}"
             f"; quick={r.get('quick')}; model {escape(str(r.get('model')))}; "
             f"{r.get('elapsed_s', 0):.0f} s</p>", "<h2>System</h2>"]
    sysd = {k: v for k, v in r.get("system", {}).items() if k != "all_backends"}
    parts.append(_table([{"key": k, "value": v} for k, v in sysd.items()], ["key", "value"]))
    conf = sec.get("conformance", {})
    parts.append(f"<h2>Conformance: {escape(str(conf.get('status', 'not run')))}</h2>")
    env = conf.get("environment", {})
    parts.append(f"<p>selection: {escape(str(conf.get('selection', 'n/a')))}; L2-L4 sizes: "
                 f"{escape(str(env.get('dflash2rt.sizes', 'n/a')))}</p>")
    levels = conf.get("levels", {})
    parts.append(_table([{"level": k, **{c: v.get(c) for c in ("title", "result", "passed",
                                                               "failed", "skipped", "metrics")}}
                         for k, v in levels.items()],
                        ["level", "title", "result", "passed", "failed", "skipped", "metrics"]))
    ops = [o for o in conf.get("ops", []) if o.get("kind") == "float"]
    parts.append(svg.bar_chart("op error vs tolerance (max abs, log10)",
                               [(f"{o['op']} {o['dtype']}", {"max abs error": o["max_abs"],
                                                             "atol": o.get("atol")})
                                for o in ops], log=True))
    mb = sec.get("op_microbench", {}).get("rows", [])
    parts += ["<h2>Op micro-benchmarks</h2>", _table(mb, ["op", "batch", "latency_us",
                                                          "achieved_gbps", "peak_gbps",
                                                          "fraction_of_peak"])]
    g = sec.get("graphs", {})
    parts += ["<h2>Graphs vs eager</h2>", _table([g], sorted(k for k in g if k != "status"))]
    e2e = sec.get("end_to_end", {})
    parts.append("<h2>End to end: target-only vs speculative</h2>")
    rows = [{"batch": k, **{c: v.get(c) for c in ("ar_tokens_per_s", "spec_tokens_per_s",
                                                   "speedup_vs_ar", "tau", "greedy_equal")}}
            for k, v in e2e.items() if isinstance(v, dict)]
    parts.append(_table(rows, ["batch", "ar_tokens_per_s", "spec_tokens_per_s", "speedup_vs_ar",
                               "tau", "greedy_equal"]))
    split = e2e.get("batch1", {}).get("time_split_per_step_s", {})
    parts.append(svg.bar_chart("latency breakdown per step, batch 1 (ms)",
                               [(k, {"ms": v * 1e3}) for k, v in split.items()]))
    sw = sec.get("block_sweep", {})
    parts.append(f"<h2>Block-size sweep (recommended: {sw.get('recommended_block_size')})</h2>")
    parts.append(svg.line_chart("tau and speedup vs block size", {
        "tau": [(x["block_size"], x["tau"]) for x in sw.get("rows", [])],
        "speedup": [(x["block_size"], x["speedup_vs_ar"]) for x in sw.get("rows", [])],
        "fitted speedup": [(x["block_size"], x["predicted_speedup"]) for x in sw.get("rows", [])],
    }, "block size"))
    parts.append(_table(sw.get("rows", []), ["block_size", "tau", "speedup_vs_ar",
                                             "predicted_speedup", "t_target_s", "t_draft_s",
                                             "t_verify_s"]))
    parts += ["<h2>Fallbacks and known deviations</h2><ul>"]
    parts += [f"<li>fallback: {escape(f)}</li>" for f in r.get("fallbacks", [])] or \
        ["<li>no fallback</li>"]
    parts += [f"<li>{escape(d)}</li>" for d in r.get("known_deviations", [])]
    parts += [f"<li>section {escape(k)}: {escape(str(v.get('status')))} "
              f"{escape(str(v.get('error', '')))}</li>" for k, v in sec.items()
              if v.get("status") != "done"]
    parts.append("</ul></body></html>")
    return "\n".join(parts)
