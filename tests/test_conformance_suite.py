"""The conformance suite tested with pytester: its header, its reports, its CLI, and that each
seeded mutation in an out-of-tree backend makes it fail with a message naming level and case."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from fixture_dists import install, install_mutant

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.slow          # each test runs pytest (the conformance suite) in a subprocess

# The mutant backends (tests/fixtures/mutants/) that the expected failures below name.
MUTANTS = ("shared-noise", "off-by-one", "le-accept", "onehot-q")


@pytest.fixture
def suite(pytester, monkeypatch, tmp_path):
    """Run ``pytest --pyargs dflash2rt_conformance ARGS`` in a subprocess, with the mutant
    backends installed on PYTHONPATH."""
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    for mutant in MUTANTS:
        install_mutant(plugins, mutant, "suite")
    monkeypatch.setenv("PYTHONPATH", str(plugins))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.delenv("DFLASH2RT_BACKEND", raising=False)

    def run(*args):
        return pytester.runpytest_subprocess("--pyargs", "dflash2rt_conformance",
                                             "-p", "no:cacheprovider", *args)
    return run


def test_unknown_backend_fails_with_the_registry_reason(suite):
    res = suite("--dflash2rt-backend", "nope", "--dflash2rt-quick", "-k", "noise")
    assert res.ret != 0
    res.stdout.fnmatch_lines(["*UnknownBackendError: unknown backend 'nope'*"])


def test_cpu_run_header_and_junit_json_markdown_reports(suite, tmp_path):
    junit, js, md = tmp_path / "r.xml", tmp_path / "r.json", tmp_path / "r.md"
    res = suite("--dflash2rt-backend", "cpu", "--dflash2rt-quick",
                "-k", "noise or verify or L2 or graphs",
                f"--junitxml={junit}", f"--dflash2rt-json={js}", f"--dflash2rt-markdown={md}")
    out = res.stdout.str()
    assert res.ret == 0, out[-3000:]
    assert "dflash2rt conformance — backends (registry):" in out
    assert "mut-off-by-one" in out and "fixture_mut_off_by_one 1.0" in out
    assert "selected: cpu (explicit); device cpu (" in out
    assert "versions: torch" in out and "numpy" in out and "triton" in out
    assert "plugin dflash2rt 0.1.0" in out
    props = {p.get("name"): p.get("value")
             for p in ET.parse(junit).getroot().iter("property")}
    for key in ("device", "driver", "runtime", "torch", "triton", "numpy", "git.commit",
                "plugin.distribution", "plugin.version", "dflash2rt.backend"):
        assert props.get(key), f"JUnit property {key} missing"
    assert props["dflash2rt.backend"] == "cpu" and props["plugin.distribution"] == "dflash2rt"
    rep = json.loads(js.read_text())
    assert rep["result"] == "pass" and rep["environment"]["dflash2rt.backend"] == "cpu"
    ops = {(o["op"], o["dtype"]): o for o in rep["ops"]}
    assert ops[("noise.walk", "float32")]["kind"] == "exact"
    assert ops[("verify.tokens", "bfloat16")]["passed"]
    assert rep["levels"]["L1"]["result"] == "pass" and rep["levels"]["L2"]["result"] == "pass"
    assert rep["levels"]["graphs"]["skipped"] == 7
    assert any(k.startswith("TV backend vs reference") for k in rep["levels"]["L2"]["metrics"])
    assert md.read_text().startswith("# dflash2rt conformance: backend `cpu` — **PASS**")


# The cases the expected failures name: the L1 verify / select cases and L3's joint law
# (L3's processor, constraint and adaptive suites are mutation-tested on their own).
SELECT = "(L1 and (verify or select)) or test_l3_joint_law"


@pytest.mark.parametrize("mutant,expected", [
    ("shared-noise", ["[L1 verify case=mixed_v37", "[L3 joint law case=V4-g3-K3-L4"]),
    ("off-by-one", ["[L1 verify case=", "[L3 joint law case=V4-g3-K3-L4"]),
    ("le-accept", ["[L1 verify case=u_at_threshold", "[L1 verify case=p_zero_u_to_0"]),
    ("onehot-q", ["[L1 select case=mixed_v37_k8_r6", "[L3 joint law case=V4-g3-K3-L4"]),
])
def test_each_mutation_fails_naming_level_and_case(suite, mutant, expected):
    res = suite("--dflash2rt-backend", f"mut-{mutant}", "--dflash2rt-quick", "-k", SELECT)
    out = res.stdout.str()
    assert res.ret == 1, out[-3000:]
    for text in expected:
        assert text in out, f"{mutant}: {text!r} not in the failure output\n{out[-4000:]}"


@pytest.mark.parametrize("mutant", ["shared-noise", "off-by-one", "onehot-q"])
def test_small_sizes_still_fail_each_lattice_mutation(suite, mutant):
    """--dflash2rt-small (the triton-interpret lane): L3's γ = 2 deduplicated lattice still
    fails every mutation that the full L3 catches, and the header names the sizes."""
    res = suite("--dflash2rt-backend", f"mut-{mutant}", "--dflash2rt-quick", "--dflash2rt-small",
                "-k", "L3")
    out = res.stdout.str()
    assert res.ret == 1, out[-3000:]
    assert "L2-L4 sizes: small (L2 quarter γ=2" in out, out[:3000]
    assert "[L3 joint law case=V4-g2-K3-L2" in out, f"{mutant}\n{out[-4000:]}"


def test_small_sizes_pass_on_cpu_and_are_reported(suite, tmp_path):
    js, md = tmp_path / "r.json", tmp_path / "r.md"
    res = suite("--dflash2rt-backend", "cpu", "--dflash2rt-quick", "--dflash2rt-small", "-k",
                "L2 or L3", f"--dflash2rt-json={js}", f"--dflash2rt-markdown={md}")
    assert res.ret == 0, res.stdout.str()[-3000:]
    rep = json.loads(js.read_text())
    assert rep["environment"]["dflash2rt.sizes"].startswith("small (")
    # L3: 8 joint-law cases, 10 with logit processors and min-p (5 × sampled / greedy),
    # 4 constraints (unmasked / masked draft side × sampled / greedy), 4 reduced draft
    # vocabularies (2 joint laws × sampled / greedy); L2: 3, and 2 reduced-vocabulary
    # proposal laws
    assert rep["levels"]["L2"]["passed"] == 5 and rep["levels"]["L3"]["passed"] == 28
    assert "TV sampled V4-g2-K3-L2-s1 float32" in rep["levels"]["L3"]["metrics"]
    assert "L2-L4 sizes: small (" in md.read_text()


def test_cli_runs_the_suite_and_a_broken_command_plugin_is_not_fatal(tmp_path):
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    install(plugins, "commands/broken_command.py", "broken-cmd", group="dflash2rt.commands")
    env = {**os.environ, "PYTHONPATH": str(plugins), "OMP_NUM_THREADS": "1"}
    env.pop("DFLASH2RT_BACKEND", None)
    js = tmp_path / "cli.json"
    out = subprocess.run([sys.executable, "-m", "dflash2rt", "conformance", "--backend", "cpu",
                          "--quick", "-k", "noise", "--json", str(js)], capture_output=True,
                         text=True, env=env, cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "command plugin 'broken-cmd'" in out.stderr and "boom" in out.stderr
    assert json.loads(js.read_text())["levels"]["L1"]["passed"] > 0


def test_plugin_is_inert_outside_the_suite(pytester):
    pytester.makepyfile("def test_x():\n    assert True\n")
    res = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    assert res.ret == 0
    assert "dflash2rt conformance" not in res.stdout.str()


@pytest.mark.parametrize("stale", [False, True])
def test_graph_conformance_with_fake_graphs(pytester, monkeypatch, tmp_path, stale):
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    name = "stale-graphs" if stale else "fake-graphs"
    install(plugins, "backends/fake_graphs.py", name, params={"name": name, "stale": stale})
    monkeypatch.setenv("PYTHONPATH", str(plugins))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    res = pytester.runpytest_subprocess("--pyargs", "dflash2rt_conformance", "-p",
                                        "no:cacheprovider", "--dflash2rt-backend", name,
                                        "-k", "graphs and not stream")
    out = res.stdout.str()
    if stale:
        assert res.ret == 1 and "[graphs case=" in out, out[-3000:]
    else:
        assert res.ret == 0 and "6 passed" in out, out[-3000:]
