"""The ``dflash2rt`` command line: one module per subcommand, dispatched by ``main``."""

from __future__ import annotations

import argparse
import sys

from ..errors import DFlash2Error
from . import backends_cmd, bench_cmd, inspect_cmd, qualify_cmd, run_cmd, serve_cmd, synth_cmd, \
    train_cmd, watermark_cmd

COMMANDS = (backends_cmd, run_cmd, serve_cmd, inspect_cmd, bench_cmd, train_cmd, synth_cmd,
            qualify_cmd, watermark_cmd)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dflash2rt", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for module in COMMANDS:
        module.add_parser(sub)
    _add_plugin_commands(sub)
    return parser


def _add_plugin_commands(sub: argparse._SubParsersAction) -> None:
    """Subcommands other distributions register in the entry-point group ``dflash2rt.commands``
    (e.g. ``conformance`` from dflash2rt-conformance): a module with ``add_parser(sub)``. Core
    never imports them by name; one that fails to load is reported on stderr, never fatal."""
    from importlib import metadata

    for ep in sorted(metadata.entry_points(group="dflash2rt.commands"), key=lambda e: e.name):
        try:
            ep.load().add_parser(sub)
        except Exception as exc:  # noqa: BLE001 - a broken plugin must not break the CLI
            print(f"dflash2rt: warning: command plugin {ep.name!r} ({ep.value}) failed to load: "
                  f"{type(exc).__name__}: {exc}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except DFlash2Error as exc:
        print(f"dflash2rt: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
