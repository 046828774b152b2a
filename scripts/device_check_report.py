"""The reports of ``scripts/device_check.py``: conformance figures (one report, or the shards of a
suite run side by side merged level by level), the three files written to the output folder
(results.tgz, summary.json, summary.txt) and the text summary. Standard library only."""

from __future__ import annotations

import json
import tarfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

TGZ_LIMIT = 50 * 2**20            # results.tgz stays under this (largest files dropped first)
OUT_FILES = ("summary.txt", "summary.json", "results.tgz")
_COUNTS = ("passed", "failed", "skipped", "xfailed", "xpassed", "dtype_skipped", "errors",
           "executed", "selected")
_RANK = {"fail": 3, "pass": 2, "skipped": 1, "not selected": 0}   # the worst shard's result wins


def load_json(path: Path) -> dict | list | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def unexecuted_only(level: dict) -> bool:
    """A level that failed only because none of its selected tests ran in this part (all
    skipped: e.g. a module a backend skips whole): a sharding artifact when other parts run it."""
    return (level.get("result") == "fail" and not level.get("failed") and not level.get("errors")
            and bool(level.get("reasons"))
            and all(r.startswith("nothing executed") for r in level["reasons"]))


def merge_reports(reports: list[dict]) -> dict:
    """Conformance reports of disjoint test selections (parts) as one: per level the counts
    summed and the worst result, where a part's "nothing executed" counts only if no part
    executed the level; ops, reasons and exemptions concatenated; the first part's
    implementation and environment (every part ran the same backend). ``excused``: the parts'
    reasons left out that way (their levels ran in other parts)."""
    if len(reports) == 1:
        return reports[0]
    levels: dict[str, dict] = {}
    excused: list[str] = []
    for rep in reports:
        for lv, d in rep.get("levels", {}).items():
            m = levels.setdefault(lv, {"result": "not selected", **dict.fromkeys(_COUNTS, 0),
                                       "unexecuted": []})
            for k in _COUNTS:
                m[k] += d.get(k, 0) or 0
            if unexecuted_only(d):
                m["unexecuted"] += d["reasons"]
            elif _RANK.get(d.get("result"), 3) > _RANK.get(m["result"], 3):
                m["result"] = d.get("result")
            m.setdefault("note", d.get("note", ""))
    for lv, m in levels.items():
        gone = m.pop("unexecuted")
        if gone and m["executed"]:
            excused += [f"{lv}: {r}" for r in gone]
        elif gone:
            m["result"] = "fail"
    failed = any(m["result"] == "fail" for m in levels.values())
    other = [x for r in reports for x in r.get("reasons", []) if x not in excused]
    first = reports[0]
    return {**first, "levels": levels, "result": "fail" if failed or other else "pass",
            "reasons": other, "excused": excused,
            "ops": [o for r in reports for o in r.get("ops", [])],
            "exemptions": [e for r in reports for e in r.get("exemptions", []) or []],
            "duration_s": round(sum(r.get("duration_s") or 0 for r in reports), 1),
            "shards": len(reports)}


def conformance_figures(report: dict) -> dict:
    """Per level run: passed/executed and the result; the ops' checks; what ran."""
    fig: dict[str, Any] = {"result": report.get("result"),
                           "duration_s": report.get("duration_s")}
    if report.get("shards"):
        fig["shards"] = f"{report['shards']} processes side by side (durations summed)"
    if report.get("excused"):
        fig["excused"] = report["excused"]
    for lv, d in report.get("levels", {}).items():
        if d.get("selected"):
            fig[lv] = f"{d['result']} {d['passed']}/{d['executed']} (skipped {d['skipped']})"
    ops = report.get("ops", [])
    if ops:
        fig["ops"] = (f"{sum(o['passed'] for o in ops)}/{len(ops)} op x dtype passed, "
                      f"{sum(o.get('checks', 0) for o in ops)} checks")
    impl = report.get("implementation", {})
    fig["implementation"] = impl.get("kernels")
    fig["kernel_fallbacks"] = impl.get("kernel_fallbacks", [])
    fig["sizes"] = report.get("environment", {}).get("dflash2rt.sizes")
    return fig


