"""Device check in one command under one deadline (default 420 s): the SECTIONS in
priority order, each skipped with the reason "deadline" once the time left is under its budget,
each step under a timeout. Writes only summary.txt, summary.json and results.tgz (every log and
report) to the output folder; works in a temporary folder, packed also on SIGTERM / SIGINT /
SIGHUP. ``--dry-run`` runs the same sections on the CPU with short sizes (CI runs it)."""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from device_check_lib import OUT_FILES, Interrupted, Runner, Section, write_outputs  # noqa: E402
from device_check_sections import ROOT, Check, smoke  # noqa: E402

# The dry run's CPU stand-ins for the device's backend and its float64-less lane.
DRY_BACKEND = os.environ.get("DRY_BACKEND", "cpu")
DRY_NOFP64_BACKEND = os.environ.get("DRY_NOFP64_BACKEND", "cpu-nofp64")
DEFAULT_DEADLINE_S = 420
RESERVE_S = 10                      # kept for packing results.tgz and the summaries
# name, title, budget on a device (s), budget in a dry run (s): the priority order. A budget is
# the section's time limit and the time it needs left before the deadline to start.
SECTIONS = (("setup", "install (offline), system, backends", 150, 60),
            ("conformance", "conformance: ops and levels L0-L4", 150, 120),
            ("graphs", "conformance: graphs level", 60, 60),
            ("graph_replay", "graph replay vs eager on fresh inputs (graph_check.py)", 75, 120),
            ("nofp64", "float64 off (DFLASH2RT_FP64=0): smoke, conformance L1 and L2", 90, 90),
            ("memcheck", "compute-sanitizer memcheck of the smoke launch", 90, 20),
            ("bench", "bench batch 1, float32 and bfloat16 (short)", 150, 120),
            ("costs", "cost model on a real shape (synth, bench --costs)", 300, 120))
_LAYERS = ["--layers", os.environ["COSTS_LAYERS"]] if os.environ.get("COSTS_LAYERS") else []
SIZES = {True: {"conformance": ["--quick", "--small"],
                "bench": ["--repeats", "1", "--prompts", "1", "--max-new-tokens", "16",
                          "--blocks", "4", "--temperatures", "0", "--no-hf"],
                "synth": ["--shape", "qwen3-0.6b", "--layers", "2", "--draft-layers", "1"],
                "costs": ["--dtype", "float32", "--contexts", "128", "--batches", "1",
                          "--blocks", "2", "--reps", "1", "--no-hf"]},
         False: {"conformance": [],
                 "bench": ["--repeats", "2", "--prompts", "4", "--max-new-tokens", "64",
                           "--blocks", "8", "--temperatures", "0,1"],
                 "synth": ["--shape", os.environ.get("COSTS_SHAPE", "qwen3-8b"), *_LAYERS],
                 "costs": ["--dtype", "bfloat16", "--contexts", "128,2048", "--batches", "1,8",
                           "--reps", "3"]}}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dry-run", action="store_true", help=f"the CPU stand-ins ({DRY_BACKEND}, "
                    f"{DRY_NOFP64_BACKEND}) and short sizes: checks the plumbing")
    ap.add_argument("--deadline", type=float, default=float(os.environ.get(
        "DEADLINE_S", DEFAULT_DEADLINE_S)), help="seconds for the whole run (DEADLINE_S)")
    ap.add_argument("--out", default=os.environ.get("OUT") or "out/device",
                    help="folder for the three files (OUT; default out/device)")
    ap.add_argument("--backend", default=os.environ.get("BACKEND", "cuda"),
                    help="the device's backend (BACKEND; default cuda)")
    ap.add_argument("--sections", default=",".join(s[0] for s in SECTIONS),
                    help="comma-separated subset (the others: SKIPPED, not selected)")
    ap.add_argument("--python", default=os.environ.get("PYTHON") or sys.executable,
                    help="interpreter with torch for every step (PYTHON)")
    ap.add_argument("--smoke", metavar="BACKEND", help=argparse.SUPPRESS)
    ap.add_argument("--expect-fp64", choices=("0", "1"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.dry_run:
        args.backend, args.nofp64_backend = DRY_BACKEND, DRY_NOFP64_BACKEND
    else:
        args.nofp64_backend = args.backend
    unknown = set(args.sections.split(",")) - {s[0] for s in SECTIONS}
    if unknown:
        ap.error(f"unknown sections {sorted(unknown)}; known: {[s[0] for s in SECTIONS]}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.smoke:
        return smoke(args.smoke, None if args.expect_fp64 is None else args.expect_fp64 == "1")
    out = Path(args.out).resolve()
    os.chdir(ROOT)
    os.environ["PYTHONUNBUFFERED"] = "1"
    if args.dry_run:        # one torch thread: the dry run shares small CI machines
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    work = Path(tempfile.mkdtemp(prefix="dflash2rt-device-check-"))
    runner = Runner(work, args.deadline, RESERVE_S)
    check = Check(args, runner, SIZES[args.dry_run])
    chosen = set(args.sections.split(","))
    sections = [Section(n, t, dry if args.dry_run else dev) for n, t, dev, dry in SECTIONS]
    for sec in sections:
        if sec.name not in chosen:
            sec.reason = "not selected (--sections)"
    interrupted = None
    runner.say(f"device check: backend {args.backend}, float64-less lane {args.nofp64_backend}"
               f"{' (dry run)' if args.dry_run else ''}, deadline {args.deadline:.0f} s, "
               f"work folder {work}")
    try:
        for sec in (s for s in sections if s.name in chosen):
            runner.run_section(sec, getattr(check, sec.name))
    except Interrupted as exc:
        interrupted = str(exc)
        for sec in sections:
            if sec.status == "SKIPPED" and not sec.reason:
                sec.reason = f"interrupted by {interrupted}"
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)          # the results are written whole
        failed = [s.name for s in sections if s.status == "FAIL"]
        status = 1 if failed or interrupted else 0
        ran = any(s.status != "SKIPPED" for s in sections)
        meta = {"schema": "dflash2rt-device-check/1",
                "result": "fail" if status else "pass" if ran else "no section ran",
                "exit_status": status, "failed": failed, "interrupted": interrupted,
                "dry_run": args.dry_run, "backend": args.backend,
                "nofp64_backend": args.nofp64_backend, "deadline_s": args.deadline,
                "wall_s": round(runner.elapsed(), 1),
                "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "system": check.system,
                "system_line": "; ".join(check.system.values()) or "not probed (setup skipped)"}
        summary = write_outputs(out, work, meta, sections)
        shutil.rmtree(work, ignore_errors=True)
    print((out / "summary.txt").read_text(), end="")
    print(f"== wrote {', '.join(OUT_FILES)} to {out} (exit {summary['exit_status']})")
    return summary["exit_status"]


if __name__ == "__main__":
    sys.exit(main())
