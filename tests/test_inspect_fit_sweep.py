"""The fit checks of ``dflash2rt inspect`` (``dflash2rt.models.inspect_fit``) on descriptions
written by hand, against details, fixes and memory written out anew: each check's edges (tap
layers at 0 and at the target's depth, the mask token at the tokenizer's last id and at the
vocabulary's end, a tokenizer id one past the embedding), the vocabulary mapping's shapes, the
weights' bytes per dtype with a free memory at the total and one byte short, and whether the
pair runs, with its note."""

from __future__ import annotations

import dataclasses
import json

import pytest

from dflash2rt.models import inspect_fit
from dflash2rt.models.draft_config import DraftConfig
from dflash2rt.models.inspect_fit import fit_checks, runnable, weights_memory
from dflash2rt.models.inspect_report import Check, Report

from tiny_models import draft_dict

OTHER = "use a draft made for this target"
VOCAB_FIX = ("use a draft trained for this target's vocabulary (61 ids, its tokenizer), or a "
             "reduced-vocabulary draft that ships d2t/t2d mapping tensors")
MASK_FIX = (f"{OTHER}, or set the draft's mask_token_id to the id it was trained with")


def _t(**kw) -> dict:
    return {"hidden": 32, "layers": 3, "vocab": 61, "tokenizer": None, "eos_token_ids": [],
            **kw}


def _d(**kw) -> dict:
    return {"format": "dflash2", "hidden": 32, "tap_layers": [0, 2], "num_target_layers": None,
            "mask_token_id": None, "vocab": 61, "draft_vocab": 61, "vocab_mapping": None,
            "tokenizer": None, "eos_token_id": None, **kw}


def _check(name: str, t: dict, d: dict) -> Check:
    checks = fit_checks(t, None, d, None)
    assert [c.name for c in checks] == ["vocabulary", "hidden size", "tap layers", "mask token",
                                        "tokenizer"]
    return next(c for c in checks if c.name == name)


def _tok_file(path, vocab: dict, added=()) -> str:
    path.write_text(json.dumps({"model": {"type": "WordLevel", "vocab": vocab},
                                "added_tokens": [{"id": i, "content": s} for s, i in added]}))
    return str(path)


def test_a_pair_that_fits():
    assert fit_checks(_t(), None, _d(), None) == [
        Check("vocabulary", True, "draft and target share 61 ids"),
        Check("hidden size", True, "32",
              f"the draft reads another model's hidden states; {OTHER}"),
        Check("tap layers", True, "[0, 2] within the target's 3 layers",
              f"the draft taps another model's layers; {OTHER}"),
        Check("mask token", True, "none declared"),
        Check("tokenizer", True, "the target has no tokenizer.json (token-id prompts)")]


@pytest.mark.parametrize("hid, ok, detail", [(32, True, "32"), (48, False, "draft 48, target 32"),
                                             (None, False, "draft None, target 32")])
def test_hidden_size(hid, ok, detail):
    c = _check("hidden size", _t(), _d(hidden=hid))
    assert (c.ok, c.detail) == (ok, detail)


@pytest.mark.parametrize("taps, trained, ok, detail", [
    (None, 7, True, "the draft's config names none"),
    ([0, 2], None, True, "[0, 2] within the target's 3 layers"),
    ([0, 2], 3, True, "[0, 2] within the target's 3 layers"),
    ([], None, True, "[] within the target's 3 layers"),
    ([0, 3], None, False, "[3] outside the target's 3 layers"),
    ([-1, 1, 4], 3, False, "[-1, 4] outside the target's 3 layers"),
    ([0, 2], 4, False, "the draft was trained for a 4-layer target, this one has 3"),
    ([0, 2], 2, False, "the draft was trained for a 2-layer target, this one has 3"),
    ([5], 4, False, "[5] outside the target's 3 layers")])
def test_tap_layers(taps, trained, ok, detail):
    c = _check("tap layers", _t(), _d(tap_layers=taps, num_target_layers=trained))
    assert (c.ok, c.detail) == (ok, detail)
    if not ok:
        assert c.fix == f"the draft taps another model's layers; {OTHER}"


@pytest.mark.parametrize("mask, tok, ok, detail", [
    (None, True, True, "none declared"),
    (0, True, True, "0 within the target's 61 ids (a tokenizer token)"),
    (58, True, True, "58 within the target's 61 ids (a tokenizer token)"),
    (59, True, True, "59 within the target's 61 ids (past the tokenizer's ids: an unused row)"),
    (60, True, True, "60 within the target's 61 ids (past the tokenizer's ids: an unused row)"),
    (60, False, True, "60 within the target's 61 ids"),
    (61, True, False, "61 is outside the target's 61 ids"),
    (-1, True, False, "-1 is outside the target's 61 ids"),
    ("5", True, False, "5 is outside the target's 61 ids"),
    (5.0, False, False, "5.0 is outside the target's 61 ids")])
