"""``dflash2rt qualify`` and ``dflash2rt report merge``: device qualification reports."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("qualify", help="qualify a device: conformance, benchmarks, report")
    p.add_argument("--backend", help="the backend (NAME, or NAME:INDEX for one device)")
    p.add_argument("--devices", metavar="all|LIST", help="qualify several devices at once, one "
                   "process each: 'all' (every device of --backend) or a comma list of "
                   "NAME:INDEX or indices of --backend; --out gets one directory per device, "
                   "the merged matrix and devices.json (outliers named)")
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
    from ..errors import InvalidInputError

    if args.devices:
        return _run_devices(args)
    if not args.backend:
        raise InvalidInputError("qualify needs --backend NAME (or --devices all|LIST)")
    from ..qualify.run import qualify

    report = qualify(args.backend, args.out, args.model, args.quick,
                     conformance_select=args.conformance_select,
                     conformance_small=args.conformance_small,
                     allow_fallback=args.allow_fallback)
    # Non-zero unless the verdict passed: conformance failed or did not run, a section failed,
    # or the run did not complete (report.json "verdict" says which).
    return 0 if report.get("verdict", {}).get("result") == "pass" else 1


def _run_devices(args: argparse.Namespace) -> int:
    from ..qualify.devices import device_list, qualify_devices, summary_lines

    devices = device_list(args.devices, args.backend)
    argv = ["--model", args.model] + (["--quick"] if args.quick else []) \
        + (["--conformance-select", args.conformance_select] if args.conformance_select
           else []) + (["--conformance-small"] if args.conformance_small else []) \
        + (["--allow-fallback"] if args.allow_fallback else [])
    s = qualify_devices(devices, args.out, argv)
    for line in summary_lines(s):
        print(line)
    print(f"{len(s['verdicts'])} device reports -> {args.out}/matrix.html, matrix.md, "
          "devices.json")
    ok = not s["no_report"] and not s["outliers"] \
        and all(v == "pass" for v in s["verdicts"].values())
    return 0 if ok else 1


def run_merge(args: argparse.Namespace) -> int:
    from ..qualify.merge import merge

    matrix = merge(args.dirs, args.out)
    print(f"{len(matrix['rows'])} checks × {len(matrix['backends'])} backends -> "
          f"{args.out}/matrix.html, matrix.md")
    return 0
