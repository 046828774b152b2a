"""``dflash2rt backends``: every installed backend, whether it can run here, and why not."""

from __future__ import annotations

import argparse
import json

from ..registry import Registry


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("backends", help="list backends, their availability and reasons")
    p.add_argument("--json", action="store_true", help="print a JSON list of objects")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    rows = Registry.discover().statuses()
    if args.json:
        print(json.dumps([r.as_dict() for r in rows], indent=2))
        return 0
    print(f"{'backend':<18} {'avail':<6} {'prio':>4}  {'plugin':<28} device / reason")
    for r in rows:
        plugin = f"{r.distribution} {r.version}"
        prio = "" if r.priority is None else str(r.priority)
        avail = "yes" if r.available else "no"
        where = r.device if r.available else r.reason
        print(f"{r.name:<18} {avail:<6} {prio:>4}  {plugin:<28} {where}")
        if r.available or r.kernels:
            flags = " (opt-in)" if r.opt_in else ""
            print(f"{'':<18} kernels: {r.kernels}; dtypes: {', '.join(r.dtypes)}; "
                  f"graphs: {r.graphs}{flags}")
    return 0
