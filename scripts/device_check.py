"""Device check in one command under one deadline (default 470 s): setup, then the correctness
sections side by side (conformance split into one process per suite module, the graphs level,
graph replay in shards, float64 off, memcheck), their processes sharing ``--slots`` process slots
(the longest expected first), then the timed sections alone on the device (the real-shape cost
model, the bench). A section starts only if the deadline leaves the time it needs (else SKIPPED,
"deadline"); each step is under a timeout. Writes only summary.txt, summary.json and results.tgz
(every log and report) to the output folder; works in a temporary folder, packed also on
SIGTERM / SIGINT / SIGHUP. ``--dry-run`` runs the same sections on the CPU with short sizes (CI
runs it)."""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from device_check_lib import Interrupted, Runner, Section  # noqa: E402
from device_check_report import OUT_FILES, write_outputs  # noqa: E402
from device_check_probe import smoke  # noqa: E402
from device_check_sections import ROOT, Check  # noqa: E402

# The dry run's CPU stand-ins for the device's backend and its float64-less lane.
DRY_BACKEND = os.environ.get("DRY_BACKEND", "cpu")
DRY_NOFP64_BACKEND = os.environ.get("DRY_NOFP64_BACKEND", "cpu-nofp64")
DEFAULT_DEADLINE_S = 470
RESERVE_S = 10                      # kept for packing results.tgz and the summaries
# name, title, phase, device budget / need (s), dry-run budget (s), in the summary's order.
# Budget: the section's time limit; need: the time it must have left before the deadline to
# start (0: its budget). Measured on an H200 (16 cores, 8 slots, docs/benchmarks/device-check.md):
# setup 66 s (cold bfloat16 kernel compile 28 s of it); side by side, every section within
# 140 s (the float64-less L1 the longest, since cut by dtype); alone, the cost model 42 s and
# the bench 106 s. The side-by-side budgets bound that phase's wall time.
SECTIONS = (("setup", "install (offline), system, backends, kernels compiled ahead", "serial",
             120, 80, 90),
            ("conformance", "conformance: ops and levels L0-L4", "parallel", 210, 0, 150),
            ("graphs", "conformance: graphs level", "parallel", 210, 0, 60),
            ("graph_replay", "graph replay vs eager, captures, device tokens vs CPU "
             "(graph_check.py)", "parallel", 210, 0, 150),
            ("nofp64", "float64 off (DFLASH2RT_FP64=0): smoke, conformance L1 and L2",
             "parallel", 210, 0, 120),
            ("memcheck", "compute-sanitizer memcheck: planted write, smoke launches",
             "parallel", 210, 0, 20),
            ("bench", "bench batch 1 and 8, float32 and bfloat16, T = 0 and 1 (short)", "timed",
             130, 110, 120),
            ("costs", "cost model on a real shape (in memory, seeded), transformers beside",
             "timed", 90, 60, 120))
TIMED_ORDER = ("costs", "bench")    # alone on the device, in this order, after the others
SIZES = {True: {"conformance": ["--quick", "--small"], "graph_check": ["--tokens", "8"],
                "bench": ["--repeats", "1", "--prompts", "1", "--max-new-tokens", "16",
                          "--blocks", "4", "--temperatures", "0", "--no-hf"],
                "costs": ["--shape", "qwen3-0.6b", "--layers", "2", "--draft-layers", "1",
                          "--dtype", "float32", "--contexts", "128", "--batches", "1",
                          "--blocks", "2", "--reps", "1"]},
         False: {"conformance": [], "graph_check": [],
                 "bench": ["--repeats", "2", "--prompts", "4", "--max-new-tokens", "64",
                           "--blocks", "8", "--temperatures", "0,1"],
                 "costs": ["--shape", os.environ.get("COSTS_SHAPE", "qwen3-8b"),
                           *(["--layers", os.environ["COSTS_LAYERS"]]
                             if os.environ.get("COSTS_LAYERS") else []),
                           "--dtype", "bfloat16", "--contexts", "128,2048", "--batches", "1,8",
                           "--reps", "3"]}}
