"""Shared fixtures: make the test helpers importable and keep the backend variable out."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest


def _has_gpu() -> bool:
    import torch

    return torch.cuda.is_available() or (hasattr(torch, "xpu") and torch.xpu.is_available())


# The Triton kernels are tested on CPU through the interpreter, which must be chosen before triton
# is first imported in this process (PORTABILITY.md). Not on a machine with a GPU: pytest also
# loads this file for `pytest --pyargs dflash2rt_conformance` run from the repository root (the
# testpaths' conftests), and there the GPU backend under test must get the real compiler.
if not _has_gpu():
    os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, str(Path(__file__).parent))
# pytest-xdist workers (`pytest -n 2`, the README's test command) share the cores: one torch
# thread each, for them and the subprocesses they start (oversubscribed OpenMP slows torch 10x+).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _no_backend_env(monkeypatch):
    monkeypatch.delenv("DFLASH2RT_BACKEND", raising=False)
