"""``dflash2rt backends``: every installed backend, whether it can run here, and why not; each
available one that ``auto`` may pick (not opt-in) is built once, to show what runs each op and
its standing fallbacks (a kernel fallback among them)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..registry import BackendStatus, Registry


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("backends", help="list backends, their availability and reasons")
    p.add_argument("--json", action="store_true", help="print a JSON list of objects")
    p.set_defaults(func=run)


def _built(reg: Registry, row: BackendStatus) -> dict[str, Any]:
    """What the created backend runs and its standing fallbacks (kernel fallbacks included)."""
    if not row.available or row.opt_in or row.name not in reg.entries:
        return {"implementation": "", "fallbacks": []}
    try:
        backend = reg.create(row.name)
    except Exception as exc:  # noqa: BLE001 - shown in the row
        return {"implementation": f"create raised {type(exc).__name__}: {exc}", "fallbacks": []}
    return {"implementation": backend.implementation_summary(),
            "fallbacks": list(backend.standing_fallbacks)}


def run(args: argparse.Namespace) -> int:
    reg = Registry.discover()
    rows = [(r, _built(reg, r)) for r in reg.statuses()]
    if args.json:
        print(json.dumps([{**r.as_dict(), **b} for r, b in rows], indent=2))
        return 0
    w = max([len("backend"), *(len(r.name) for r, _ in rows)]) + 1
    print(f"{'backend':<{w}} {'avail':<6} {'prio':>4}  {'plugin':<28} device / reason")
    for r, b in rows:
        plugin = f"{r.distribution} {r.version}"
        prio = "" if r.priority is None else str(r.priority)
        avail = "yes" if r.available else "no"
        where = r.device if r.available else r.reason
        print(f"{r.name:<{w}} {avail:<6} {prio:>4}  {plugin:<28} {where}")
        if r.available or r.kernels:
            flags = " (opt-in)" if r.opt_in else ""
            print(f"{'':<{w}} kernels: {r.kernels}; dtypes: {', '.join(r.dtypes)}; "
                  f"float64: {'yes' if r.fp64 else 'no'}; graphs: {r.graphs}{flags}")
        if b["implementation"]:
            print(f"{'':<{w}} runs: {b['implementation']}")
        for f in b["fallbacks"]:
            print(f"{'':<{w}} fallback: {f}")
    return 0
