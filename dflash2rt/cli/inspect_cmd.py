"""``dflash2rt inspect``: a target and draft's format, shapes, fit and weight memory, from their
configs and safetensors headers only (no weight is read)."""

from __future__ import annotations

import argparse
import json


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("inspect", help="show a model pair's draft format, shapes, whether the "
                                       "draft fits the target, and the memory its weights need "
                                       "(configs and safetensors headers only)")
    p.add_argument("model", metavar="PATH_OR_ID", help="a directory with target/ and draft/, "
                   "one checkpoint (a target, or a draft on its own), a hub id, a bundled name, "
                   "or TARGET,DRAFT")
    p.add_argument("--draft", default=None, metavar="PATH_OR_ID",
                   help="the draft: a directory or a hub id")
    p.add_argument("--revision", default=None, help="branch, tag or commit of the model's hub id")
    p.add_argument("--draft-revision", default=None,
                   help="branch, tag or commit of the draft's hub id")
    p.add_argument("--backend", default=None, help="also say whether the weights fit this "
                   "backend's device (its free memory)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print the report; a draft that does not fit its target is then raised (exit 2)."""
    from ..models.inspection import inspect_models
    from .run_cmd import _model_arg

    device = None
    if args.backend is not None:
        from ..registry import Registry

        device = Registry.discover().select(args.backend).backend.device
    report = inspect_models(_model_arg(args.model), args.draft, args.revision,
                            args.draft_revision, device)
    print(json.dumps(report.as_dict(), indent=2) if args.json else report.text())
    report.raise_for_fit()
    return 0
