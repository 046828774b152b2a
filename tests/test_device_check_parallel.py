"""The device check's side-by-side phase and its verdicts, without a device: sections run at once
and share a bounded number of process slots (the longest expected step first), a signal stops
every child, shard reports merge level by level, memcheck counts memory-access errors only and
fails when the planted write goes uncaught, graph replay fails on a device/CPU token difference
or a slow capture. Events and files, never sleeps, decide the order: nothing depends on speed."""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from device_check_lib import Runner, Section, Slots  # noqa: E402
from device_check_memcheck import classify, memcheck_section  # noqa: E402
from device_check_report import graph_replay_figures, merge_reports  # noqa: E402


@pytest.fixture
def runner(tmp_path):
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    yield lambda slots: Runner(tmp_path / "work", deadline_s=600, reserve_s=0, slots=slots)
    for s, h in saved.items():
        signal.signal(s, h)


def _meet(tmp_path: Path, me: str, other: str) -> list[str]:
    """A step that marks itself started, then waits (bounded) for the other one to start: both
    exit 0 only when they ran at the same time."""
    return ["sh", "-c", f"touch {tmp_path}/{me}; i=0; while [ ! -e {tmp_path}/{other} ]; do "
            f"i=$((i+1)); [ $i -gt 600 ] && exit 3; sleep 0.1; done"]


def test_parallel_sections_run_side_by_side(runner, tmp_path):
    r = runner(2)
    a, b = Section("a", "A", 120, phase="parallel"), Section("b", "B", 120, phase="parallel")
    r.run_parallel([(a, lambda s: r.step(s, "x", _meet(tmp_path, "a", "b"), 90)),
                    (b, lambda s: r.step(s, "x", _meet(tmp_path, "b", "a"), 90))])
    assert [s.steps[0].rc for s in (a, b)] == [0, 0]
    assert a.status == b.status == "PASS"


def test_a_section_says_each_reason_it_failed_for_once():
    sec = Section("s", "S", 120)
    sec.fail("interrupted by SIGTERM")
    sec.fail("interrupted by SIGTERM")        # the section's thread and the main thread both
    sec.fail("x: exit 1")
    sec.fail("interrupted by SIGTERM")
    assert sec.status == "FAIL" and sec.reason == "interrupted by SIGTERM; x: exit 1"


def test_steps_of_one_section_share_the_slots(runner, tmp_path):
    r = runner(2)
    sec = Section("s", "S", 120)
    sec.end = float("inf")
    steps = r.steps(sec, [{"label": "p", "cmd": _meet(tmp_path, "p", "q"), "cap_s": 90},
                          {"label": "q", "cmd": _meet(tmp_path, "q", "p"), "cap_s": 90}])
    assert [s.rc for s in steps] == [0, 0] and [s.label for s in steps] == ["p", "q"]


def test_slots_bound_the_children_and_serve_the_longest_first():
    slots = Slots(1)
    assert slots.acquire(0, lambda: False)
    assert not slots.acquire(5, lambda: True)           # no slot free: it gives up when told
    order, ready = [], threading.Barrier(3)

    def wait(prio: float) -> None:
        ready.wait()
        assert slots.acquire(prio, lambda: False)
        order.append(prio)
        slots.release()
    threads = [threading.Thread(target=wait, args=(p,)) for p in (5.0, 50.0)]
    for t in threads:
        t.start()
    ready.wait()
    while len(slots.waiting) < 2:                       # both queued behind the held slot
        threading.Event().wait(0.01)
    slots.release()
    for t in threads:
        t.join(30)
    assert order == [50.0, 5.0]


def test_merged_shards_sum_each_level_and_keep_the_worst_result():
    a = {"result": "pass", "levels": {"L1": {"result": "pass", "passed": 3, "executed": 3,
                                             "skipped": 0, "selected": 3}},
         "ops": [{"passed": True}], "reasons": [], "duration_s": 2.0}
    b = {"result": "fail", "levels": {"L1": {"result": "fail", "passed": 1, "executed": 2,
                                             "skipped": 1, "selected": 3},
                                      "L2": {"result": "pass", "passed": 4, "executed": 4,
                                             "skipped": 0, "selected": 4}},
         "ops": [], "reasons": ["L1: 1 failed"], "duration_s": 3.0}
    m = merge_reports([a, b])
    assert m["result"] == "fail" and m["reasons"] == ["L1: 1 failed"] and m["shards"] == 2
    assert m["levels"]["L1"]["result"] == "fail" and m["levels"]["L1"]["passed"] == 4
    assert m["levels"]["L1"]["executed"] == 5 and m["levels"]["L2"]["passed"] == 4
    assert m["duration_s"] == 5.0 and len(m["ops"]) == 1
    assert merge_reports([a, a])["result"] == "pass"


def _level(result, executed, skipped=0, reasons=()):
    return {"result": result, "passed": executed, "executed": executed, "skipped": skipped,
            "selected": executed + skipped, "failed": 0, "errors": 0, "reasons": list(reasons)}


def test_a_part_that_ran_none_of_a_level_is_excused_only_if_another_part_ran_it():
    none = "nothing executed: 1 of 1 selected test(s) skipped (first: Skipped: not here)"
    skipped = {"result": "fail", "levels": {"L4": _level("fail", 0, 1, [none])},
               "reasons": [f"L4: {none}"]}
    ran = {"result": "pass", "levels": {"L4": _level("pass", 2)}, "reasons": []}
    m = merge_reports([ran, skipped])
    assert m["result"] == "pass" and m["levels"]["L4"]["result"] == "pass"
    assert m["excused"] == [f"L4: {none}"] and m["reasons"] == []
    alone = merge_reports([skipped, {"result": "pass", "levels": {}, "reasons": []}])
    assert alone["result"] == "fail" and alone["levels"]["L4"]["result"] == "fail"
    failed = {"result": "fail", "levels": {"L4": {**_level("fail", 2), "failed": 1,
                                                  "reasons": ["1 failed"]}},
              "reasons": ["L4: 1 failed"]}
    m = merge_reports([ran, failed])
    assert m["result"] == "fail" and m["reasons"] == ["L4: 1 failed"] and m["excused"] == []


