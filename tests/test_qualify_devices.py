"""``dflash2rt qualify --devices``: the device list, one qualify process per device (stubbed
here: a fake ``dflash2rt qualify`` writes each report), the merged matrix, and the outliers
named (results only, never timings)."""

from __future__ import annotations

import json
import sys

import pytest

from dflash2rt.errors import InvalidInputError
from dflash2rt.qualify import devices as qd


def test_device_lists():
    assert qd.device_list("all", "cpu") == ["cpu:0"]          # the CPU backend: one device
    assert qd.device_list("cpu:0, cpu:1", None) == ["cpu:0", "cpu:1"]
    assert qd.device_list("0,1", "cuda") == ["cuda:0", "cuda:1"]
    for bad, backend in (("all", None), ("0", None), ("cpu", None), ("cpu:0,cpu:0", None),
                         ("all", "cpu:1"), (",", "cpu")):
        with pytest.raises(InvalidInputError):
            qd.device_list(bad, backend)


def _report(backend: str, verdict: str = "pass", level: str = "pass", tok_s: float = 10.0):
    return {"schema": "dflash2rt-qualify/1", "backend": backend, "complete": True,
            "verdict": {"result": verdict, "reasons": []},
            "sections": {"conformance": {"status": level, "levels": {}},
                         "end_to_end": {"batch1": {"greedy_equal": level == "pass",
                                                   "target_only_tok_s": tok_s}}}}


def test_outliers_name_the_device_that_differs_and_ignore_timings():
    reps = {"cuda:0": _report("cuda:0", tok_s=10), "cuda:1": _report("cuda:1", tok_s=11),
            "cuda:2": _report("cuda:2", "fail", "fail", tok_s=12)}
    out = qd.outliers(reps)
    assert list(out) == ["cuda:2"]
    assert out["cuda:2"]["verdict"] == {"value": "FAIL", "peers": "PASS"} or \
        out["cuda:2"]["verdict"]["value"] != out["cuda:2"]["verdict"]["peers"]
    assert not any("tok/s" in k for k in out["cuda:2"])
    assert qd.outliers({"a:0": _report("a:0", tok_s=1), "a:1": _report("a:1", tok_s=2)}) == {}


FAKE = """
import json, os, sys
args = sys.argv[1:]
dev, out = args[args.index("--backend") + 1], args[args.index("--out") + 1]
bad = dev == os.environ.get("FAKE_BAD")
rep = {"schema": "dflash2rt-qualify/1", "backend": dev, "complete": True,
       "verdict": {"result": "fail" if bad else "pass", "reasons": []},
       "sections": {"conformance": {"status": "fail" if bad else "pass", "levels": {}}}}
open(os.path.join(out, "report.json"), "w").write(json.dumps(rep))
print("fake qualify", dev, args)
sys.exit(1 if bad else 0)
"""


def test_qualify_devices_runs_one_process_per_device_and_merges(tmp_path, monkeypatch):
    fake = tmp_path / "fake.py"
    fake.write_text(FAKE)
    real = qd.subprocess.Popen

    def popen(cmd, **kw):       # "python -m dflash2rt qualify ..." → the fake
        i = cmd.index("qualify")
        return real([sys.executable, str(fake), *cmd[i + 1:]], **kw)
    monkeypatch.setattr(qd.subprocess, "Popen", popen)
    monkeypatch.setenv("FAKE_BAD", "cpu:1")
    s = qd.qualify_devices(["cpu:0", "cpu:1", "cpu:2"], tmp_path / "out", ["--quick"],
                           log=lambda m: None, timeout_s=60)
    assert s["exit_codes"] == {"cpu:0": 0, "cpu:1": 1, "cpu:2": 0}
    assert s["verdicts"] == {"cpu:0": "pass", "cpu:1": "fail", "cpu:2": "pass"}
    assert list(s["outliers"]) == ["cpu:1"]
    for d in ("cpu-0", "cpu-1", "cpu-2"):
        assert (tmp_path / "out" / d / "report.json").is_file()
        assert "--quick" in (tmp_path / "out" / d / "qualify.log").read_text()
    matrix = json.loads((tmp_path / "out" / "matrix.json").read_text())
    assert matrix["backends"] == ["cpu:0", "cpu:1", "cpu:2"]
    assert json.loads((tmp_path / "out" / "devices.json").read_text())["outliers"]
    lines = qd.summary_lines(s)
    assert any(line.startswith("cpu:1 differs from its peers") for line in lines)
