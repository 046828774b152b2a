"""Conformance verdicts need evidence: a suite module that fails to import, a level that only
skipped, a refused kernel fallback, an L4 model that cannot be loaded and a qualification whose
conformance failed or did not run all exit non-zero with the reason in every report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from fixture_dists import install

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.slow          # each test runs the conformance suite in a subprocess
# name → (tests/fixtures/ file, entry-point group): a backend that declares only float16 (no L1
# op case uses it), a GPU-style backend whose Triton kernels fail to build inside
# plugin_kit.gpu_backend, a pytest plugin that makes one suite module raise at import, and one
# that makes the bundled pair fail to load.
FIXTURES = {"f16-only": ("backends/float16_only.py", "dflash2rt.backends"),
            "nokernels": ("backends/no_kernels.py", "dflash2rt.backends"),
            "broken-suite": ("pytest_plugins/broken_suite.py", "pytest11"),
            "broken-bundled": ("pytest_plugins/broken_bundled.py", "pytest11")}


@pytest.fixture
def plugins(tmp_path, monkeypatch):
    """install(*names) puts those fixture distributions on PYTHONPATH for the subprocesses."""
    root = tmp_path / "plugins"
    root.mkdir()
    monkeypatch.setenv("PYTHONPATH", str(root))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.delenv("DFLASH2RT_BACKEND", raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)    # let gpu_backend try its kernels

    def add(*names):
        for name in names:
            fixture, group = FIXTURES[name]
            install(root, fixture, name, group=group)
    return add


def cli(tmp_path, *args) -> tuple[subprocess.CompletedProcess, dict, str, ET.Element]:
    """``dflash2rt conformance ARGS`` with every report; → (process, JSON, Markdown, JUnit)."""
    js, md, xml = tmp_path / "r.json", tmp_path / "r.md", tmp_path / "r.xml"
    proc = subprocess.run([sys.executable, "-m", "dflash2rt", "conformance", *args, "--json",
                           str(js), "--markdown", str(md), "--junit", str(xml)],
                          capture_output=True, text=True, cwd=tmp_path, env=dict(os.environ),
                          timeout=600)
    return proc, json.loads(js.read_text()), md.read_text(), ET.parse(xml).getroot()


def props(junit: ET.Element) -> dict[str, str]:
    return {p.get("name"): p.get("value") for p in junit.iter("property")}


def verdict_case(junit: ET.Element) -> ET.Element:
    return next(c for c in junit.iter("testcase") if c.get("name") == "verdict")


def test_a_suite_module_that_raises_at_import_fails_every_report(plugins, tmp_path):
    plugins("broken-suite")
    proc, rep, md, junit = cli(tmp_path, "--backend", "cpu", "--quick", "-k", "L0 or noise")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert rep["result"] == "fail"
    err = next(e for e in rep["errors"] if e["phase"] == "collect")
    assert err["where"].endswith("test_l3_joint_law.py") and err["level"] == "L3"
    assert "planted: this suite module raises at import" in err["message"]
    assert any("collection error in" in r and "planted" in r for r in rep["reasons"])
    assert rep["levels"]["L3"]["result"] == "fail"          # not "not selected"
    assert rep["levels"]["L0"]["result"] == "pass"          # the other modules still ran
    assert md.startswith("# dflash2rt conformance: backend `cpu` — **FAIL**")
    assert "planted: this suite module raises at import" in md
    assert props(junit)["dflash2rt.result"] == "fail"
    assert "planted" in props(junit)["dflash2rt.reasons"]
    errors = [e.get("message", "") + (e.text or "") for e in junit.iter("error")]
    assert any("planted" in e for e in errors), errors            # pytest's own collect error
    assert verdict_case(junit).find("failure") is not None
    assert "verdict: FAIL" in out and "collection error in" in out


def test_plain_pytest_stopped_by_a_collection_error_reports_fail(plugins, pytester, tmp_path):
    """Without --continue-on-collection-errors pytest runs nothing: every report says FAIL."""
    plugins("broken-suite")
    js = tmp_path / "p.json"
    res = pytester.runpytest_subprocess("--pyargs", "dflash2rt_conformance", "-p",
                                        "no:cacheprovider", "--dflash2rt-backend", "cpu",
                                        "--dflash2rt-quick", "-k", "noise",
                                        f"--dflash2rt-json={js}")
    assert res.ret != 0
    rep = json.loads(js.read_text())
    assert rep["result"] == "fail" and rep["levels"]["L1"]["executed"] == 0
    assert any("interrupted" in r for r in rep["reasons"]), rep["reasons"]
    res.stdout.fnmatch_lines(["verdict: FAIL*", "*collection error in *test_l3_joint_law.py*"])


@pytest.mark.parametrize("select,why", [
    ("L1 and test_op and verify", "nothing executed: "),
    ("L1 and verify", "none of the "),
])
def test_a_level_that_only_skipped_fails(plugins, pytester, tmp_path, select, why):
    """A backend declaring only float16 (no L1 op case uses it): pytest alone would pass."""
    plugins("f16-only")
    js, md = tmp_path / "s.json", tmp_path / "s.md"
    res = pytester.runpytest_subprocess("--pyargs", "dflash2rt_conformance", "-p",
                                        "no:cacheprovider", "--dflash2rt-backend", "f16-only",
                                        "-k", select, f"--dflash2rt-json={js}",
                                        f"--dflash2rt-markdown={md}")
    out = res.stdout.str()
    assert res.ret == 1, out[-3000:]
    rep = json.loads(js.read_text())
    l1 = rep["levels"]["L1"]
    assert l1["result"] == "fail" and l1["skipped"] == l1["dtype_skipped"] > 0
    assert any(why in r for r in l1["reasons"]), l1["reasons"]
    assert any(r.startswith("L1: " + why) for r in rep["reasons"])
    assert rep["levels"]["L2"]["result"] == "not selected"
    assert "**FAIL**" in md.read_text() and why in md.read_text()
    assert "verdict: FAIL" in out


def test_a_gpu_backend_whose_kernels_fell_back_fails_unless_allowed(plugins, tmp_path):
    plugins("nokernels")
    proc, rep, md, junit = cli(tmp_path, "--backend", "nokernels", "--quick", "-k", "noise")
    assert proc.returncode != 0, (proc.stdout + proc.stderr)[-3000:]
    impl = rep["implementation"]
    assert impl["ops"]["verify"] == "torch ops" and impl["graphs"] == "none"
    assert "fixture: the Triton kernels failed to build" in impl["kernel_fallbacks"][0]
    assert any("triton kernels unavailable" in f for f in impl["fallbacks"])
    assert "REFUSED" in impl["kernels"] and impl["allow_fallback"] is False
    assert rep["levels"]["L1"]["result"] == "pass"        # the ops themselves are right
    assert any("asked for by name but its kernels fell back" in r for r in rep["reasons"])
    assert "**FAIL**" in md and "triton kernels unavailable" in md
    assert "triton kernels unavailable" in props(junit)["dflash2rt.fallbacks"]
    assert props(junit)["dflash2rt.op.verify"] == "torch ops"

    proc, rep, md, junit = cli(tmp_path, "--backend", "nokernels", "--quick", "-k", "noise",
                               "--allow-fallback")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    impl = rep["implementation"]
    assert rep["result"] == "pass" and rep["reasons"] == [] and impl["allow_fallback"]
    assert impl["kernels"].startswith("torch ops") and \
        "fallback allowed by --allow-fallback" in impl["kernels"]
    assert "**PASS**" in md and "torch ops" in md and "fallback allowed by --allow-fallback" in md
    assert "fallback allowed" in props(junit)["dflash2rt.implementation"]
    assert "implementation: torch ops" in proc.stdout and "fallback allowed" in proc.stdout


def test_l4_fails_when_the_installed_bundled_pair_cannot_be_loaded(plugins, pytester, tmp_path):
    plugins("broken-bundled")
    js = tmp_path / "l4.json"
    res = pytester.runpytest_subprocess("--pyargs", "dflash2rt_conformance", "-p",
                                        "no:cacheprovider", "--dflash2rt-backend", "cpu",
                                        "-k", "L4 and greedy", f"--dflash2rt-json={js}")
    assert res.ret != 0
    rep = json.loads(js.read_text())
    assert rep["levels"]["L4"]["result"] == "fail" and rep["levels"]["L4"]["errors"] == 2
    assert any("planted: the bundled safetensors are truncated" in r and "cannot be loaded" in r
               for r in rep["reasons"]), rep["reasons"]
    assert rep["environment"]["dflash2rt.l4_model"] == "bundled 'stdlib-code'"
