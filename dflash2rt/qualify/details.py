"""The detailed sections of report.html, below its first screen: every reason and error, the
conformance levels with readable metrics, op errors, speed, the sweep, the system table."""

from __future__ import annotations

from html import escape
from typing import Any

from . import svg
from .fmt import badge, kv_table, num, table
from .summary import NOT_RECORDED, Summary, executed_text

SECTIONS = [("verdict-reasons", "verdict"), ("conformance", "conformance"),
            ("implementation-detail", "implementation"), ("op-errors", "op errors"),
            ("end-to-end", "end to end"), ("block-sweep", "block sweep"),
            ("microbench", "micro-benchmarks"), ("graphs", "graphs"), ("system", "system"),
            ("deviations", "fallbacks and deviations")]


def _h2(anchor: str, title: str) -> str:
    return f'<h2 id="{anchor}">{escape(title)}</h2>'


def _verdict(s: Summary) -> list[str]:
    out = [_h2("verdict-reasons", "Verdict and reasons"),
           f"<p>verdict: {badge(s.verdict)}; conformance: {badge(s.conformance)}</p>"]
    if s.reasons:
        out.append("<ol>" + "".join(f"<li>{escape(r)}</li>" for r in s.reasons) + "</ol>")
    else:
        out.append("<p>no reason to fail recorded</p>" if s.verdict == "pass" else
                   f"<p>reasons {NOT_RECORDED}</p>")
    if s.errors:
        out.append("<h3>Errors outside tests (collection, setup, teardown)</h3>")
        out += [f"<p><b>{escape(str(e.get('phase')))}</b> in <code>{escape(str(e.get('where')))}"
                f"</code></p><pre>{escape(str(e.get('message', ''))[-3000:])}</pre>"
                for e in s.errors]
    return out


def _conformance(conf: dict[str, Any], s: Summary) -> list[str]:
    env = conf.get("environment", {})
    result = conf.get("result") or conf.get("status", "not run")
    out = [_h2("conformance", f"Conformance: {result}"),
           f"<p>selection: {escape(str(conf.get('selection', 'n/a')))}; L2-L4 sizes: "
           f"{escape(str(env.get('dflash2rt.sizes', 'n/a')))}; L4 model: "
           f"{escape(str(env.get('dflash2rt.l4_model', NOT_RECORDED)))}; pytest: "
           f"{escape(str(conf.get('summary_line', '–')))}</p>"]
    if conf.get("reason"):
        out.append(f"<pre>{escape(str(conf['reason']))}</pre>")
    levels = conf.get("levels", {})
    for lv in s.levels:
        d = levels.get(lv.name, {})
        out.append(f"<h3>{escape(lv.name)} — {escape(lv.title)}: {badge(lv.result)} "
                   f"<span class=note>executed / minimum {executed_text(lv)}; passed "
                   f"{lv.passed}, failed {lv.failed}, skipped {lv.skipped}</span></h3>")
        if lv.why:
            out.append(f'<p class="why">{escape(lv.why)}</p>')
        metrics = d.get("metrics") or {}
        out.append(kv_table(metrics, "kv metrics") if metrics else
                   '<p class="note">no metrics</p>')
        failed = [t for t in d.get("tests", []) if t.get("outcome") in ("failed", "error")]
        out += [f"<p class=why>{escape(t['test'])}</p><pre>{escape(t.get('message', ''))}</pre>"
                for t in failed[:20]]
    ex = conf.get("exemptions") or []
    out.append(f"<h3>Near-tie exemptions: {len(ex)}</h3>" + (table(ex, list(dict.fromkeys(
        k for e in ex for k in e))) if ex else ""))
    return out


def _implementation(conf: dict[str, Any], s: Summary) -> list[str]:
    impl = conf.get("implementation")
    out = [_h2("implementation-detail", "Implementation that ran")]
    if not impl:
        return out + [f"<p>per-op implementation {NOT_RECORDED}; kernels (from the system "
                      f"probe): {escape(s.kernels or NOT_RECORDED)}</p>"]
    out.append(table([{"op": k, "implementation": v} for k, v in (impl.get("ops") or {}).items()],
                     ["op", "implementation"]))
    out.append(kv_table({k: v for k, v in impl.items() if k != "ops"}))
    return out


