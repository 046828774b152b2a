"""The conformance graphs level needs proof of replay (pytester, fake graph adapters on CPU):
a refused capture fails it naming the refusal, a replay that differs from eager is caught by
the runner's post-capture check and fails it naming the bucket, correct graphs pass with
per-test replay counts in the report."""

from __future__ import annotations

import json

import pytest

from fixture_graphs import install_graph_backend

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.slow          # each test runs the conformance suite in a subprocess

TESTS = ("across_buckets", "after_pool_reuse", "mixed_greedy_and_sampled", "target_only",
         "kept_graphs", "watermarked_replay")


@pytest.fixture
def graphs_level(pytester, monkeypatch, tmp_path):
    """Run the graphs level (no second stream on CPU) on fixture backend ``graphs-MODE``;
    returns (exit code, output, JSON report)."""
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    monkeypatch.setenv("PYTHONPATH", str(plugins))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.delenv("DFLASH2RT_BACKEND", raising=False)

    def run(mode):
        name = install_graph_backend(plugins, mode)
        js = tmp_path / f"{mode}.json"
        res = pytester.runpytest_subprocess(
            "--pyargs", "dflash2rt_conformance", "-p", "no:cacheprovider",
            "--dflash2rt-backend", name, "-k", "graphs and not stream",
            f"--dflash2rt-json={js}")
        return res.ret, res.stdout.str(), json.loads(js.read_text())
    return run


def test_correct_graphs_pass_with_replay_counts(graphs_level):
    ret, out, rep = graphs_level("replay")
    assert ret == 0 and f"{len(TESTS)} passed" in out, out[-3000:]
    level = rep["levels"]["graphs"]
    assert level["result"] == "pass" and level["passed"] == len(TESTS)
    counts = {k: v for k, v in level["metrics"].items() if k.startswith("replays in ")}
    assert len(counts) == len(TESTS) and all(any(t in k for k in counts) for t in TESTS), counts
    for name, c in counts.items():
        assert c["total"] > 0 and c["total"] == sum(v for k, v in c.items() if k != "total")
    buckets = counts["replays in test_replay_equals_eager_across_buckets"]
    assert buckets["draft greedy @1"] > 0 and buckets["verify greedy @1"] > 0, buckets
    for size in (2, 4, 8, 16, 32):                   # odd requests sample: mixed batches
        assert buckets[f"draft sampled @{size}"] > 0, buckets
        assert buckets[f"verify sampled @{size}"] > 0, buckets
    assert any(k.startswith("target-only") for k in counts[
        "replays in test_target_only_replay_equals_eager"])
    marked = counts["replays in test_watermarked_replay_equals_eager"]
    for graph in ("draft sampled watermarked", "verify sampled watermarked",
                  "target-only sampled watermarked"):
        assert any(k.startswith(graph) for k in marked), marked


def test_refused_capture_fails_the_level_naming_the_refusal(graphs_level):
    """Before: a refused capture ran eagerly and every test compared eager with eager."""
    ret, out, rep = graphs_level("refuse")
    assert ret == 1, out[-3000:]
    assert f"{len(TESTS)} failed" in out, out[-3000:]
    assert "graph mode did not replay every bucket it used" in out
    assert "fake-graph: capture refused by the fixture driver" in out
    assert "[graphs case=bucket-1]" in out and "[graphs case=kept-3x10-spec]" in out
    level = rep["levels"]["graphs"]
    assert level["result"] == "fail" and level["failed"] == len(TESTS)
    assert all("capture refused" in t.get("message", "") for t in level["tests"])


def test_replay_differing_from_eager_is_caught_after_capture(graphs_level):
    """The fake replay computes a wrong argmax: the post-capture check catches it (outputs stay
    the eager ones), reports the fallback, and the level fails because the bucket did not
    replay."""
    ret, out, rep = graphs_level("differ")
    assert ret == 1, out[-3000:]
    assert "graph replay of bucket 1 (draft greedy) differed from eager: draft: " in out, \
        out[-3000:]
    assert "differs from eager" not in out          # tokens equal: the bad bucket ran eagerly
    level = rep["levels"]["graphs"]
    assert level["result"] == "fail" and level["failed"] >= 4
