"""``dflash2rt qualify --devices`` against hand-written expectations, with a stand-in registry,
stand-in processes (no subprocess runs) and a scripted clock: the device lists and their
refusals, the outliers with and without a majority, the thread share of CPU runs, the wait
and its timeout, the summary and its lines."""

from __future__ import annotations

import json
import subprocess
import sys
import types

import pytest

from dflash2rt.errors import InvalidInputError
from dflash2rt.qualify import devices as qd

NS = types.SimpleNamespace


def _registry(available: bool = True, count=None, indexed: bool = True, reason: str = ""):
    details = {} if count is None else {"device_count": count}
    probe = NS(available=available, reason=reason, details=details)
    spec = NS(probe_device=(lambda i: None) if indexed else None)
    return NS(entry=lambda name: NS(spec=spec), probe=lambda name: probe)


@pytest.mark.parametrize("count, want", [("3", ["gpu:0", "gpu:1", "gpu:2"]), ("1", ["gpu:0"]),
                                         ("", ["gpu:0"]), (None, ["gpu:0"])])
def test_all_is_every_device_the_probe_counts(count, want):
    assert qd.device_list(" all ", "gpu", _registry(count=count)) == want


def test_all_on_a_backend_without_device_indices_is_the_backend_itself():
    assert qd.device_list("all", "host", _registry(count="4", indexed=False)) == ["host"]


def test_all_on_a_backend_that_is_not_available_is_refused_with_its_reason():
    with pytest.raises(InvalidInputError) as e:
        qd.device_list("all", "gpu", _registry(available=False, reason="no driver"))
    assert str(e.value) == "backend 'gpu' is not available here: no driver"


@pytest.mark.parametrize("devices, backend, want", [
    ("gpu:0,,gpu:2, ", None, ["gpu:0", "gpu:2"]), ("1, 3", "gpu", ["gpu:1", "gpu:3"]),
    ("2", "gpu:7", ["gpu:2"]), ("0,gpu:1", "gpu", ["gpu:0", "gpu:1"]),
    ("a:b:1", None, ["a:b:1"])])
def test_lists_of_devices(devices, backend, want):
    assert qd.device_list(devices, backend) == want


@pytest.mark.parametrize("devices, backend, message", [
    ("all", None, "--devices all needs --backend NAME"),
    ("all", "gpu:1", "--devices all takes a backend name without an index, got 'gpu:1'"),
    ("0", None, "--devices 0: a bare index needs --backend NAME"),
    ("gpu", "gpu", "--devices: 'gpu' is not NAME:INDEX or an index"),
    (" , ", "gpu", "--devices names no device"),
    ("gpu:0,0", "gpu", "--devices names a device twice: gpu:0,0")])
def test_refused_lists_say_why(devices, backend, message):
    with pytest.raises(InvalidInputError) as e:
        qd.device_list(devices, backend, _registry(count="2"))
    assert str(e.value) == message


# ---- outliers ------------------------------------------------------------------------------

def _report(conformance: str = "pass", greedy=True, tok_s: float = 10.0, device: str = "d",
            commit: str = "c", block: int = 4) -> dict:
    return {"complete": True, "verdict": {"result": "pass"},
            "system": {"device": device, "commit": commit},
            "sections": {"conformance": {"status": conformance},
                         "end_to_end": {"batch1": {"greedy_equal": greedy,
                                                   "target_only_tokens_per_s": tok_s,
                                                   "spec_tokens_per_s": 2 * tok_s,
                                                   "tau": tok_s / 4}},
                         "block_sweep": {"recommended_block_size": block}}}


def _named(reps: dict, key: str = "conformance") -> dict:
    return {d: diffs[key] for d, diffs in qd.outliers(reps).items()}


def test_the_majority_is_the_peers_value():
    reps = {"g:0": _report(), "g:1": _report("fail"), "g:2": _report()}
    assert qd.outliers(reps) == {"g:1": {"conformance": {"value": "fail", "peers": "pass"}}}
    reps = {"g:0": _report("fail"), "g:1": _report(), "g:2": _report(), "g:3": _report("x")}
    assert _named(reps) == {"g:0": {"value": "fail", "peers": "pass"},
                            "g:3": {"value": "x", "peers": "pass"}}