def _ops(conf: dict[str, Any]) -> list[str]:
    ops = conf.get("ops", [])
    flt = [o for o in ops if o.get("kind") == "float"]
    out = [_h2("op-errors", "Op errors vs the float64 reference"),
           svg.bar_chart("op error vs tolerance (max abs)",
                         [(f"{o['op']} {o['dtype']}", {"max abs error": o.get("max_abs"),
                                                       "atol": o.get("atol")}) for o in flt],
                         log=True, xlabel="absolute error (log10 scale)", ylabel="op, dtype")]
    rows = [{**o, "passed": "pass" if o.get("passed") else "fail"} for o in ops]
    out.append(table(rows, ["op", "dtype", "kind", "max_abs", "max_rel", "atol", "rtol",
                            "checks", "mismatches", "passed"], row_cls="passed"))
    return out


def _renamed(d: dict[str, Any]) -> dict[str, Any]:
    """``d`` with the target_only keys filled from the deprecated ar_* keys of older reports."""
    return {**d, "target_only_tokens_per_s": d.get("target_only_tokens_per_s",
                                                   d.get("ar_tokens_per_s")),
            "speedup_vs_target_only": d.get("speedup_vs_target_only", d.get("speedup_vs_ar"))}


def _speed(sec: dict[str, Any]) -> list[str]:
    e2e = sec.get("end_to_end", {})
    out = [_h2("end-to-end", "End to end: target-only vs speculative")]
    cols = ["prompts", "tokens", "target_only_tokens_per_s", "spec_tokens_per_s",
            "speedup_vs_target_only", "tau", "greedy_equal", "mismatched_prompts"]
    rows = [{"batch": k, **{c: _renamed(v).get(c) for c in cols}}
            for k, v in e2e.items() if k.startswith("batch") and isinstance(v, dict)]
    out.append(table(rows, ["batch", *cols]))
    out += _temperature_rows(e2e.get("rows") or [])
    prof = e2e.get("step_profile") or {}
    synced = next((r for r in prof.get("rows", []) if r.get("batch") == 1
                   and r.get("contender") == "fixed" and r.get("temperature") == "T=0"), None)
    if synced:                          # the separate, synced profiling pass
        split = {k: synced.get(k) or 0.0 for k in ("draft", "verify", "host")}
        title = "latency breakdown per step, batch 1, T=0 (synced profiling pass)"
    else:                               # older reports: the engine's in-run clocks
        split = e2e.get("batch1", {}).get("time_split_per_step_s", {})
        title = "latency breakdown per step, batch 1"
    out.append(svg.bar_chart(title, [(k, {"ms": v * 1e3}) for k, v in split.items()],
                             xlabel="milliseconds per speculative step", ylabel="phase"))
    out += _step_profile(prof)
    sw = sec.get("block_sweep", {})
    rows = [_renamed(x) for x in sw.get("rows", [])]
    out.append(_h2("block-sweep", "Block-size sweep (recommended: "
                   f"{sw.get('recommended_block_size', NOT_RECORDED)})"))
    out.append(svg.line_chart("tau and speedup vs block size", {
        "τ (tokens per verify)": [(x["block_size"], x.get("tau")) for x in rows],
        "speedup ×": [(x["block_size"], x.get("speedup_vs_target_only")) for x in rows],
        "fitted speedup ×": [(x["block_size"], x.get("predicted_speedup")) for x in rows],
    }, "block size (draft tokens + 1)", "τ / speedup vs target-only"))
    out.append(table(rows, ["block_size", "tau", "speedup_vs_target_only", "predicted_speedup",
                            "t_target_s", "t_draft_s", "t_verify_s"]))
    if sw.get("fit"):
        out.append(f"<p class=note>fit: {escape(sw['fit'])}</p>")
    return out


