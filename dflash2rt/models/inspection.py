"""``dflash2rt inspect``: what a target and a draft are, whether they fit, and the memory their
weights need, read from configs, tokenizer.json and safetensors headers only (no weight is
ever read, and for a hub id only configs are fetched: headers come by range requests).

Draft formats: ``dflash2`` (DFlash2DraftModel), ``dflash`` (DFlash v1, DFlashDraftModel) and
``speculators`` (vLLM's speculators format: its DFlash / DFlash2 drafts run, with a reduced
vocabulary mapped by d2t/t2d; its other algorithms, e.g. EAGLE-3, are detected and described,
not run). ``inspect_models`` ties the steps together: ``inspect_read`` describes each
checkpoint, ``inspect_fit`` checks the pair and its memory, ``inspect_report`` holds and renders
the result.
"""

from __future__ import annotations

import torch

from dflash2rt.errors import CheckpointError, DraftMismatchError
from dflash2rt.models import hub
from dflash2rt.models.config import TargetConfig
from dflash2rt.models.hf_loader import read_config
from dflash2rt.models.inspect_fit import fit_checks, runnable, weights_memory
from dflash2rt.models.inspect_read import detect_format, draft_part, target_part
from dflash2rt.models.inspect_report import Check, Report


def inspect_models(model: object, draft: object = None, revision: str | None = None,
                   draft_revision: str | None = None,
                   device: torch.device | str | None = None) -> Report:
    """Inspect a target (and draft): ``model`` / ``draft`` as ``dflash2rt.run`` takes them
    (a directory with target/ and draft/, one checkpoint, a hub id, a bundled name, a tuple);
    a lone draft checkpoint is described alone. ``device``: also say whether each dtype's
    weights fit its free memory. Reads configs and safetensors headers only; mismatches are
    in ``Report.problems`` (``raise_for_fit`` raises the first as DraftMismatchError)."""
    t_loc, d_loc, _ = hub.locate_pair(model, draft, revision, draft_revision, weights=False)
    t_raw = read_config(t_loc.path)
    if d_loc is None and detect_format(t_raw) != "target":
        t_loc, d_loc, t_raw = None, t_loc, None                 # a draft on its own
    elif detect_format(t_raw) != "target":
        raise CheckpointError(f"{t_loc.source} is a {detect_format(t_raw)} draft, not a target: "
                              "name the target first and the draft with --draft")
    d_raw = read_config(d_loc.path) if d_loc is not None else None
    if d_raw is not None and detect_format(d_raw) == "target":
        raise CheckpointError(f"{d_loc.source} is not a draft (its config.json has no "
                              "dflash_config or speculators_config): give a DFlash, DFlash2 or "
                              "speculators draft")
    report = Report(None, None)
    tcfg = tpart = None
    if t_loc is not None:
        tcfg = TargetConfig.from_dict(t_raw)
        tpart = target_part(t_loc, tcfg)
        report.target = tpart
    dpart, dcfg = draft_part(d_loc, d_raw) if d_loc is not None else (None, None)
    report.draft = dpart
    if tpart is not None and dpart is not None:
        report.checks = fit_checks(tpart, tcfg, dpart, d_loc)
        native_mapped = dpart["vocab_mapping"] and dcfg is not None and not dcfg.reduced_vocab
        if dcfg is not None and not report.problems and not native_mapped:
            try:                          # the loader's own check agrees (a safety net)
                dcfg.check_target(tcfg)
            except DraftMismatchError as exc:
                report.checks.append(Check("draft config", False, str(exc),
                                           "use a draft made for this target"))
    weights_memory(report, device)
    report.runnable = runnable(report, dcfg)
    return report