@pytest.mark.parametrize("values, named", [
    (("pass", "fail"), {"g:1": "fail"}), (("fail", "pass"), {"g:1": "pass"}),
    (("pass", "fail", "fail", "pass"), {"g:1": "fail", "g:2": "fail"}),
    (("a", "b", "c"), {"g:1": "b", "g:2": "c"})])
def test_without_a_majority_the_first_device_is_the_peer(values, named):
    reps = {f"g:{i}": _report(v) for i, v in enumerate(values)}
    assert _named(reps) == {d: {"value": v, "peers": values[0]} for d, v in named.items()}


def test_timings_the_chosen_block_size_device_and_commit_never_make_an_outlier():
    reps = {"g:0": _report(tok_s=10.0, device="A", commit="1", block=4),
            "g:1": _report(tok_s=12.0, device="B", commit="2", block=8),
            "g:2": _report(tok_s=14.0, device="C", commit="3", block=16)}
    assert qd.outliers(reps) == {}


def test_equality_checks_are_results():
    reps = {"g:0": _report(greedy=True), "g:1": _report(greedy=False),
            "g:2": _report(greedy=True)}
    assert qd.outliers(reps) == {
        "g:1": {"greedy spec == target-only": {"value": False, "peers": True}}}


# ---- processes -----------------------------------------------------------------------------

class Proc:
    """A stand-in ``subprocess.Popen``: writes its device's report (unless told not to) and
    exits with its script's code, or runs past every wait when ``hang`` (``stubborn``: past
    the terminate too)."""

    made: list["Proc"] = []
    script: dict[str, dict] = {}

    def __init__(self, cmd, stdout=None, stderr=None, env=None) -> None:
        self.cmd, self.env, self.stdout = cmd, env, stdout
        self.dev, out = cmd[cmd.index("--backend") + 1], cmd[cmd.index("--out") + 1]
        self.do = self.script.get(self.dev, {})
        self.pid, self.waits, self.signals = 4000 + len(self.made), [], []
        self.returncode = None
        if "verdict" in self.do:
            rep = {"complete": True, "sections": {"conformance": {"status": self.do["conf"]}}}
            if self.do["verdict"]:
                rep["verdict"] = {"result": self.do["verdict"]}
            with open(f"{out}/report.json", "w", encoding="utf-8") as f:
                json.dump(rep, f)
        self.made.append(self)

    def wait(self, timeout=None):
        self.waits.append(timeout)
        if self.do.get("hang") and not (self.signals and not self.do.get("stubborn")) and \
                "kill" not in self.signals:
            raise subprocess.TimeoutExpired(self.cmd, timeout)
        self.returncode = self.do.get("code", -15 if self.signals else 0)
        return self.returncode

    def poll(self):
        return self.returncode

    def terminate(self):
        self.signals.append("terminate")

    def kill(self):
        self.signals.append("kill")


@pytest.fixture
def procs(monkeypatch):
    Proc.made, Proc.script = [], {}
    monkeypatch.setattr(qd, "subprocess", NS(Popen=Proc, STDOUT=subprocess.STDOUT,
                                             TimeoutExpired=subprocess.TimeoutExpired))
    clock = NS(now=50.0, step=1.0)

    def monotonic():
        clock.now += clock.step
        return clock.now
    monkeypatch.setattr(qd, "time", NS(monotonic=monotonic))
    monkeypatch.setattr(qd.os, "cpu_count", lambda: 8)
    monkeypatch.setattr(qd, "merge", lambda dirs, out: merged.append((dirs, out)))
    merged: list = []
    return NS(merged=merged, clock=clock)


def test_one_process_per_device_with_its_command_threads_and_log(procs, tmp_path):
    Proc.script = {d: {"verdict": "pass", "conf": "pass"} for d in ("cpu:0", "cpu:1", "cpu:2",
                                                                     "gpu:0")}
    logs: list[str] = []
    s = qd.qualify_devices(["cpu:0", "cpu:1", "cpu:2"], tmp_path, ["--quick", "-x"],
                           log=logs.append)
    for i, p in enumerate(Proc.made):
        d = tmp_path / f"cpu-{i}"
        assert p.cmd == [sys.executable, "-m", "dflash2rt", "qualify", "--backend", f"cpu:{i}",
                         "--out", str(d), "--quick", "-x"]
        assert (p.env["OMP_NUM_THREADS"], p.env["MKL_NUM_THREADS"]) == ("2", "2")   # 8 // 3
        assert p.stdout.name == str(d / "qualify.log") and p.stdout.closed
        assert p.waits == [None]
    assert logs[:3] == [f"qualify cpu:{i}: started (pid {4000 + i}, log "
                        f"{tmp_path / f'cpu-{i}' / 'qualify.log'})" for i in range(3)]
    assert s["exit_codes"] == {"cpu:0": 0, "cpu:1": 0, "cpu:2": 0}
    assert procs.merged == [([tmp_path / "cpu-0", tmp_path / "cpu-1", tmp_path / "cpu-2"],
                             tmp_path)]