def test_mask_token(tmp_path, mask, tok, ok, detail):
    t = _t(tokenizer={"tokens": 59, "max_id": 58, "file": "/unused"} if tok else None)
    c = _check("mask token", t, _d(mask_token_id=mask))
    assert (c.ok, c.detail) == (ok, detail)
    if not ok:
        assert c.fix == MASK_FIX


@pytest.mark.parametrize("d, ok, detail", [
    (_d(), True, "draft and target share 61 ids"),
    (_d(format="speculators", vocab=None), True, "draft and target share 61 ids"),
    (_d(format="speculators", vocab=100), False,
     "the draft was made for a verifier with a 100-token vocabulary, the target has 61"),
    (_d(vocab=100, draft_vocab=100), False,
     "the draft declares a 100-token vocabulary, the target has 61, and the draft has no "
     "d2t/t2d tensors to map between them"),
    (_d(draft_vocab=40, vocab_mapping={}), False,
     "the draft declares a 40-token vocabulary, the target has 61, and the draft has no "
     "d2t/t2d tensors to map between them"),
    (_d(draft_vocab=40, vocab_mapping={"d2t": [40], "t2d": [61]}), True,
     "draft vocabulary of 40 ids mapped to the target's 61 by d2t/t2d"),
    (_d(draft_vocab=40, vocab_mapping={"d2t": [40]}), True,
     "draft vocabulary of 40 ids mapped to the target's 61 by d2t"),
    (_d(vocab_mapping={"d2t": [61], "t2d": [61]}), True,
     "draft vocabulary of 61 ids mapped to the target's 61 by d2t/t2d"),
    (_d(draft_vocab=40, vocab_mapping={"d2t": [41], "t2d": [61]}), False,
     "vocabulary mapping d2t has shape [41], expected [40]"),
    (_d(draft_vocab=40, vocab_mapping={"d2t": [40, 1], "t2d": [60]}), False,
     "vocabulary mapping d2t has shape [40, 1], expected [40], t2d has shape [60], "
     "expected [61]")])
def test_vocabulary(d, ok, detail):
    c = _check("vocabulary", _t(), d)
    assert (c.ok, c.detail) == (ok, detail)
    assert c.fix == ("" if ok else VOCAB_FIX)


@pytest.mark.parametrize("max_id, ok", [(60, True), (61, False), (70, False)])
def test_a_target_tokenizer_past_its_embedding(max_id, ok):
    c = _check("tokenizer", _t(tokenizer={"tokens": 5, "max_id": max_id, "file": "/unused"}),
               _d())
    if ok:
        assert c == Check("tokenizer", True, "5 tokens, ids 0..60 within the vocabulary")
    else:
        assert c == Check("tokenizer", False, f"the target's tokenizer has ids up to {max_id}, "
                          "past its 61-row embedding",
                          "use the tokenizer.json that belongs to this target checkpoint")


@pytest.mark.parametrize("draft_vocab, added, ok, detail", [
    ({"a": 0, "b": 1, "c": 2}, (), True, "3 tokens, ids 0..2 within the vocabulary"),
    ({"a": 1, "b": 0, "c": 2}, (), False,
     "the draft's tokenizer.json differs from the target's (4 token/id pairs not shared)"),
    ({"a": 0, "b": 1, "c": 2}, (("<x>", 3),), False,
     "the draft's tokenizer.json differs from the target's (1 token/id pairs not shared)"),
    ({"a": 0, "b": 1}, (), False,
     "the draft's tokenizer.json differs from the target's (1 token/id pairs not shared)")])
def test_the_drafts_tokenizer_against_the_targets(tmp_path, draft_vocab, added, ok, detail):
    tf = _tok_file(tmp_path / "t.json", {"a": 0, "b": 1, "c": 2})
    df = _tok_file(tmp_path / "d.json", draft_vocab, added)
    t = _t(tokenizer={"tokens": 3, "max_id": 2, "file": tf})
    c = _check("tokenizer", t, _d(tokenizer={"tokens": 0, "max_id": 0, "file": df}))
    assert (c.ok, c.detail) == (ok, detail)
    if not ok:
        assert c.fix == "use a draft trained with this target's tokenizer"


