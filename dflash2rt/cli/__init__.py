"""The ``dflash2rt`` command line: one module per subcommand, dispatched by ``main``."""

from __future__ import annotations

import argparse
import sys

from ..errors import DFlash2Error
from . import backends_cmd, bench_cmd, run_cmd

COMMANDS = (backends_cmd, run_cmd, bench_cmd)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dflash2rt", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for module in COMMANDS:
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except DFlash2Error as exc:
        print(f"dflash2rt: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