# Expected seconds of the side-by-side steps (the longest waiting one gets the next free
# process slot), as measured with 8 of them side by side on an H200, process start included
# (about 10 s: torch, CUDA, the backend's smoke launch and graph self-test); others: DEFAULT_EXPECT.
EXPECT = {"l1_ops-f32": 50.0, "l1_ops-bf16": 45.0, "l3_procs-long": 50.0,
          "l4_end_to_end-long": 34.0, "l3_constraints": 30.0, "l4_watermark": 24.0,
          "l0_reference": 23.0, "l4_end_to_end-rest": 20.0, "l3_joint_law": 17.0,
          "l3_reduced_vocab": 15.0, "l1_ops-rest": 15.0, "l0_adaptive": 14.0,
          "graphs-long": 45.0, "graphs-rest": 55.0, "graph_check": 40.0, "smoke": 8.0,
          "memcheck": 13.0}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
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
    ap.add_argument("--slots", type=int, default=int(os.environ.get("SLOTS", 0)),
                    help="processes side by side (SLOTS; default: half the cores, at most 8; "
                         "1 runs every section one after another)")
    ap.add_argument("--python", default=os.environ.get("PYTHON") or sys.executable,
                    help="interpreter with torch for every step (PYTHON)")
    ap.add_argument("--smoke", metavar="BACKEND", help=argparse.SUPPRESS)
    ap.add_argument("--expect-fp64", choices=("0", "1"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.dry_run:
        args.backend, args.nofp64_backend = DRY_BACKEND, DRY_NOFP64_BACKEND
    else:
        args.nofp64_backend = args.backend
    args.slots = args.slots or max(1, min(8, (os.cpu_count() or 2) // 2))
    unknown = set(args.sections.split(",")) - {s[0] for s in SECTIONS}
    if unknown:
        ap.error(f"unknown sections {sorted(unknown)}; known: {[s[0] for s in SECTIONS]}")
    return args


def run_sections(runner: Runner, check: Check, sections: list[Section], chosen: set) -> None:
    """setup; the parallel phase (side by side, or one after another with one slot); the timed
    sections alone."""
    by = {s.name: s for s in sections if s.name in chosen}
    body = lambda s: getattr(check, s.name)                                # noqa: E731
    if "setup" in by:
        runner.run_section(by["setup"], body(by["setup"]))
    par = [s for s in sections if s.phase == "parallel" and s.name in by]
    if runner.slots.n > 1:
        runner.run_parallel([(s, body(s)) for s in par])
    else:
        for s in par:
            runner.run_section(s, body(s))
    for name in TIMED_ORDER:
        if name in by:
            runner.run_section(by[name], body(by[name]))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.smoke:
        return smoke(args.smoke, None if args.expect_fp64 is None else args.expect_fp64 == "1")
    out = Path(args.out).resolve()
    os.chdir(ROOT)
    os.environ["PYTHONUNBUFFERED"] = "1"
    if args.dry_run:        # one torch thread: the dry run shares small CI machines
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    elif args.slots > 1:    # side-by-side processes share the cores
        os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 2) // args.slots)))
    work = Path(tempfile.mkdtemp(prefix="dflash2rt-device-check-"))
    runner = Runner(work, args.deadline, RESERVE_S, args.slots)
    check = Check(args, runner, SIZES[args.dry_run], EXPECT)
    chosen = set(args.sections.split(","))
    sections = [Section(n, t, dry if args.dry_run else dev, 0 if args.dry_run else need,
                        phase=ph) for n, t, ph, dev, need, dry in SECTIONS]
    for sec in sections:
        if sec.name not in chosen:
            sec.reason = "not selected (--sections)"
    interrupted = None
    runner.say(f"device check: backend {args.backend}, float64-less lane {args.nofp64_backend}"
               f"{' (dry run)' if args.dry_run else ''}, deadline {args.deadline:.0f} s, "
               f"{args.slots} process slots, work folder {work}")
    try:
        run_sections(runner, check, sections, chosen)
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
        meta = {"schema": "dflash2rt-device-check/2",
                "result": "fail" if status else "pass" if ran else "no section ran",
                "exit_status": status, "failed": failed, "interrupted": interrupted,
                "dry_run": args.dry_run, "backend": args.backend,
                "nofp64_backend": args.nofp64_backend, "deadline_s": args.deadline,
                "slots": args.slots, "wall_s": round(runner.elapsed(), 1),
                "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "system": check.system,
                "system_line": "; ".join(check.system.values()) or "not probed (setup skipped)"}
        summary = write_outputs(out, work, meta, sections)
        shutil.rmtree(work, ignore_errors=True)
    print((out / "summary.txt").read_text(), end="")
    print(f"== wrote {', '.join(OUT_FILES)} to {out} (exit {summary['exit_status']})")
    return summary["exit_status"]


if __name__ == "__main__":
    sys.exit(main())
