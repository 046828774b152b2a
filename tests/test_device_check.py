"""``scripts/device_check.sh``'s plumbing without a device or the whole dry run: the deadline
skips every section and says so, the output folder holds exactly summary.txt, summary.json and
results.tgz, a failing section fails the run, a signal packs what was gathered, a step's time
limit kills its whole process group, the float64 smoke probe and memcheck's skip reasons.
Nothing here depends on how fast the machine is (deadline 0, events rather than sleeps)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "device_check.sh"
ORDER = ["setup", "conformance", "graphs", "graph_replay", "nofp64", "memcheck", "bench",
         "costs"]
sys.path.insert(0, str(ROOT / "scripts"))


def _env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("OUT", "DEADLINE_S", "BACKEND")}
    return {**env, "PYTHON": sys.executable, **extra}


def _run(out: Path, *args: str, **env: str) -> tuple[subprocess.CompletedProcess, dict]:
    res = subprocess.run([str(SCRIPT), "--out", str(out), *args], env=_env(**env),
                         capture_output=True, text=True, timeout=600)
    return res, _outputs(out)


def _outputs(out: Path) -> dict:
    """Exactly the three files, a readable archive under 50 MB; the parsed summary.json."""
    assert sorted(p.name for p in out.iterdir()) == ["results.tgz", "summary.json",
                                                     "summary.txt"]
    assert (out / "results.tgz").stat().st_size < 50 * 2**20
    with tarfile.open(out / "results.tgz") as tar:
        assert "driver.log" in tar.getnames()
    summary = json.loads((out / "summary.json").read_text())
    assert [s["name"] for s in summary["sections"]] == ORDER
    return summary


def _by_name(summary: dict) -> dict:
    return {s["name"]: s for s in summary["sections"]}


def test_shell_and_python_syntax():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)
    for name in ("device_check.py", "device_check_lib.py", "device_check_sections.py",
                 "device_check_report.py", "device_check_memcheck.py", "device_check_probe.py",
                 "graph_check.py"):
        path = ROOT / "scripts" / name
        compile(path.read_text(), str(path), "exec")


def test_deadline_skips_every_section_and_says_so(tmp_path):
    res, summary = _run(tmp_path / "out", "--dry-run", "--deadline", "0")
    assert res.returncode == 0, res.stderr          # nothing ran, so nothing failed
    assert summary["result"] == "no section ran" and summary["deadline_s"] == 0
    assert summary["dry_run"] and summary["backend"] == "cpu"
    for sec in summary["sections"]:
        assert sec["status"] == "SKIPPED" and sec["reason"].startswith("deadline: "), sec
        assert sec["budget_s"] > 0 and not sec["steps"]
    text = (tmp_path / "out" / "summary.txt").read_text()
    assert "deadline 0 s" in text and text.count("reason: deadline") == len(ORDER)
    assert "not probed (setup skipped)" in text


@pytest.mark.slow
def test_a_failing_section_fails_the_run(tmp_path):
    res, summary = _run(tmp_path / "out", "--dry-run", "--sections", "graph_replay",
                        DRY_BACKEND="no-such-backend")
    assert res.returncode == 1
    assert summary["result"] == "fail" and summary["failed"] == ["graph_replay"]
    sec = _by_name(summary)["graph_replay"]
    assert sec["status"] == "FAIL" and "graph_check" in sec["reason"]
    assert sec["steps"][0]["log"] == "logs/graph_replay-graph_check-0.log"
    with tarfile.open(tmp_path / "out" / "results.tgz") as tar:
        log = tar.extractfile(sec["steps"][0]["log"]).read().decode()
    assert "no-such-backend" in log                  # the command's output is kept
    others = [s for s in summary["sections"] if s["name"] != "graph_replay"]
    assert all(s["status"] == "SKIPPED" and s["reason"] == "not selected (--sections)"
               for s in others)


@pytest.mark.parametrize("slots", ["1", "2"])      # one after another, or side by side
def test_sigterm_packs_what_was_gathered(tmp_path, slots):
    out = tmp_path / "out"
    proc = subprocess.Popen([str(SCRIPT), "--out", str(out), "--dry-run", "--sections",
                             "graph_replay,bench"], env=_env(SLOTS=slots),
                            stdout=subprocess.PIPE, text=True)
    work = None
    for line in proc.stdout:                          # wait for the section to start
        if "work folder" in line:
            work = Path(line.rsplit("work folder ", 1)[1].strip())
        if "graph_replay: graph replay" in line:
            break
    proc.send_signal(signal.SIGTERM)
    rest = proc.communicate(timeout=120)[0]
    assert proc.returncode == 1, rest
    summary = _outputs(out)
    assert summary["interrupted"] == "SIGTERM" and summary["result"] == "fail"
    assert summary["slots"] == int(slots)
    secs = _by_name(summary)
    assert secs["graph_replay"]["status"] == "FAIL"
    assert secs["graph_replay"]["reason"] == "interrupted by SIGTERM"
    # one after another, bench had not begun; side by side it may have begun before the
    # signal (how far depends on the machine's load): then it was interrupted as well
    assert secs["bench"]["status"] in (("SKIPPED",) if slots == "1" else ("SKIPPED", "FAIL"))
    assert secs["bench"]["reason"] == "interrupted by SIGTERM"
    assert work is not None and not work.exists()     # the work folder went into results.tgz


def test_step_timeout_kills_the_whole_process_group(tmp_path):
    from device_check_lib import Runner, Section

    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        runner = Runner(tmp_path, deadline_s=600, reserve_s=0)
        sec = Section("demo", "demo", 600)
        pid_file = tmp_path / "grandchild.pid"
        st = runner.step(sec, "sleepy", ["sh", "-c", f"sleep 300 & echo $! > {pid_file}; wait"],
                         cap_s=1)
    finally:
        for s, h in saved.items():
            signal.signal(s, h)
    assert st.rc == 124 and st.timed_out and "timed out" in runner.why(st)
    grandchild = int(pid_file.read_text())
    for _ in range(100):                              # reaped by init: gone or a zombie
        try:
            state = Path(f"/proc/{grandchild}/stat").read_text().split()[2]
        except FileNotFoundError:
            break
        if state == "Z":
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"the step's background child {grandchild} outlived the timeout")


def test_results_tgz_drops_the_largest_files_to_fit(tmp_path, monkeypatch):
    import device_check_report

    work = tmp_path / "work"
    (work / "logs").mkdir(parents=True)
    (work / "logs" / "small.log").write_text("ok\n")
    (work / "big.bin").write_bytes(os.urandom(300_000))
    monkeypatch.setattr(device_check_report, "TGZ_LIMIT", 100_000)
    info = device_check_report.tar_results(work, tmp_path / "r.tgz")
    assert info["members"] == 1 and info["dropped_over_50MB"][0].startswith("big.bin")
    with tarfile.open(tmp_path / "r.tgz") as tar:
        assert tar.getnames() == ["logs/small.log"]


def test_memcheck_says_why_it_skips(tmp_path):
    bare = os.path.dirname(subprocess.run(["sh", "-c", "command -v bash"], capture_output=True,
                                          text=True).stdout.strip())
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "compute-sanitizer").write_text("#!/bin/sh\nexit 9\n")
    (fake / "compute-sanitizer").chmod(0o755)
    _, summary = _run(tmp_path / "a", "--dry-run", "--sections", "memcheck", PATH=bare)
    sec = _by_name(summary)["memcheck"]
    if not (Path(bare) / "compute-sanitizer").exists():
        assert sec["status"] == "SKIPPED" and sec["reason"] == "compute-sanitizer is not on PATH"
    res, summary = _run(tmp_path / "b", "--dry-run", "--sections", "memcheck",
                        PATH=f"{fake}{os.pathsep}{bare}")
    sec = _by_name(summary)["memcheck"]
    assert res.returncode == 0 and sec["status"] == "SKIPPED"
    assert sec["reason"].startswith("dry run: backend cpu launches no device kernels")
    assert str(fake) in sec["reason"]


@pytest.mark.parametrize("backend, rc", [("cpu-nofp64", 0), ("cpu", 1)])
def test_smoke_reports_float64_and_fallbacks(backend, rc):
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "device_check.py"), "--smoke",
                          backend, "--expect-fp64", "0"], env=_env(),
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == rc, res.stderr
    info = json.loads(res.stdout.strip().splitlines()[-1])
    assert info["backend"] == backend and info["kernel_fallbacks"] == []
    assert info["has_fp64"] is (backend == "cpu")
    assert bool(info["problems"]) is (rc == 1)
    if rc:
        assert "has_fp64 is True, expected False" in info["problems"][0]
