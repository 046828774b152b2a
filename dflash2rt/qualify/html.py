"""report.html: self-contained (inline CSS and SVG). It opens with one screen (≈1280×800) that
carries the verdict and its evidence (summary.py); the detailed sections follow (details.py)."""

from __future__ import annotations

from html import escape
from typing import Any

from . import details
from .fmt import badge, num
from .summary import NOT_RECORDED, Summary, executed_text, ops_text, summarize

CSS = (
    "body{font-family:'DejaVu Sans',Arial,sans-serif;max-width:1240px;margin:0 auto;"
    "padding:6px 16px;font-size:14px;color:#222}h1{font-size:20px;margin:4px 0}"
    "h2{font-size:17px;margin:18px 0 6px;border-bottom:1px solid #ccc}h3{font-size:15px;"
    "margin:12px 0 4px}table{border-collapse:collapse;margin:4px 0}td,th{border:1px solid #ddd;"
    "padding:2px 7px;font-size:13px;text-align:left;vertical-align:top}th{background:#f6f6f6}"
    "table.kv{margin:0}table.kv th,table.kv td{font-size:12px;padding:1px 5px}table.kv th"
    "{font-weight:normal;color:#555}.num{font-variant-numeric:tabular-nums}"
    ".first{display:grid;grid-template-columns:330px 1fr;gap:10px;margin-top:6px}"
    ".card{border:1px solid #ccc;border-radius:6px;padding:6px 12px;margin-bottom:8px}"
    ".card h2{margin:0 0 4px;"
    "border:0;font-size:15px;color:#444}.big{font-size:60px;font-weight:800;text-align:center;"
    "border-radius:6px;color:#fff;letter-spacing:2px;line-height:1.3}.big.pass{background:#1a7f37}"
    ".big.fail{background:#cf222e}.big.not-recorded{background:#777;font-size:24px;"
    "line-height:2.4;letter-spacing:0}.badge{padding:0 6px;border-radius:3px;font-weight:bold;"
    "font-size:12px;background:#eee;color:#555}.badge.pass{background:#dafbe1;color:#116329}"
    ".badge.fail{background:#ffebe9;color:#a40e26}tr.fail td{background:#fff5f5}"
    "ul.reasons{margin:6px 0;padding-left:18px;color:#a40e26;font-size:13px}"
    "dl.facts{display:grid;grid-template-columns:auto 1fr;gap:2px 8px;margin:6px 0;"
    "font-size:13px}dl.facts dt{color:#555}dl.facts dd{margin:0;overflow-wrap:anywhere}"
    ".why{color:#a40e26;font-size:12px}.note{color:#666;font-size:12px}.warn{background:#fff3cd;"
    "padding:4px 8px;border-radius:4px}.speedrow td.ratio{font-weight:bold}"
    "nav{font-size:12px;color:#555;margin:6px 0}nav a{margin-right:8px}"
    "pre{white-space:pre-wrap;font-size:12px;background:#f6f6f6;padding:4px}")

REASONS_SHOWN = 5        # reasons on the first screen; all of them are in the details


def _clip(s: str, n: int) -> str:
    return escape(s if len(s) <= n else s[:n - 1] + "…")


def _verdict_card(s: Summary) -> str:
    if s.verdict in ("pass", "fail"):
        big = f'<div id="verdict" class="big {s.verdict}">{s.verdict.upper()}</div>'
    else:
        big = f'<div id="verdict" class="big not-recorded">verdict {NOT_RECORDED}</div>'
    out = [big]
    if s.reasons:
        shown = [f'<li title="{escape(r)}">{_clip(r, 150)}</li>' for r in s.reasons[:REASONS_SHOWN]]
        more = len(s.reasons) - REASONS_SHOWN
        if more > 0:
            shown.append(f'<li><a href="#verdict-reasons">{more} more reason(s) below</a></li>')
        out.append(f'<ul id="reasons" class="reasons">{"".join(shown)}</ul>')
    elif s.verdict == "fail":
        out.append(f'<p class="why">reasons {NOT_RECORDED}</p>')
    facts = [("conformance", badge(s.conformance)),
             ("device", f'<span id="device">{escape(s.device or NOT_RECORDED)}</span>'),
             ("commit", f'<span id="commit">{escape(s.commit or NOT_RECORDED)}</span>'),
             ("model", escape(str(s.model or NOT_RECORDED))),
             ("mode", "quick" if s.quick else "full" if s.quick is not None else NOT_RECORDED)]
    out.append('<dl class="facts">' + "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in facts)
               + "</dl>")
    return f'<div class="card" id="verdict-card">{"".join(out)}</div>'


