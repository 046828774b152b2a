"""``dflash2rt qualify`` and ``dflash2rt report merge``: device qualification reports."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("qualify", help="qualify a device: conformance, benchmarks, report")
    p.add_argument("--backend", required=True)
    p.add_argument("--model", default="stdlib-code")
    p.add_argument("--quick", action="store_true", help="fewer prompts, sizes and repeats")
    p.add_argument("--out", required=True, help="directory for report.json, junit.xml, "
                   "report.html")
    p.add_argument("--conformance-select", metavar="EXPR", help="pytest -k selection of "
                   "conformance levels (e.g. 'L0 or L1' on the slow triton-interpret lane)")
    p.add_argument("--conformance-small", action="store_true", help="L2-L4 on the suite's "
                   "small instances (the triton-interpret lane; named in the report)")
    p.add_argument("--allow-fallback", action="store_true", help="let conformance certify a "
                   "backend whose kernels fell back (named in the report)")
    p.set_defaults(func=run_qualify)
    r = sub.add_parser("report", help="work with qualification reports")
    rs = r.add_subparsers(dest="report_command", required=True)
    m = rs.add_parser("merge", help="backends × checks matrix from several report directories")
    m.add_argument("dirs", nargs="+")
    m.add_argument("--out", required=True)
    m.set_defaults(func=run_merge)


def run_qualify(args: argparse.Namespace) -> int:
    from ..qualify.run import qualify

    report = qualify(args.backend, args.out, args.model, args.quick,
                     conformance_select=args.conformance_select,
                     conformance_small=args.conformance_small,
                     allow_fallback=args.allow_fallback)
    # Non-zero unless the verdict passed: conformance failed or did not run, a section failed,
    # or the run did not complete (report.json "verdict" says which).
    return 0 if report.get("verdict", {}).get("result") == "pass" else 1


def run_merge(args: argparse.Namespace) -> int:
    from ..qualify.merge import merge

    matrix = merge(args.dirs, args.out)
    print(f"{len(matrix['rows'])} checks × {len(matrix['backends'])} backends -> "
          f"{args.out}/matrix.html, matrix.md")
    return 0