@pytest.mark.parametrize("n, share", [(1, "4"), (2, "2"), (3, "2"), (7, "1"), (8, "1"),
                                      (16, "1")])
def test_cpu_runs_share_the_cores_and_others_keep_the_environment(procs, tmp_path, n, share):
    """8 cores over n CPU runs and one GPU run: 8 // (n + 1), at least 1."""
    devs = [f"cpu:{i}" for i in range(n)]
    qd.qualify_devices(devs + ["gpu:0"], tmp_path / "o", [], log=lambda m: None)
    assert [p.env.get("OMP_NUM_THREADS") for p in Proc.made[:n]] == [share] * n
    gpu = Proc.made[-1]
    assert gpu.dev == "gpu:0"
    assert gpu.env.get("OMP_NUM_THREADS") == qd.os.environ.get("OMP_NUM_THREADS")


def test_the_summary_names_verdicts_missing_reports_and_outliers(procs, tmp_path):
    Proc.script = {"g:0": {"verdict": "pass", "conf": "pass"},
                   "g:1": {"verdict": "fail", "conf": "fail", "code": 1},
                   "g:2": {"verdict": None, "conf": "pass", "code": 0},
                   "g:3": {"code": 2}}
    s = qd.qualify_devices(["g:0", "g:1", "g:2", "g:3"], tmp_path, [], log=lambda m: None)
    assert s["exit_codes"] == {"g:0": 0, "g:1": 1, "g:2": 0, "g:3": 2}
    assert s["verdicts"] == {"g:0": "pass", "g:1": "fail", "g:2": "not recorded"}
    assert s["no_report"] == ["g:3"]
    assert s["outliers"] == {
        "g:1": {"verdict": {"value": "fail", "peers": "pass"},
                "conformance": {"value": "fail", "peers": "pass"}},
        "g:2": {"verdict": {"value": "not recorded", "peers": "pass"}}}
    assert s["elapsed_s"] == 5.0          # start 51; 4 waits log at 52..55; the end 56
    text = (tmp_path / "devices.json").read_text(encoding="utf-8")
    assert text == json.dumps(s, indent=2) and json.loads(text) == s
    assert [d.name for d in procs.merged[0][0]] == ["g-0", "g-1", "g-2"]
    assert qd.summary_lines(s) == [
        "g:0: verdict pass, exit 0", "g:1: verdict fail, exit 1",
        "g:2: verdict not recorded, exit 0", "g:3: verdict no report, exit 2",
        "no report from: g:3",
        "g:1 differs from its peers on 2 check(s): verdict = 'fail' (peers: 'pass'); "
        "conformance = 'fail' (peers: 'pass')",
        "g:2 differs from its peers on 1 check(s): verdict = 'not recorded' (peers: 'pass')"]


def test_one_report_has_no_outliers_and_none_is_not_merged(procs, tmp_path):
    Proc.script = {"g:0": {"verdict": "fail", "conf": "fail"}, "g:1": {"code": 3}}
    s = qd.qualify_devices(["g:0", "g:1"], tmp_path, [], log=lambda m: None)
    assert (s["outliers"], s["no_report"]) == ({}, ["g:1"])
    assert len(procs.merged) == 1
    assert qd.summary_lines(s)[-1] == "no device's results differ from its peers'"
    Proc.script = {}
    s = qd.qualify_devices(["g:0"], tmp_path / "none", [], log=lambda m: None)
    assert s["verdicts"] == {} and len(procs.merged) == 1
    assert qd.summary_lines(s) == ["g:0: verdict no report, exit 0", "no report from: g:0",
                                   "no device's results differ from its peers'"]


