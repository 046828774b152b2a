"""``inspect_models``' safety net (``dflash2rt.models.inspection``): when the fit checks pass, the
draft loader's own target check still runs, and a mismatch only it finds becomes a failing
"draft config" check carrying the loader's message, written out here in full."""

from __future__ import annotations

import json

import torch

from dflash2rt.models import inspection
from dflash2rt.models.inspect_report import Check

from tiny_models import save_pair_dir, tiny_pair


def _stub_checks(monkeypatch):
    monkeypatch.setattr(inspection, "fit_checks",
                        lambda t, tcfg, d, d_loc: [Check("stub", True, "all fine")])


def test_the_loaders_check_catches_what_the_fit_checks_miss(tmp_path, monkeypatch):
    root = save_pair_dir(tmp_path, tiny_pair(dtype=torch.float32), with_tokenizer=False)
    cfg = json.loads((root / "draft/config.json").read_text())
    cfg["dflash_config"]["mask_token_id"] = 99
    (root / "draft/config.json").write_text(json.dumps(cfg))
    _stub_checks(monkeypatch)
    r = inspection.inspect_models(root)
    assert r.checks == [
        Check("stub", True, "all fine"),
        Check("draft config", False, "mask_token_id=99 is outside the vocabulary (target "
              "vocab_size=61); use a draft made for this target, or set "
              "dflash_config.mask_token_id to the id it was trained with",
              "use a draft made for this target")]
    assert r.runnable is False


def test_a_draft_that_fits_gains_no_check(tmp_path, monkeypatch):
    root = save_pair_dir(tmp_path, tiny_pair(dtype=torch.float32), with_tokenizer=False)
    _stub_checks(monkeypatch)
    r = inspection.inspect_models(root)
    assert r.checks == [Check("stub", True, "all fine")] and r.runnable is True
