"""What ``dflash2rt inspect`` prints and returns (``dflash2rt.models.inspect_report``) against
text and dicts written out by hand: each line of a full report, the size units at their edges
(K / M / B parameters, kB / MB / GB), the fit lines with their fixes, the memory table with and
without a device, and the dict ``--json`` prints."""

from __future__ import annotations

import pytest

from dflash2rt.errors import DraftMismatchError
from dflash2rt.models.inspect_report import Check, Report, _bytes, _count


def _target(**kw) -> dict:
    t = {"source": "org/t", "path": "/c/t", "revision": "v1", "commit": "c0ffee",
         "model_type": "qwen3", "layers": 3, "hidden": 32, "heads": 4, "kv_heads": 2,
         "head_dim": 8, "intermediate": 72, "vocab": 61, "parameters": 1_500_000_000,
         "stored_dtype": "BF16", "tokenizer": {"tokens": 59, "max_id": 60, "file": "/x"}}
    return {**t, **kw}


def _draft(**kw) -> dict:
    d = {"source": "/d", "path": "/d", "revision": None, "commit": None,
         "format": "speculators", "algorithm": "dflash", "vocab": 61, "draft_vocab": 40,
         "layers": 2, "hidden": 32, "heads": 4, "kv_heads": 2, "block_size": 8,
         "tap_layers": [0, 2], "mask_token_id": 60, "parameters": 2_500_000,
         "stored_dtype": "F32", "vocab_mapping": {"d2t": [40], "t2d": [61]}}
    return {**d, **kw}


@pytest.mark.parametrize("n, text", [
    (0, "0.0K"), (1234, "1.2K"), (999_999, "1000.0K"), (1_000_000, "1.0M"),
    (2_500_000, "2.5M"), (999_999_999, "1000.0M"), (1_000_000_000, "1.00B"),
    (1_500_000_000, "1.50B"), (12_345_678_901, "12.35B")])
def test_parameter_counts(n, text):
    assert _count(n) == text


@pytest.mark.parametrize("n, text", [
    (0, "0.0 kB"), (1500, "1.5 kB"), (999_999, "1000.0 kB"), (1_000_000, "1.0 MB"),
    (10_000_000, "10.0 MB"), (999_999_999, "1000.0 MB"), (1_000_000_000, "1.00 GB"),
    (6_010_000_000, "6.01 GB")])
def test_byte_sizes(n, text):
    assert _bytes(n) == text


def test_a_full_report_line_by_line():
    r = Report(_target(), _draft(),
               checks=[Check("vocabulary", True, "shared"),
                       Check("mask token", False, "99 outside", "fix it")],
               memory={"float32": {"target": 6_000_000_000, "draft": 20_000_000,
                                   "total": 6_020_000_000},
                       "bfloat16": {"target": 3_000_000_000, "draft": 10_000_000,
                                    "total": 3_010_000_000}},
               device={"device": "cpu", "free_bytes": 4_000_000_000,
                       "fits": {"float32": False, "bfloat16": True}},
               runnable=False, notes=["n1", "n2"])
    assert r.text().split("\n") == [
        "target  org/t (revision v1) at /c/t",
        "  qwen3: 3 layers, hidden 32, 4 heads (2 KV, head_dim 8), MLP 72, vocab 61, "
        "1.50B parameters (BF16)",
        "  tokenizer: 59 tokens, ids 0..60",
        "draft   /d",
        "  format speculators (speculators, dflash)",
        "  2 layers, hidden 32, 4 heads (2 KV), vocab 61 (draft vocabulary 40), block size 8, "
        "taps [0, 2], mask token 60, 2.5M parameters (F32)",
        "  vocabulary mapping: d2t [40], t2d [61]",
        "fit",
        "  ok   vocabulary  shared",
        "  FAIL mask token  99 outside",
        "       fix: fix it",
        "weights memory (target + draft)",
        "  float32     6.02 GB (target 6.00 GB + draft 20.0 MB)  does not fit",
        "  bfloat16    3.01 GB (target 3.00 GB + draft 10.0 MB)  fits",
        "  on cpu: 4.00 GB free (weights only: the KV caches need more)",
        "runnable: no",
        "note: n1",
        "note: n2"]


def test_a_target_alone_without_tokenizer_revision_or_device():
    r = Report(_target(source="/m", path="/m", revision=None, tokenizer=None,
                       parameters=999_999),
               None, memory={"float16": {"target": 1_999_998, "total": 1_999_998}},
               runnable=True)
    assert r.text().split("\n") == [
        "target  /m",
        "  qwen3: 3 layers, hidden 32, 4 heads (2 KV, head_dim 8), MLP 72, vocab 61, "
        "1000.0K parameters (BF16)",
        "  tokenizer: none (token-id prompts only)",
        "weights memory (target)",
        "  float16      2.0 MB",
        "runnable: yes"]
    assert r.format is None and r.problems == [] and r.as_dict()["fit"] is None


def test_a_draft_alone_with_an_unknown_free_memory():
    d = _draft(format="dflash2", algorithm=None, draft_vocab=61, vocab_mapping=None,
               source="org/d", path="/c/d", revision="main")
    r = Report(None, d, memory={"float32": {"draft": 10_000_000, "total": 10_000_000}},
               device={"device": "cuda:0", "free_bytes": None, "fits": None},
               notes=["alone"])
    assert r.text().split("\n") == [
        "draft   org/d (revision main) at /c/d",
        "  format dflash2 (DFlash2)",
        "  2 layers, hidden 32, 4 heads (2 KV), vocab 61, block size 8, taps [0, 2], "
        "mask token 60, 2.5M parameters (F32)",
        "weights memory (draft)",
        "  float32     10.0 MB",
        "  on cuda:0: free memory unknown (weights only: the KV caches need more)",
        "note: alone"]
    assert r.format == "dflash2"


def test_a_dflash_v1_draft_without_a_draft_vocabulary():
    lines = Report(None, _draft(format="dflash", algorithm="", draft_vocab=None,
                                vocab_mapping={})).text().split("\n")
    assert lines[1] == "  format dflash (DFlash v1)"
    assert "vocab 61, block size 8" in lines[2] and len(lines) == 3


def test_checks_as_dicts_and_the_first_problem_raised():
    ok, bad1, bad2 = (Check("hidden size", True, "32", "unused"),
                      Check("tap layers", False, "[7] outside", "retrain"),
                      Check("tokenizer", False, "differs", "swap it"))
    assert ok.as_dict() == {"check": "hidden size", "ok": True, "detail": "32"}
    assert bad1.as_dict() == {"check": "tap layers", "ok": False, "detail": "[7] outside",
                              "fix": "retrain"}
    r = Report({"x": 1}, _draft(), checks=[ok, bad1, bad2], runnable=False, notes=["n"])
    assert r.problems == [bad1, bad2]
    with pytest.raises(DraftMismatchError) as info:
        r.raise_for_fit()
    assert str(info.value) == "tap layers: [7] outside; retrain"
    assert r.as_dict() == {"format": "speculators", "target": {"x": 1}, "draft": _draft(),
                           "fit": {"ok": False, "checks": [ok.as_dict(), bad1.as_dict(),
                                                           bad2.as_dict()]},
                           "memory": {}, "device": None, "runnable": False, "notes": ["n"]}
    good = Report(None, None, checks=[ok])
    good.raise_for_fit()
    assert good.as_dict()["fit"] == {"ok": True, "checks": [ok.as_dict()]}
    assert good.text() == "fit\n  ok   hidden size 32"
