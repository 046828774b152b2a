"""Every Triton kernel compiles, as its wrapper launches it with each vendor plugin's tuning, for
CUDA sm_90 / sm_80 and AMD gfx942 / gfx90a — here, without a GPU
(dflash2rt.kernels.compile_check). The interpreter lane cannot catch compile-time errors such as
a loop-carried variable changing dtype; this test does."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("triton", reason="triton is not installed (pip install 'dflash2rt[triton]')")


def test_every_kernel_compiles_for_gpu_targets():
    env = {**os.environ, "TRITON_INTERPRET": "0", "TRITON_DEFAULT_FP_FUSION": "1"}
    proc = subprocess.run([sys.executable, "-m", "dflash2rt.kernels.compile_check", "--json"],
                          capture_output=True, text=True, env=env, timeout=900)
    assert proc.stdout, proc.stderr[-3000:]
    rows = json.loads(proc.stdout)
    failed = [f"{r['case']} [{r['target']}]: {r['error']}" for r in rows if not r["ok"]]
    assert not failed, "\n".join(failed)
    assert len(rows) == 72 and proc.returncode == 0
    for target, plugin in (("sm90", "dflash2rt_cuda"), ("gfx942", "dflash2rt_rocm")):
        tuned = {r["tuning"] for r in rows if r["target"] == target}
        want = plugin if importlib.util.find_spec(plugin) else f"default ({plugin} not installed)"
        assert tuned == {want}, f"{target} compiled with {tuned}, expected {want}"
