"""Tiny inline-SVG charts (no plotting dependency): line chart and horizontal bar chart, every
axis with a title and tick values (decades such as 1e-8, 1e-6 on a log axis)."""

from __future__ import annotations

import math
from html import escape

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd")
W, H, PAD = 560, 280, 56
LABEL_W = 190                       # bar charts: room for the category labels left of the bars


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """Round tick values (1, 2, 5 × 10^k steps) covering [lo, hi], about ``n`` of them."""
    if hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / max(n - 1, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.floor(lo / step + 1e-9) * step
    out, t = [round(first, 12)], first
    while t < hi - step * 1e-9:             # the last tick covers hi
        t += step
        out.append(round(t, 12))
    return out


def decade_ticks(lo: float, hi: float, n: int = 8) -> list[int]:
    """Integer log10 exponents covering [lo, hi], every k-th decade so at most about ``n``."""
    a, b = math.floor(lo), math.ceil(hi)
    k = max(1, math.ceil((b - a) / n))
    ticks = list(range(a - (a % k), b + 1, k))
    while ticks[-1] < b:
        ticks.append(ticks[-1] + k)
    return ticks


def tick_label(v: float) -> str:
    if v == 0:
        return "0"
    return f"{v:.0e}".replace("e+0", "e").replace("e-0", "e-") if abs(v) >= 1e4 or \
        abs(v) < 1e-2 else f"{v:g}"


def line_chart(title: str, series: dict[str, list[tuple[float, float]]], xlabel: str,
               ylabel: str = "value") -> str:
    pts = [p for s in series.values() for p in s if p[1] is not None]
    if not pts:
        return f"<p>{escape(title)}: no data</p>"
    xs = sorted({p[0] for p in pts})
    x0, x1 = xs[0], xs[-1]
    yt = nice_ticks(min(0.0, min(p[1] for p in pts)), max(p[1] for p in pts) * 1.05 or 1.0)
    y0, y1 = yt[0], yt[-1]
    sx = lambda x: PAD + (x - x0) / ((x1 - x0) or 1) * (W - 2 * PAD)  # noqa: E731
    sy = lambda y: H - PAD - (y - y0) / ((y1 - y0) or 1) * (H - 2 * PAD)  # noqa: E731
    out = [_frame(title, xlabel, ylabel, H)]
    out += _grid_y([(sy(y), tick_label(y)) for y in yt], PAD, W - PAD)
    out += _ticks_x([(sx(x), f"{x:g}") for x in xs], H - PAD)
    for i, (name, s) in enumerate(series.items()):
        c = COLORS[i % len(COLORS)]
        s = [(x, y) for x, y in s if y is not None]
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in s)
        out.append(f'<polyline fill="none" stroke="{c}" stroke-width="2" points="{path}"/>')
        out += [f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{c}"><title>'
                f'{escape(name)} {x:g}: {y:.3g}</title></circle>' for x, y in s]
    out += _legend(list(series), PAD, 38)
    return "".join(out) + "</svg>"