PLANTED_LOG = """========= COMPUTE-SANITIZER
========= Invalid __global__ write of size 4 bytes
=========     at _write_past_end+0x90
=========     by thread (0,0,0) in block (0,0,0)
=========     Address 0x7f0000004e20 is out of bounds
========= Invalid __global__ write of size 4 bytes
========= ERROR SUMMARY: 3 errors
========= ERROR SUMMARY: 1 error was not printed. Use --print-limit option to adjust the number
"""
API_LOG = """========= COMPUTE-SANITIZER
========= Program hit cudaErrorStreamCaptureUnsupported (error 900) due to "operation not
=========     permitted when stream is capturing" on CUDA API call to cudaMalloc.
========= Program hit cudaErrorStreamCaptureInvalidated (error 901) due to "..." on CUDA API
========= ERROR SUMMARY: 2 errors
"""


def test_classify_counts_memory_access_errors_only():
    p = classify(PLANTED_LOG)
    assert p["memory_errors"] == 2 and p["api_errors"] == 0 and p["summary_total"] == 3
    assert p["first"][0].startswith("Invalid __global__ write")
    a = classify(API_LOG)
    assert a["memory_errors"] == 0 and a["api_errors"] == 2 and a["summary_total"] == 2
    assert classify("========= Device not supported\n")["refused"] == "Device not supported"
    assert classify("")["summary_total"] is None


def _fake_sanitizer(tmp_path: Path, planted: str, smoke: str) -> Path:
    """A compute-sanitizer that writes a canned log to --log-file: ``planted`` for the planted
    kernel's run, ``smoke`` for the others."""
    logs = tmp_path / "canned"
    logs.mkdir()
    (logs / "planted").write_text(planted)
    (logs / "smoke").write_text(smoke)
    fake = tmp_path / "bin" / "compute-sanitizer"
    fake.parent.mkdir()
    fake.write_text(f"""#!/bin/sh
while [ "$1" != "--log-file" ]; do shift; done
log=$2; shift 2
case "$*" in *planted_oob.py*) cp {logs}/planted "$log";; *) cp {logs}/smoke "$log";; esac
exit 0
""")
    fake.chmod(0o755)
    return fake.parent


@pytest.mark.parametrize("planted, smoke, fails", [
    (PLANTED_LOG, API_LOG, ""),                                   # caught; API errors ignored
    (API_LOG, API_LOG, "planted out-of-bounds write was NOT caught"),
    (PLANTED_LOG, PLANTED_LOG, "smoke-graphs: 2 memory-access error(s)"),
    (PLANTED_LOG, "no summary\n", "smoke-graphs: no ERROR SUMMARY line")])
def test_memcheck_verdict(runner, tmp_path, monkeypatch, planted, smoke, fails):
    monkeypatch.setenv("PATH", f"{_fake_sanitizer(tmp_path, planted, smoke)}:/usr/bin:/bin")
    r = runner(3)
    args = SimpleNamespace(dry_run=False, backend="cuda")
    check = SimpleNamespace(a=args, r=r, w=r.work, py=sys.executable, driver="device_check.py",
                            expect={})
    sec = Section("memcheck", "memcheck", 120)
    r.run_section(sec, lambda s: memcheck_section(check, s))
    assert [st.label for st in sec.steps] == ["planted", "smoke-graphs", "smoke-exact"]
    if fails:
        assert sec.status == "FAIL" and fails in sec.reason, sec.reason
    else:
        assert sec.status == "PASS", sec.reason
        assert sec.figures["planted"].startswith("2 memory-access errors printed")
        assert "ERROR SUMMARY 3," in sec.figures["planted"]
        assert sec.figures["smoke-exact"].startswith("0 memory-access errors printed, 2 CUDA API")


def _row(mode="spec", marked=False, equal=True, cpu=None, caps=None):
    row = {"mode": mode, "batch": 8, "watermark": marked, "equal": equal, "graph_replays": 9,
           "graph_eager_buckets": [], "captures_ms": caps or {"verify @8": 120.0}}
    if cpu is not None:
        row.update(cpu_tokens_equal=cpu, cpu_requests_equal=8 if cpu else 7,
                   cpu_first_difference=None if cpu else {"request": 3, "token": 17})
    return row


@pytest.mark.parametrize("rows, slow, fails", [
    ([_row(), _row(cpu=True), _row(marked=True, cpu=True)], {}, ""),
    ([_row(), _row(mode="target-only", cpu=False)], {},
     "target-only batch 8: device tokens differ from the CPU's at {'request': 3, 'token': 17}"),
    ([_row(marked=True, caps={"draft @8": 25300.0})], {"spec b8 watermarked: draft @8": 25300.0},
     "1 capture(s) over 2000 ms")])
def test_graph_replay_verdict(rows, slow, fails):
    sec = Section("graph_replay", "g", 100, status="PASS")
    graph_replay_figures(sec, [{"adapter": "cuda-graphs", "rows": rows, "capture_limit_ms": 2000.0,
                                "captures_over_limit": slow}], "cuda")
    assert (sec.status == "FAIL") is bool(fails) and fails in sec.reason
    assert sec.figures["watermarked_capture_ms_max"] == max(
        [ms for r in rows if r["watermark"] for ms in r["captures_ms"].values()], default=None)
