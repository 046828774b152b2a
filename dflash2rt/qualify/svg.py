"""Tiny inline-SVG charts (no plotting dependency): line chart and horizontal bar chart."""

from __future__ import annotations

import math
from html import escape

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd")
W, H, PAD = 520, 260, 48


def line_chart(title: str, series: dict[str, list[tuple[float, float]]], xlabel: str) -> str:
    pts = [p for s in series.values() for p in s]
    if not pts:
        return f"<p>{escape(title)}: no data</p>"
    x0, x1 = min(p[0] for p in pts), max(p[0] for p in pts)
    y1 = max(p[1] for p in pts) * 1.1 or 1.0
    sx = lambda x: PAD + (x - x0) / ((x1 - x0) or 1) * (W - 2 * PAD)  # noqa: E731
    sy = lambda y: H - PAD - y / y1 * (H - 2 * PAD)  # noqa: E731
    out = [_frame(title, xlabel)]
    for i, (name, s) in enumerate(series.items()):
        c = COLORS[i % len(COLORS)]
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in s)
        out.append(f'<polyline fill="none" stroke="{c}" stroke-width="2" points="{path}"/>')
        out += [f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{c}"><title>'
                f'{escape(name)} {x:g}: {y:.3g}</title></circle>' for x, y in s]
        out.append(f'<text x="{W - PAD - 110}" y="{PAD + 14 * i}" fill="{c}" font-size="12">'
                   f'{escape(name)}</text>')
    xs = sorted({p[0] for p in pts})
    out += [f'<text x="{sx(x):.1f}" y="{H - PAD + 16}" font-size="11" text-anchor="middle">'
            f'{x:g}</text>' for x in xs]
    out += [f'<text x="{PAD - 6}" y="{sy(y):.1f}" font-size="11" text-anchor="end">{y:.2g}</text>'
            for y in (0, y1 / 2, y1)]
    return "".join(out) + "</svg>"


def bar_chart(title: str, rows: list[tuple[str, dict[str, float]]], log: bool = False) -> str:
    """rows: (label, {series: value}); bars side by side per label, log10 scale if asked."""
    if not rows:
        return f"<p>{escape(title)}: no data</p>"
    names = list(dict.fromkeys(n for _, vals in rows for n in vals))
    values = [v for _, vals in rows for v in vals.values() if v is not None and v > 0]
    if not values:
        return f"<p>{escape(title)}: no positive values</p>"
    f = (lambda v: math.log10(v)) if log else (lambda v: v)
    lo = min(f(v) for v in values) - (1 if log else 0)
    hi = max(f(v) for v in values)
    lo = min(lo, 0.0) if not log else lo
    height = PAD + len(rows) * 14 * (len(names) + 1) + 20
    out = [_frame(title, "log10" if log else "", height)]
    y = PAD
    for label, vals in rows:
        out.append(f'<text x="4" y="{y + 10}" font-size="11">{escape(label)}</text>')
        for i, n in enumerate(names):
            v = vals.get(n)
            if v is not None and v > 0:
                w = (f(v) - lo) / ((hi - lo) or 1) * (W - 220)
                out.append(f'<rect x="180" y="{y}" width="{max(w, 1):.1f}" height="11" '
                           f'fill="{COLORS[i % len(COLORS)]}"><title>{escape(n)}: {v:.3g}'
                           f'</title></rect>')
            y += 14
        y += 14
    out += [f'<text x="{W - 120}" y="{16 + 14 * i}" fill="{COLORS[i % len(COLORS)]}" '
            f'font-size="12">{escape(n)}</text>' for i, n in enumerate(names)]
    return "".join(out) + "</svg>"


def _frame(title: str, xlabel: str, height: int = H) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{height}" '
            f'role="img" aria-label="{escape(title)}"><text x="{W / 2}" y="18" font-size="14" '
            f'text-anchor="middle">{escape(title)}</text><text x="{W / 2}" y="{height - 8}" '
            f'font-size="11" text-anchor="middle">{escape(xlabel)}</text>')