def bar_chart(title: str, rows: list[tuple[str, dict[str, float | None]]], log: bool = False,
              xlabel: str = "", ylabel: str = "") -> str:
    """rows: (label, {series: value}); bars side by side per label on a value axis (log10 if
    asked: ticks at decades). A zero on a log axis is written as "0" where its bar would be."""
    if not rows:
        return f"<p>{escape(title)}: no data</p>"
    names = list(dict.fromkeys(n for _, vals in rows for n in vals))
    values = [v for _, vals in rows for v in vals.values() if v is not None and v > 0]
    if not values:
        return f"<p>{escape(title)}: no positive values</p>"
    f = (lambda v: math.log10(v)) if log else (lambda v: v)
    if log:
        ticks = decade_ticks(min(f(v) for v in values) - 0.5, max(f(v) for v in values))
        lo, hi, tick_pos = ticks[0], ticks[-1], [(t, f"1e{t}" if t else "1") for t in ticks]
    else:
        ticks_v = nice_ticks(0.0, max(values))
        lo, hi, tick_pos = ticks_v[0], ticks_v[-1], [(t, tick_label(t)) for t in ticks_v]
    x_of = lambda v: LABEL_W + (v - lo) / ((hi - lo) or 1) * (W - LABEL_W - 24)  # noqa: E731
    top = 52
    height = top + len(rows) * 13 * (len(names) + 1) + 44
    out = [_frame(title, xlabel, ylabel, height)]
    out += _legend(names, LABEL_W, 38)
    axis_y = height - 40
    out += _grid_x([(x_of(t), lab) for t, lab in tick_pos], top - 4, axis_y)
    y = top
    for label, vals in rows:
        out.append(f'<text x="{LABEL_W - 6}" y="{y + 10 + 6 * (len(names) - 1)}" '
                   f'font-size="11" text-anchor="end">{escape(label)}</text>')
        for i, n in enumerate(names):
            v = vals.get(n)
            if v is not None and v > 0:
                w = x_of(f(v)) - LABEL_W
                out.append(f'<rect x="{LABEL_W}" y="{y}" width="{max(w, 1):.1f}" height="10" '
                           f'fill="{COLORS[i % len(COLORS)]}"><title>{escape(n)}: {v:.3g}'
                           f'</title></rect>')
            elif v == 0:
                out.append(f'<text x="{LABEL_W + 3}" y="{y + 9}" font-size="10" fill="'
                           f'{COLORS[i % len(COLORS)]}">0 (exact)</text>')
            y += 13
        y += 13
    return "".join(out) + "</svg>"


def _legend(names: list[str], x: float, y: float) -> list[str]:
    """One row of coloured squares and names under the title."""
    out = []
    for i, n in enumerate(names):
        out.append(f'<text x="{x:.0f}" y="{y}" fill="{COLORS[i % len(COLORS)]}" font-size="12">'
                   f'&#9632; {escape(n)}</text>')
        x += 7.5 * len(n) + 30
    return out


def _grid_y(ticks: list[tuple[float, str]], x0: float, x1: float) -> list[str]:
    return [f'<line x1="{x0}" x2="{x1}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ddd"/>'
            f'<text x="{x0 - 6}" y="{y + 4:.1f}" font-size="11" text-anchor="end" '
            f'class="tick">{escape(lab)}</text>' for y, lab in ticks] + \
        [f'<line x1="{x0}" x2="{x0}" y1="{PAD}" y2="{H - PAD}" stroke="#888"/>']


def _ticks_x(ticks: list[tuple[float, str]], y: float) -> list[str]:
    return [f'<line x1="{PAD}" x2="{W - PAD}" y1="{y}" y2="{y}" stroke="#888"/>'] + \
        [f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{y}" y2="{y + 4}" stroke="#888"/><text '
         f'x="{x:.1f}" y="{y + 16}" font-size="11" text-anchor="middle" class="tick">'
         f'{escape(lab)}</text>' for x, lab in ticks]


def _grid_x(ticks: list[tuple[float, str]], y0: float, y1: float) -> list[str]:
    return [f'<line x1="{LABEL_W}" x2="{W - 24}" y1="{y1}" y2="{y1}" stroke="#888"/>'] + \
        [f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{y0}" y2="{y1 + 4}" stroke="#ddd"/><text '
         f'x="{x:.1f}" y="{y1 + 16}" font-size="11" text-anchor="middle" class="tick">'
         f'{escape(lab)}</text>' for x, lab in ticks]


def _frame(title: str, xlabel: str, ylabel: str, height: int) -> str:
    """The svg element, the title and both axis titles (y rotated along the left edge)."""
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{height}" '
            f'viewBox="0 0 {W} {height}" role="img" aria-label="{escape(title)}">'
            f'<text x="{W / 2}" y="18" font-size="14" font-weight="bold" text-anchor="middle">'
            f'{escape(title)}</text><text x="{W / 2}" y="{height - 6}" font-size="12" '
            f'text-anchor="middle" class="axis-title">{escape(xlabel)}</text>'
            f'<text x="14" y="{height / 2}" font-size="12" text-anchor="middle" '
            f'class="axis-title" transform="rotate(-90 14 {height / 2})">{escape(ylabel)}</text>')
