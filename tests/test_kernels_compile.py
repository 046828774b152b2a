"""Every Triton kernel compiles, as its wrapper launches it with each vendor plugin's tuning, for
the targets the plugins declare (CUDA sm_90 / sm_80, AMD gfx942 / gfx90a with 64-lane wavefronts
and RDNA3 gfx1100 with wave32) — here, without a GPU
(dflash2rt.kernels.compile_check). The interpreter lane cannot catch compile-time errors such as
a loop-carried variable changing dtype; this test does. The XPU plugin's targets need Intel's
Triton, which the PyPI triton is not: tests/test_kernels_compile_xpu.py compiles for them."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.slow          # compiles every kernel for every GPU target
pytest.importorskip("triton", reason="triton is not installed (pip install 'dflash2rt[triton]')")
if not all(importlib.util.find_spec(p) for p in ("dflash2rt_cuda", "dflash2rt_rocm")):
    pytest.skip("the targets come from the dflash2rt-cuda and dflash2rt-rocm plugins (pip install "
                "-e backends/cuda -e backends/rocm)", allow_module_level=True)
# target → the vendor tuning it compiles with (the plugins' TritonFacts, by warp size)
TARGETS = {"sm90": "cuda warp 32", "sm80": "cuda warp 32", "gfx942": "rocm warp 64",
           "gfx90a": "rocm warp 64", "gfx1100": "rocm warp 32"}


def test_every_kernel_compiles_for_gpu_targets():
    env = {**os.environ, "TRITON_INTERPRET": "0", "TRITON_DEFAULT_FP_FUSION": "1"}
    proc = subprocess.run([sys.executable, "-m", "dflash2rt.kernels.compile_check", "--json"],
                          capture_output=True, text=True, env=env, timeout=900)
    assert proc.stdout, proc.stderr[-3000:]
    rows = json.loads(proc.stdout)
    failed = [f"{r['case']} [{r['target']}]: {r['error']}" for r in rows if not r["ok"]]
    assert not failed, "\n".join(failed)
    # every kernel of every smoke case (kernels.smoke.cases) × fp32 / bf16 / fp16, and those of
    # the 2 sampled ones as a device without float64 runs them
    from dflash2rt.kernels.compile_check import launched_kernels
    from dflash2rt.kernels.smoke import cases
    kernels = launched_kernels()
    per_dtype = sum(len(kernels[m]) for m, _ in cases(torch.float32).values())
    per_target = 3 * (per_dtype + len(kernels["select"]) + len(kernels["verify"]))
    assert {r["case"].rsplit("-", 1)[0] for r in rows} >= set(cases(torch.float32)), rows
    assert len(rows) == per_target * len(TARGETS) and proc.returncode == 0
    narrow = [f"{r['case']} [{r['target']}]: {r['narrow_index']}" for r in rows
              if r["narrow_index"]]
    assert not narrow, "32-bit index multiplies:\n" + "\n".join(narrow)
    f64 = {(r["case"], r["kernel"]): r["f64"] for r in rows}
    assert all(f64[c, k] == 0 for c, k in f64 if c.endswith("-nofp64")), f64
    assert all(f64[c, k] > 0 for c, k in f64 if "sampled" in c and k != "_topk_kernel"
               and not c.endswith("-nofp64"))
    assert {k for _, k in f64} == {n for ks in kernels.values() for _, n in ks}
    for target, tuning in TARGETS.items():
        tuned = {r["tuning"] for r in rows if r["target"] == target}
        assert tuned == {tuning}, f"{target} compiled with {tuned}, expected {tuning}"