def _temperature_rows(rows: list[dict[str, Any]]) -> list[str]:
    """Every contender side by side, one line per temperature × batch."""
    if not rows:
        return []
    flat = []
    for r in rows:
        c = r.get("contenders", {})
        t, f, a = c.get("target_only", {}), c.get("fixed", {}), c.get("adaptive", {})
        flat.append({"temperature": r.get("temperature"), "batch": r.get("batch"),
                     "target_only_tokens_per_s": t.get("tokens_per_s"),
                     "fixed_tokens_per_s": f.get("tokens_per_s"),
                     "fixed_speedup": f.get("speedup_vs_target_only"), "fixed_tau": f.get("tau"),
                     "adaptive_tokens_per_s": a.get("tokens_per_s"),
                     "adaptive_speedup": a.get("speedup_vs_target_only"),
                     "adaptive_tau": a.get("tau"), "adaptive_block_sizes": a.get("block_sizes"),
                     "greedy_equal": r.get("greedy_equal")})
    block = rows[0].get("contenders", {}).get("fixed", {}).get("block_size")
    return [f"<h3>By temperature: target-only, block {escape(str(block))}, adaptive</h3>",
            table(flat, list(flat[0]))]


def _step_profile(prof: dict[str, Any]) -> list[str]:
    """The synced per-step cost split and the sampled / greedy step-cost ratio."""
    rows = prof.get("rows") or []
    if not rows:
        return []
    ms = [{"temperature": r.get("temperature"), "batch": r.get("batch"),
           "contender": r.get("contender"), **{f"{k}_ms": (r.get(k) or 0.0) * 1e3
                                               for k in ("draft", "verify", "host", "step")},
           "steps": r.get("steps")} for r in rows]
    out = ["<h3>Per-step cost split (separate profiling pass, device synced between phases)"
           "</h3>", table(ms, list(ms[0]))]
    ratios = prof.get("sampled_over_greedy") or []
    if ratios:
        out.append(f"<p>sampled / greedy speculative step cost at the same block size (goal "
                   f"≤ {num(prof.get('goal_sampled_over_greedy'))}):</p>")
        out.append(table(ratios, ["temperature", "batch", "block_size", "greedy_step_s",
                                  "sampled_step_s", "ratio"]))
    if prof.get("method"):
        out.append(f"<p class=note>{escape(prof['method'])}</p>")
    return out


def _other(r: dict[str, Any], sec: dict[str, Any]) -> list[str]:
    mb = sec.get("op_microbench", {}).get("rows", [])
    out = [_h2("microbench", "Op micro-benchmarks"),
           table(mb, ["op", "batch", "latency_us", "achieved_gbps", "peak_gbps",
                      "fraction_of_peak"])]
    g = {k: v for k, v in sec.get("graphs", {}).items() if k not in ("status", "seconds")}
    out += [_h2("graphs", "Graphs vs eager"), kv_table(g) if g else f"<p>{NOT_RECORDED}</p>"]
    sysd = dict(r.get("system", {}))
    backends = sysd.pop("all_backends", [])
    out += [_h2("system", "System"), kv_table(sysd) if sysd else f"<p>{NOT_RECORDED}</p>",
            "<h3>All backends on this machine</h3>", table(backends, ["name", "available",
                                                                   "reason"])]
    out += [_h2("deviations", "Fallbacks and known deviations"), "<ul>"]
    out += [f"<li>fallback: {escape(f)}</li>" for f in r.get("fallbacks", [])] or \
        ["<li>no fallback</li>" if "fallbacks" in r else f"<li>fallbacks {NOT_RECORDED}</li>"]
    out += [f"<li>{escape(d)}</li>" for d in r.get("known_deviations", [])]
    out += [f"<li>section {escape(k)}: {escape(str(v.get('status')))} "
            f"{escape(str(v.get('error', '')))}</li>" for k, v in sec.items()
            if v.get("status") not in ("done", "pass", "fail")]
    out.append("</ul>")
    out.append("<p class=note>section times: " + ", ".join(
        f"{escape(k)} {num(v.get('seconds'))} s" for k, v in sec.items()
        if isinstance(v.get("seconds"), (int, float))) + "</p>")
    return out


def render(r: dict[str, Any], s: Summary) -> str:
    sec = r.get("sections", {})
    conf = sec.get("conformance", {})
    parts = ['<div id="details">', *_verdict(s), *_conformance(conf, s),
             *_implementation(conf, s), *_ops(conf), *_speed(sec), *_other(r, sec), "</div>"]
    return "\n".join(parts)

