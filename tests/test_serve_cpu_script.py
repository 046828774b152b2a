"""``scripts/serve_cpu.py``: a server's CPU split into its engine thread, OpenMP's other
threads (anything over half the engine's) and the rest (the HTTP side), from /proc."""

from __future__ import annotations

import importlib.util
import os
import threading
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "serve_cpu.py"


@pytest.fixture(scope="module")
def tool():
    spec = importlib.util.spec_from_file_location("serve_cpu", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_servers_cpu_splits_into_engine_workers_and_the_rest(tool):
    before = {7: 1.0, 8: 2.0, 9: 0.5, 10: 0.0, 12: 0.0}
    after = {7: 11.0, 8: 11.5, 9: 2.9, 10: 0.3, 11: 0.2, 12: 6.0}   # 11: began meanwhile
    got = tool.split(7, before, after)     # workers: over half the engine's (8 and 12)
    assert got == pytest.approx({"engine": 10.0, "workers": 15.5, "rest": 2.9})
    assert tool.split(7, after, after) == {"engine": 0.0, "workers": 0.0, "rest": 0.0}


def test_each_thread_of_a_process_is_read(tool):
    done = threading.Event()
    t = threading.Thread(target=done.wait)
    t.start()
    try:
        cpu = tool.thread_cpu(os.getpid())
        assert {os.getpid(), t.native_id} <= set(cpu) and min(cpu.values()) >= 0
    finally:
        done.set()
        t.join()
