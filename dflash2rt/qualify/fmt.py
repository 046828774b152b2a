"""Readable values for the reports: numbers formatted for people, nested dicts as small key/value
tables, lists as lists, unicode as itself (γ, τ, χ², never ``\\u03b3``). HTML and plain text."""

from __future__ import annotations

from html import escape
from typing import Any

LABELS = {"tau": "τ", "gamma": "γ", "chi2": "χ²", "dof": "degrees of freedom",
          "p_value": "p-value", "tv_estimate": "TV estimate", "detectable_tv": "detectable TV",
          "alpha": "α", "target_only_tokens_per_s": "target-only tok/s",
          "ar_tokens_per_s": "target-only tok/s",            # deprecated key (old reports)
          "spec_tokens_per_s": "speculative tok/s",
          "speedup_vs_target_only": "speculative / target-only",
          "speedup_vs_ar": "speculative / target-only",      # deprecated key (old reports)
          "hf_tokens_per_s": "HF tok/s", "speedup_vs_hf": "speculative / HF",
          "greedy_equal": "greedy spec == target-only", "latency_us": "latency µs",
          "achieved_gbps": "achieved GB/s", "peak_gbps": "peak GB/s",
          "fraction_of_peak": "fraction of peak", "block_size": "block size",
          "predicted_speedup": "fitted speedup", "capture_s": "graph capture s",
          "t_target_s": "T target s", "t_draft_s": "T draft s", "t_verify_s": "T verify s",
          "max_abs": "max abs", "max_rel": "max rel", "tokens_equal": "tokens equal",
          "own_argmax": "own argmax",
          "fixed_tokens_per_s": "fixed-block tok/s", "fixed_speedup": "fixed-block ×",
          "fixed_tau": "fixed-block τ", "adaptive_tokens_per_s": "adaptive tok/s",
          "adaptive_speedup": "adaptive ×", "adaptive_tau": "adaptive τ",
          "adaptive_block_sizes": "adaptive blocks (size: steps)",
          "draft_ms": "draft ms", "verify_ms": "verify ms", "host_ms": "host ms",
          "step_ms": "step ms", "greedy_step_s": "greedy step s",
          "sampled_step_s": "sampled step s", "ratio": "sampled / greedy"}


def label(key: str) -> str:
    return LABELS.get(key, key.replace("_", " ") if key.islower() else key)


def num(v: Any) -> str:
    """Integers with thousands separators; floats to 4 significant digits, scientific when
    tiny or huge; exact zero as "0"."""
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        if v == 0:
            return "0"
        if v != v or v in (float("inf"), float("-inf")):
            return str(v)
        if abs(v) >= 1e6 or abs(v) < 1e-3:
            return f"{v:.3g}"
        r = float(f"{v:.4g}")         # 4 significant digits; from 1e4 on with separators
        return f"{r:,.0f}" if abs(r) >= 1e4 else f"{v:.4g}"
    return str(v)


def _scalar(v: Any) -> bool:
    return v is None or isinstance(v, (str, int, float, bool))


def text(v: Any) -> str:
    """One line of plain text (Markdown cells: pipes escaped, once at any depth)."""
    return _line(v).replace("|", "\\|").replace("\n", " ")


def _line(v: Any) -> str:
    """``text`` before its escaping."""
    if v is None:
        return "–"
    if isinstance(v, dict):
        return ", ".join(f"{label(str(k))} {_line(x)}" for k, x in v.items()) or "–"
    if isinstance(v, (list, tuple)):
        return ", ".join(_line(x) for x in v) or "none"
    return num(v)


def html(v: Any) -> str:
    """A value as HTML: dicts → key/value tables, lists of dicts → tables, lists → lists."""
    if v is None:
        return "–"
    if isinstance(v, dict):
        return kv_table(v) if v else "–"
    if isinstance(v, (list, tuple)):
        if not v:
            return "none"
        if all(isinstance(x, dict) for x in v):
            cols = list(dict.fromkeys(k for x in v for k in x))
            return table(list(v), cols)
        if all(_scalar(x) for x in v) and sum(len(num(x)) for x in v) < 80:
            return escape(", ".join(num(x) for x in v))
        return "<ul>" + "".join(f"<li>{html(x)}</li>" for x in v) + "</ul>"
    cls = ' class="num"' if isinstance(v, (int, float)) and not isinstance(v, bool) else ""
    return f"<span{cls}>{escape(num(v))}</span>" if cls else escape(num(v))


def kv_table(d: dict[str, Any], cls: str = "kv") -> str:
    rows = "".join(f"<tr><th>{escape(label(str(k)))}</th><td>{html(v)}</td></tr>"
                   for k, v in d.items())
    return f'<table class="{cls}">{rows}</table>'


def table(rows: list[dict[str, Any]], cols: list[str], cls: str = "",
          row_cls: str | None = None) -> str:
    """Rows × columns; ``row_cls`` names a column whose value becomes the row's class."""
    if not rows:
        return "<p>none recorded</p>"
    head = "".join(f"<th>{escape(label(c))}</th>" for c in cols)
    body = "".join(
        f'<tr{_cls(r.get(row_cls)) if row_cls else ""}>'
        + "".join(f"<td>{html(r.get(c))}</td>" for c in cols) + "</tr>" for r in rows)
    return f'<table class="{cls}"><tr>{head}</tr>{body}</table>'


def _cls(v: Any) -> str:
    return f' class="{escape(str(v).replace(" ", "-"))}"' if v is not None else ""


def badge(result: str | None, text_: str | None = None) -> str:
    """A coloured PASS / FAIL / SKIPPED word (``not recorded`` when absent)."""
    r = result or "not recorded"
    return (f'<span class="badge {escape(r.replace(" ", "-"))}">'
            f"{escape(text_ or r.upper())}</span>")