def graph_replay_figures(sec, parts: list[dict], backend: str) -> None:
    rows = [r for p in parts for r in p.get("rows", [])]
    replays = sum(r.get("graph_replays", 0) for r in rows)
    eager = [b for r in rows for b in r.get("graph_eager_buckets", [])]
    cross = [r for r in rows if "cpu_tokens_equal" in r]
    caps = [ms for r in rows for ms in r.get("captures_ms", {}).values()]
    marked = [ms for r in rows if r.get("watermark") for ms in r.get("captures_ms", {}).values()]
    slow = {k: v for p in parts for k, v in p.get("captures_over_limit", {}).items()}
    sec.figures.update(
        adapter=parts[0].get("adapter"), configurations=len(rows), replays=replays,
        replay_equal_eager=all(r.get("equal") for r in rows), eager_buckets=eager,
        cpu_tokens_equal=f"{sum(r['cpu_tokens_equal'] for r in cross)}/{len(cross)} sampled "
        "float32 rows (T = 1 / 0.7, block 8 and target-only, unkeyed and keyed): " + "; ".join(
            f"{r['mode']}{' wm' if r['watermark'] else ''} {r['cpu_requests_equal']}/"
            f"{r['batch']} requests" for r in cross),
        capture_ms_max=max(caps, default=None), watermarked_capture_ms_max=max(marked,
                                                                              default=None),
        captures_over_limit=slow)
    if parts[0].get("adapter") is None:
        sec.status = "SKIPPED"
        sec.reason = (f"backend {backend} has no graph adapter: graph_check.py ran eager "
                      f"against eager ({len(rows)} configurations, equal)")
    elif not replays:
        sec.fail("no graph was replayed: equality proves nothing")
    for r in cross:
        if not r["cpu_tokens_equal"]:
            sec.fail(f"{r['mode']} batch {r['batch']}{' watermarked' if r['watermark'] else ''}"
                     f": device tokens differ from the CPU's at {r['cpu_first_difference']}")
    if slow:
        sec.fail(f"{len(slow)} capture(s) over {parts[0]['capture_limit_ms']:.0f} ms: "
                 + "; ".join(f"{k} {v:.0f} ms" for k, v in list(slow.items())[:4]))


def bench_figures(sec, dtype: str, data: dict) -> None:
    b1 = data["batch1"]
    sec.figures[f"{dtype} batch 1"] = _fmt(
        prompts=b1["prompts"], tau=b1["tau"], spec_tok_s=b1["spec_tokens_per_s"],
        target_only_tok_s=b1["target_only_tokens_per_s"],
        speedup=b1["speedup_vs_target_only"], hf_tok_s=b1["hf_tokens_per_s"],
        vs_hf=b1["speedup_vs_hf"], fallbacks=b1["fallbacks"])
    for row in data.get("rows", []):          # every temperature x batch, side by side
        c = row["contenders"]
        cells = {"target_only_tok_s": c["target_only"]["tokens_per_s"]}
        for name in ("fixed", "adaptive", "hf"):
            if name in c:
                cells[f"{name}_x"] = c[name].get("speedup_vs_target_only") or 0.0
                if c[name].get("tau") is not None:
                    cells[f"{name}_tau"] = c[name]["tau"]
        sec.figures[f"{dtype} {row['temperature']} batch {row['batch']}"] = _fmt(**cells)
    if not data.get("greedy_equal_all"):
        sec.fail(f"{dtype}: greedy speculative tokens differ from target-only")