def _levels_card(s: Summary) -> str:
    rows = []
    for lv in s.levels:
        cls = "why" if lv.result == "fail" else "note"
        why = f'<span class="{cls}" title="{escape(lv.why)}">{_clip(lv.why, 90)}</span>' \
            if lv.why else ""
        rows.append(f'<tr class="{escape(lv.result.replace(" ", "-"))}" '
                    f'data-level="{escape(lv.name)}">'
                    f"<td><b>{escape(lv.name)}</b></td><td>{escape(lv.title)}</td>"
                    f"<td>{badge(lv.result)}</td><td class=num>{executed_text(lv)}</td>"
                    f"<td class=num>{lv.passed} / {lv.failed} / {lv.skipped}</td><td>{why}</td>"
                    "</tr>")
    return ('<div class="card" id="levels"><h2>Conformance levels</h2><table><tr><th>level</th>'
            "<th>what it checks</th><th>result</th><th>executed / minimum</th>"
            "<th>passed / failed / skipped</th><th>why</th></tr>" + "".join(rows)
            + "</table></div>")


def _implementation_card(s: Summary) -> str:
    fb = NOT_RECORDED if s.fallbacks is None else ("; ".join(s.fallbacks) or "none")
    given = "given" if s.allow_fallback else "not given"
    allow = "" if s.allow_fallback is None else \
        f" <span class=note>(--allow-fallback {given})</span>"
    facts = [("kernels", escape(s.kernels or NOT_RECORDED)),
             ("per op", f'<span id="ops">{escape(ops_text(s))}</span>'),
             ("graphs", escape(s.graphs or NOT_RECORDED)),
             ("fallbacks", f'<span id="fallbacks" class="{"why" if s.fallbacks else ""}">'
                           f"{_clip(fb, 300)}</span>{allow}")]
    return ('<div class="card" id="implementation"><h2>Implementation that ran</h2>'
            '<dl class="facts">' + "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in facts)
            + "</dl></div>")


def _speed_card(s: Summary) -> str:
    rows = "".join(
        f'<tr class="speedrow" data-batch="{sp.batch}"><td>{sp.batch}</td>'
        f"<td class=num>{num(sp.target_only) if sp.target_only is not None else '–'}</td>"
        f"<td class=num>{num(sp.speculative) if sp.speculative is not None else '–'}</td>"
        f"<td class='num ratio'>{'×' + num(sp.ratio) if sp.ratio is not None else '–'}</td>"
        f"<td class=num>{num(sp.tau) if sp.tau is not None else '–'}</td>"
        f"<td>{'–' if sp.greedy_equal is None else 'yes' if sp.greedy_equal else 'NO'}</td></tr>"
        for sp in s.speed)
    table = ("<table><tr><th>batch</th><th>target-only tok/s</th><th>speculative tok/s</th>"
             "<th>ratio</th><th>τ</th><th>greedy equal</th></tr>" + rows + "</table>") \
        if rows else f"<p>end-to-end speed {NOT_RECORDED}</p>"
    bs = NOT_RECORDED if s.block_size is None else str(s.block_size)
    return ('<div class="card" id="speed"><h2>Speed: target-only vs speculative</h2>' + table
            + f'<p>recommended block size: <b id="block-size">{escape(bs)}</b> '
            '<span class=note>(best measured speedup in the block-size sweep; '
            'τ = tokens committed per verify step)</span></p></div>')


def first_screen(s: Summary) -> str:
    return ('<section id="first-screen" class="first">'
            f'<div>{_verdict_card(s)}</div>'
            f'<div>{_levels_card(s)}{_implementation_card(s)}{_speed_card(s)}</div></section>')


def render(r: dict[str, Any]) -> str:
    s = summarize(r)
    backend = escape(str(r.get("backend", "?")))
    state = "complete" if r.get("complete") else "INCOMPLETE (interrupted or running)"
    head = (f"<!doctype html><html><head><meta charset='utf-8'><meta name='viewport' "
            f"content='width=device-width'><title>dflash2rt qualification {backend}: "
            f"{(s.verdict or 'no verdict').upper()}</title><style>{CSS}</style></head><body>"
            f"<h1>dflash2rt qualification: backend {backend}</h1>")
    warn = "" if r.get("complete") else f'<p class="warn">{state}</p>'
    nav = ("<nav>details: " + " ".join(f'<a href="#{a}">{t}</a>' for a, t in details.SECTIONS)
           + f" · {num(r.get('elapsed_s', 0.0))} s, {state}</nav>")
    return "\n".join([head, warn, first_screen(s), nav, details.render(r, s), "</body></html>"])
