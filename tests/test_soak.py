"""The soak script's short version: a few hundred sampled steps of the soak's batch (penalties,
a regex row, a watermark, adaptive blocks), no crash, bounded memory growth after warm-up, and
a fresh process replaying the first call's tokens exactly (``scripts/soak.py``; the full
20,000-step run is in docs/benchmarks)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow                       # a long run: two processes, 300 decode steps
def test_a_short_soak_passes(tmp_path):
    out = tmp_path / "soak.json"
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "soak.py"), "--steps", "300",
                          "--warmup", "100", "--sample-every", "100", "--json", str(out)],
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    got = json.loads(out.read_text())
    assert got["steps"] >= 300 and got["crashes"] == 0 and got["replay_identical"]
    assert got["first_call"] == got["fresh_process_first_call"]
    assert {"length"} <= set(got["finish_reasons"]) and got["tokens"] > got["steps"]
    assert got["fallbacks"] == []