def costs_figures(sec, data: dict) -> None:
    sec.figures["pair"] = data.get("pair", "checkpoint")
    sec.figures["copy bandwidth GB/s"] = round(data.get("copy_bandwidth_gbps", 0.0), 1)
    for row in data.get("rows", []):
        best = max(row["projected_speedup"].items(), key=lambda kv: kv[1])
        hf = row.get("transformers") or {}
        sec.figures[f"batch {row['batch']} context {row['context']}"] = _fmt(
            target_ms=1e3 * row["t_target_s"], bandwidth=row["bandwidth_fraction"],
            **{f"b{b}_draft_ms": 1e3 * v["t_draft_s"] for b, v in row["blocks"].items()},
            **{f"b{b}_verify_ms": 1e3 * v["t_verify_s"] for b, v in row["blocks"].items()},
            best_block=best[0], projected_speedup=best[1],
            **({"transformers_ms": 1e3 * hf["t_step_s"]} if "t_step_s" in hf else {}))
    for k in ("skipped_contexts", "skipped_rows"):
        if data.get(k):
            sec.figures[k.replace("_", " ")] = data[k]
    if not data.get("rows"):
        sec.fail("no row was measured")


def _fmt(**kv) -> str:
    return ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in kv.items())



def tar_results(work: Path, dest: Path) -> dict:
    """All of ``work`` into ``dest``; the largest files are dropped (and named) until it fits."""
    files = sorted((p for p in work.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    dropped: list[str] = []
    while True:
        with tarfile.open(dest, "w:gz") as tar:
            for p in files:
                tar.add(p, arcname=str(p.relative_to(work)))
        size = dest.stat().st_size
        if size < TGZ_LIMIT or not files:
            return {"bytes": size, "members": len(files), "dropped_over_50MB": dropped}
        big = files.pop()
        dropped.append(f"{big.relative_to(work)} ({big.stat().st_size} bytes)")


def section_record(sec) -> dict:
    """A Section as summary.json holds it (its monotonic time limit left out)."""
    return {k: v for k, v in asdict(sec).items() if k != "end"}


def write_outputs(out: Path, work: Path, meta: dict, sections: list) -> dict:
    """results.tgz (the work folder), then summary.json and summary.txt: nothing else."""
    out.mkdir(parents=True, exist_ok=True)
    for name in OUT_FILES:
        (out / name).unlink(missing_ok=True)
    meta["results_tgz"] = tar_results(work, out / "results.tgz")
    summary = {**meta, "sections": [section_record(s) for s in sections]}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / "summary.txt").write_text(summary_text(summary))
    return summary


def summary_text(s: dict) -> str:
    n = {k: sum(x["status"] == k for x in s["sections"]) for k in ("PASS", "FAIL", "SKIPPED")}
    lines = [f"dflash2rt device check: {s['result'].upper()} (exit {s['exit_status']}): "
             f"{n['PASS']} sections passed, {n['FAIL']} failed, {n['SKIPPED']} skipped; backend "
             f"{s['backend']}, float64-less lane {s['nofp64_backend']}"
             + ("; DRY RUN on the CPU" if s["dry_run"] else ""),
             f"deadline {s['deadline_s']:.0f} s; wall {s['wall_s']:.0f} s; "
             f"{s.get('slots', 1)} process slots"
             + (f"; interrupted by {s['interrupted']}" if s["interrupted"] else ""),
             f"system: {s['system_line']}", ""]
    for sec in s["sections"]:
        par = " [side by side]" if sec.get("phase") == "parallel" else ""
        lines.append(f"{sec['name']:<13} {sec['status']:<8} {sec['seconds']:6.1f} s  "
                     f"{sec['title']}{par}")
        if sec["reason"]:
            lines.append(f"{'':<15}reason: {sec['reason']}")
        for k, v in sec["figures"].items():
            lines.append(f"{'':<15}{k}: {v}")
    t = s["results_tgz"]
    lines += ["", f"results.tgz: {t['members']} files, {t['bytes']} bytes"
              + (f"; dropped (over 50 MB): {', '.join(t['dropped_over_50MB'])}"
                 if t["dropped_over_50MB"] else "")]
    return "\n".join(lines) + "\n"
