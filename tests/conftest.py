"""Shared fixtures: make the test helpers importable and keep the backend variable out."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# The Triton kernels are tested on CPU through the interpreter, which must be chosen before triton
# is first imported in this process (PORTABILITY.md).
os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(autouse=True)
def _no_backend_env(monkeypatch):
    monkeypatch.delenv("DFLASH2RT_BACKEND", raising=False)
