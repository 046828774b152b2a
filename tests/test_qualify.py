"""``dflash2rt qualify --quick`` writes report.json (schema-valid), junit.xml and report.html
with its plots; ``dflash2rt report merge`` builds the cross-backend matrix."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from importlib import resources

import pytest
import torch

from tiny_models import save_pair_dir, tiny_pair


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("qualify")
    model = save_pair_dir(root / "model", tiny_pair(dtype=torch.float32))
    (model / "heldout_prompts.json").write_text(json.dumps(["def f(x):", "import os", "x = 1",
                                                            "class a:"]))
    out = root / "cpu"
    proc = subprocess.run([sys.executable, "-m", "dflash2rt", "qualify", "--backend", "cpu",
                           "--quick", "--model", str(model), "--out", str(out),
                           # the conformance lanes of CI run the whole suite: here L0-L1 show
                           # the section's place in the report, L2-L4 "not selected"
                           "--conformance-select", "L0 or L1"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "[5/5] block_sweep" in proc.stderr          # the progress display
    return out


@pytest.mark.slow
def test_report_json_matches_schema(report_dir):
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is a dev dependency")
    schema = json.loads(resources.files("dflash2rt.qualify").joinpath(
        "report.schema.json").read_text())
    report = json.loads((report_dir / "report.json").read_text())
    jsonschema.validate(report, schema)
    assert report["complete"] and report["sections"]["conformance"]["status"] == "pass"
    assert report["sections"]["graphs"]["applicable"] is False


@pytest.mark.slow
def test_end_to_end_has_every_temperature_and_the_step_split(report_dir):
    """qualify reports batch 1 and 4 at T = 0, 0.7 / top-p 0.95 and 1 with every contender,
    greedy spec == target-only at T = 0, and the synced split (--quick: the fixed block)."""
    e2e = json.loads((report_dir / "report.json").read_text())["sections"]["end_to_end"]
    assert [(r["temperature"], r["batch"]) for r in e2e["rows"]] == [
        (t, b) for b in (1, 4) for t in ("T=0", "T=0.7 top-p 0.95", "T=1")]
    for r in e2e["rows"]:
        assert set(r["contenders"]) == {"target_only", "fixed", "adaptive"}
        assert r["greedy_equal"] is (True if r["temperature_value"] == 0 else None)
    prof = e2e["step_profile"]
    assert {x["contender"] for x in prof["rows"]} == {"fixed"} and len(prof["rows"]) == 6
    assert len(prof["sampled_over_greedy"]) == 4
    assert "Per-step cost split" in (report_dir / "report.html").read_text()


@pytest.mark.slow
def test_junit_parses_with_properties(report_dir):
    root = ET.parse(report_dir / "junit.xml").getroot()
    suites = [root] if root.tag == "testsuite" else list(root)
    tests = sum(int(s.get("tests", 0)) for s in suites)
    failures = sum(int(s.get("failures", 0)) + int(s.get("errors", 0)) for s in suites)
    assert tests > 10 and failures == 0
    props = {p.get("name") for p in root.iter("property")}
    assert any("device" in p for p in props), props


@pytest.mark.slow
def test_html_is_self_contained_with_plots(report_dir):
    html = (report_dir / "report.html").read_text()
    assert html.count("<svg") >= 3
    for title in ("tau and speedup vs block size", "op error vs tolerance", "latency breakdown"):
        assert title in html
    assert "<script src" not in html and "<link" not in html
    assert "L2-L4 sizes: full" in html                # the conformance sizes are named
    # the first screen (verdict, levels, implementation, speed) comes before the raw tables
    order = [html.index(f'id="{k}"') for k in ("verdict", "levels", "implementation", "speed",
                                               "block-size", "system")]
    assert order == sorted(order) and "\\u03" not in html


@pytest.mark.slow
def test_merge_builds_the_matrix_and_highlights_differences(report_dir, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    report = json.loads((report_dir / "report.json").read_text())
    report["backend"] = "triton-interpret"
    report["sections"]["block_sweep"]["recommended_block_size"] = 99
    report["sections"]["conformance"]["environment"]["dflash2rt.sizes"] = "small (γ=2)"
    (other / "report.json").write_text(json.dumps(report))
    out = tmp_path / "matrix"
    proc = subprocess.run([sys.executable, "-m", "dflash2rt", "report", "merge",
                           str(report_dir), str(other), "--out", str(out)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    matrix = json.loads((out / "matrix.json").read_text())
    assert matrix["backends"] == ["cpu", "triton-interpret"]
    rows = {r["check"]: r for r in matrix["rows"]}
    assert rows["recommended block size"]["differs"] and not rows["conformance"]["differs"]
    assert rows["conformance L2-L4 sizes"]["differs"]
    md = (out / "matrix.md").read_text(encoding="utf-8")
    assert "**recommended block size**" in md
    assert md.index("## Verdict per backend") < md.index("## All checks")
    assert "| cpu |" in md and "| triton-interpret |" in md
    assert 'class="diff"' in (out / "matrix.html").read_text()


def test_conformance_small_reaches_the_suite(monkeypatch, tmp_path):
    """qualify --conformance-small runs the suite with --dflash2rt-small (the interpreter lane)."""
    from dflash2rt.qualify import conformance

    seen = []

    def fake_run(cmd, **kw):
        seen.append(cmd)
        return subprocess.CompletedProcess(cmd, 5, "", "no tests")
    monkeypatch.setattr(conformance.subprocess, "run", fake_run)
    for small in (False, True):
        conformance.run_conformance("cpu", tmp_path, True, "L2", small=small)
    assert ["--dflash2rt-small" in c for c in seen] == [False, True]
    assert all(c[c.index("-k") + 1] == "L2" and "--dflash2rt-quick" in c for c in seen)
