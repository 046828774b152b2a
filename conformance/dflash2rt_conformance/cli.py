"""``dflash2rt conformance``: run the conformance suite on one backend and write the reports.
It exits non-zero unless the verdict passes (``verdict.py``): a failed test, a suite module that
fails to import (the other modules still run), a setup/teardown error, a level below its
minimum, or a refused kernel fallback.

Registered in the ``dflash2rt.commands`` entry-point group (core never imports this package).
"""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("conformance", help="run the conformance suite (L0-L4) on a backend")
    p.add_argument("--backend", default="cpu", help="backend name from `dflash2rt backends`")
    p.add_argument("--junit", metavar="FILE", help="write JUnit XML (with system properties)")
    p.add_argument("--json", metavar="FILE", help="write the JSON report")
    p.add_argument("--markdown", metavar="FILE", help="write the Markdown summary")
    p.add_argument("-k", dest="keyword", metavar="EXPR", help="pytest -k selection (e.g. L1)")
    p.add_argument("--quick", action="store_true", help="small samples only (fast smoke run)")
    p.add_argument("--small", action="store_true",
                   help="reduced L2-L4 instances for slow lanes (triton-interpret; reported)")
    p.add_argument("--model", default="auto", help="L4 model (auto = the bundled pair; tiny = "
                   "the suite's tiny random pair; a bundled name; a dir)")
    p.add_argument("--allow-fallback", action="store_true",
                   help="certify a backend whose kernels fell back (e.g. to torch ops); the "
                        "reports name the fallback either way")
    p.add_argument("-v", "--verbose", action="store_true", help="one line per test")
    p.set_defaults(func=run)


def pytest_args(args: argparse.Namespace) -> list[str]:
    out = ["--pyargs", "dflash2rt_conformance", "--dflash2rt-backend", args.backend,
           "--dflash2rt-model", args.model, "-p", "no:cacheprovider", "-rfEx",
           "--continue-on-collection-errors"]
    out.append("-v" if args.verbose else "-q")
    if args.quick:
        out.append("--dflash2rt-quick")
    if args.small:
        out.append("--dflash2rt-small")
    if args.allow_fallback:
        out.append("--dflash2rt-allow-fallback")
    if args.keyword:
        out += ["-k", args.keyword]
    if args.junit:
        out += [f"--junitxml={args.junit}", "-o", "junit_suite_name=dflash2rt-conformance"]
    if args.json:
        out += ["--dflash2rt-json", args.json]
    if args.markdown:
        out += ["--dflash2rt-markdown", args.markdown]
    return out


def run(args: argparse.Namespace) -> int:
    import pytest

    from dflash2rt.registry import Registry, split_device

    if args.backend != "auto":          # a name no plugin installs is a typo: no report to write
        Registry.discover().entry(split_device(args.backend)[0])
    return int(pytest.main(pytest_args(args)))