@pytest.mark.parametrize("eos_d, eos_t, tail", [
    (None, [5], ""), (5, [], ""), ([], [5], ""),
    (5, [7, 5], ", eos ids agree"), ([9, 7], [7], ", eos ids agree"),
    (0, [0], ", eos ids agree"),
    (9, [5], "; the draft's eos_token_id [9] is none of the target's [5] (a draft for a "
             "sibling model, or another tokenizer?)"),
    ([1, 2], [3, 4], "; the draft's eos_token_id [1, 2] is none of the target's [3, 4] (a "
                     "draft for a sibling model, or another tokenizer?)")])
def test_eos_hints(eos_d, eos_t, tail):
    t = _t(tokenizer={"tokens": 59, "max_id": 60, "file": "/unused"}, eos_token_ids=eos_t)
    c = _check("tokenizer", t, _d(eos_token_id=eos_d))
    assert c == Check("tokenizer", True, f"59 tokens, ids 0..60 within the vocabulary{tail}")


def test_weights_memory_per_dtype_without_a_device():
    r = Report({"parameters": 10}, {"parameters": 3})
    weights_memory(r, None)
    assert r.memory == {"float32": {"target": 40, "draft": 12, "total": 52},
                        "bfloat16": {"target": 20, "draft": 6, "total": 26},
                        "float16": {"target": 20, "draft": 6, "total": 26}}
    assert list(r.memory) == ["float32", "bfloat16", "float16"] and r.device is None
    alone = Report(None, {"parameters": 7})
    weights_memory(alone, None)
    assert alone.memory["float32"] == {"draft": 28, "total": 28}
    assert alone.memory["bfloat16"] == {"draft": 14, "total": 14}


@pytest.mark.parametrize("free, fits", [
    (52, {"float32": True, "bfloat16": True, "float16": True}),
    (51, {"float32": False, "bfloat16": True, "float16": True}),
    (26, {"float32": False, "bfloat16": True, "float16": True}),
    (25, {"float32": False, "bfloat16": False, "float16": False}),
    (None, None)])
def test_whether_the_weights_fit_the_free_memory(monkeypatch, free, fits):
    asked = []
    monkeypatch.setattr(inspect_fit, "available_bytes", lambda dev: asked.append(dev) or free)
    r = Report({"parameters": 10}, {"parameters": 3})
    weights_memory(r, "cpu")
    assert r.device == {"device": "cpu", "free_bytes": free, "fits": fits}
    assert [str(d) for d in asked] == ["cpu"]


def _dcfg(draft_vocab_size: int = 0) -> DraftConfig:
    return dataclasses.replace(DraftConfig.from_dict(draft_dict("dflash1")),
                               draft_vocab_size=draft_vocab_size)


def test_what_runs_and_why():
    alone = Report(None, {"format": "dflash2"})
    assert runnable(alone, _dcfg()) is None
    assert alone.notes == ["a draft on its own: give its target too (inspect TARGET --draft "
                           "DRAFT) to check the fit"]
    target_only = Report({"x": 1}, None)
    assert runnable(target_only, None) is True
    assert target_only.notes == ["no draft: target-only decoding (spec=False / --no-spec)"]

    plain = Report({"x": 1}, {"vocab_mapping": None}, checks=[Check("a", True, "")])
    assert runnable(plain, _dcfg()) is True and plain.notes == []
    failing = Report({"x": 1}, {"vocab_mapping": None}, checks=[Check("a", False, "")])
    assert runnable(failing, _dcfg()) is False and failing.notes == []

    eagle = Report({"x": 1}, {"algorithm": "eagle3", "vocab_mapping": {"d2t": [40]}})
    assert runnable(eagle, None) is False
    assert eagle.notes == ["speculators format (eagle3) detected: dflash2rt runs DFlash and "
                           "DFlash2 drafts only"]
    stray = Report({"x": 1}, {"vocab_mapping": {"d2t": [61]}})
    assert runnable(stray, _dcfg()) is False
    assert stray.notes == ["d2t/t2d tensors in a draft whose config declares no reduced "
                           "vocabulary (the speculators format's draft_vocab_size): not run"]
    for checks, ok in (([], True), ([Check("a", False, "")], False)):
        reduced = Report({"x": 1}, {"vocab_mapping": {"d2t": [40]}}, checks=checks)
        assert runnable(reduced, _dcfg(40)) is ok
        assert reduced.notes == ["a reduced-vocabulary draft: it proposes among 40 of the "
                                 "target's 61 ids (d2t), the others with probability 0; "
                                 "verification stays exact"]