def test_the_wait_counts_the_time_left_and_stops_a_run_past_it(procs, tmp_path):
    """Clock: one second per reading, t0 = 51; each wait and each log line reads it. Each
    wait gets what is left of timeout_s (at least 1 s); a run past it is terminated, then
    (past 10 more seconds) killed."""
    Proc.script = {"g:0": {"verdict": "pass", "conf": "pass"},
                   "g:1": {"verdict": "pass", "conf": "pass", "hang": True},
                   "g:2": {"hang": True, "stubborn": True},
                   "g:3": {"verdict": "pass", "conf": "pass"}}
    logs: list[str] = []
    s = qd.qualify_devices(["g:0", "g:1", "g:2", "g:3"], tmp_path, [], log=logs.append,
                           timeout_s=4.5)
    g0, g1, g2, g3 = Proc.made
    assert g0.waits == [3.5] and g0.signals == []                  # read at 52
    assert g1.waits == [1.5, 10] and g1.signals == ["terminate"]   # at 54
    assert g2.waits == [1.0, 10, None] and g2.signals == ["terminate", "kill"]   # 56: < 1 s
    assert g3.waits == [1.0]
    assert s["exit_codes"] == {"g:0": 0, "g:1": "timed out", "g:2": "timed out", "g:3": 0}
    assert logs[4:] == ["qualify g:0: exit 0 (2s)", "qualify g:1: exit timed out (4s)",
                        "qualify g:2: exit timed out (6s)", "qualify g:3: exit 0 (8s)"]


def test_no_process_is_left_running_when_the_wait_is_interrupted(procs, tmp_path,
                                                                 monkeypatch):
    Proc.script = {"g:0": {"hang": True}, "g:1": {}}

    def wait(self, timeout=None):
        raise KeyboardInterrupt
    monkeypatch.setattr(Proc, "wait", wait)
    with pytest.raises(KeyboardInterrupt):
        qd.qualify_devices(["g:0", "g:1"], tmp_path, [], log=lambda m: None)
    assert [p.signals for p in Proc.made] == [["terminate"], ["terminate"]]
    assert all(p.stdout.closed for p in Proc.made)


def test_without_a_log_the_progress_goes_to_stderr(procs, tmp_path, capsys):
    Proc.script = {"g:0": {"verdict": "pass", "conf": "pass"}}
    qd.qualify_devices(["g:0"], tmp_path, [])
    assert capsys.readouterr().err == (
        f"qualify g:0: started (pid 4000, log {tmp_path / 'g-0' / 'qualify.log'})\n"
        "qualify g:0: exit 0 (1s)\n")


def test_an_unknown_core_count_counts_as_one(procs, tmp_path, monkeypatch):
    monkeypatch.setattr(qd.os, "cpu_count", lambda: None)
    qd.qualify_devices(["cpu:0"], tmp_path, [], log=lambda m: None)
    assert Proc.made[0].env["OMP_NUM_THREADS"] == "1"


def test_two_devices_that_differ_name_the_second_and_a_rerun_reuses_the_dirs(procs, tmp_path):
    """The elapsed seconds are rounded to 0.1: readings 1.26 s apart, t0 = 51.26, two log
    lines, the end at 55.04: 3.78 → 3.8."""
    procs.clock.step = 1.26
    out = tmp_path / "not" / "yet"
    Proc.script = {"g:0": {"verdict": "pass", "conf": "pass"},
                   "g:1": {"verdict": "fail", "conf": "fail"}}
    for _ in range(2):
        procs.clock.now = 50.0
        s = qd.qualify_devices(["g:0", "g:1"], out, [], log=lambda m: None)
        assert s["outliers"] == {"g:1": {"verdict": {"value": "fail", "peers": "pass"},
                                         "conformance": {"value": "fail", "peers": "pass"}}}
        assert s["elapsed_s"] == 3.8


def test_values_equal_but_written_in_another_key_order_are_equal():
    a, b = _report(), _report()
    a["system"]["kernels"] = {"conv": "triton", "verify": "torch"}
    b["system"]["kernels"] = {"verify": "torch", "conv": "triton"}
    c = _report()
    c["system"]["kernels"] = {"verify": "triton", "conv": "triton"}
    assert qd.outliers({"g:0": a, "g:1": b}) == {}
    assert qd.outliers({"g:0": a, "g:1": b, "g:2": c}) == {"g:2": {"kernels": {
        "value": {"verify": "triton", "conv": "triton"},
        "peers": {"conv": "triton", "verify": "torch"}}}}
