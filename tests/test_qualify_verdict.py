"""``dflash2rt qualify`` passes only when conformance ran and passed: report.json carries a
top-level "verdict" and the command exits non-zero otherwise."""

from __future__ import annotations

import argparse
import json

import pytest

from dflash2rt.cli.qualify_cmd import run_qualify
from dflash2rt.qualify import run as qrun
from dflash2rt.qualify.conformance import run_conformance


def _report(conformance: dict | None, complete: bool = True, **sections) -> dict:
    secs = {} if conformance is None else {"conformance": conformance}
    return {"sections": {**secs, **sections}, "complete": complete}


@pytest.mark.parametrize("conformance,complete,want", [
    ({"status": "pass"}, True, []),
    ({"status": "fail", "reasons": ["L1: 2 test(s) failed"]}, True, ["conformance: L1: 2 test"]),
    ({"status": "not run", "reason": "dflash2rt-conformance is not installed"}, True,
     ["conformance did not run (not run): dflash2rt-conformance is not installed"]),
    ({"status": "error", "reason": "Traceback ..."}, True, ["conformance did not run (error)"]),
    ({"status": "timeout", "reason": "ran past 900 s"}, True, ["conformance did not run (tim"]),
    (None, False, ["conformance did not run (the qualification stopped before it)",
                   "the qualification did not complete"]),
    ({"status": "pass"}, False, ["the qualification did not complete"]),
])
def test_verdict_needs_a_conformance_pass(conformance, complete, want):
    v = qrun.verdict(_report(conformance, complete))
    assert v["result"] == ("pass" if not want else "fail")
    assert len(v["reasons"]) == len(want)
    for reason, prefix in zip(v["reasons"], want):
        assert reason.startswith(prefix), v["reasons"]


def test_a_failed_section_fails_the_verdict():
    v = qrun.verdict(_report({"status": "pass"}, op_microbench={"status": "error",
                                                                 "error": "RuntimeError: x"}))
    assert v == {"result": "fail", "reasons": ["section op_microbench: error RuntimeError: x"]}


@pytest.mark.slow
def test_conformance_that_executes_nothing_fails_the_qualification(tmp_path, monkeypatch):
    """A real suite run whose selection leaves nothing: pytest alone exits 5 and the old
    qualify copied "pass"; now the conformance section fails and so does the verdict."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setattr(qrun.html, "render", lambda report: "")   # the page is not under test
    q = qrun.Qualification("cpu", tmp_path, "unused", True, lambda m: None,
                           conformance_select="no_test_has_this_name")
    q.section(1, 1, "conformance", lambda: run_conformance("cpu", tmp_path, True,
                                                           "no_test_has_this_name"))
    conf = q.report["sections"]["conformance"]
    assert conf["status"] == "fail" and conf["exit_code"] != 0
    assert any("no conformance level executed a test" in r for r in conf["reasons"])
    saved = json.loads((tmp_path / "report.json").read_text())
    assert saved["verdict"]["result"] == "fail"
    assert any(r.startswith("conformance: no conformance level executed a test")
               for r in saved["verdict"]["reasons"]), saved["verdict"]


@pytest.mark.parametrize("status,code", [("pass", 0), ("fail", 1), ("not run", 1)])
def test_qualify_exits_non_zero_unless_the_verdict_passes(monkeypatch, status, code):
    def fake(backend, out, model, quick, **kw):
        conf = {"status": status, "reason": "dflash2rt-conformance is not installed",
                "reasons": ["L2: nothing executed"]}
        report = _report(conf)
        report["verdict"] = qrun.verdict(report)
        return report

    monkeypatch.setattr(qrun, "qualify", fake)
    args = argparse.Namespace(backend="cpu", out="unused", model="m", quick=True,
                              conformance_select=None, conformance_small=False,
                              allow_fallback=False, devices=None)
    assert run_qualify(args) == code
