"""Shared fixtures: make the test helpers importable and keep the backend variable out."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(autouse=True)
def _no_backend_env(monkeypatch):
    monkeypatch.delenv("DFLASH2RT_BACKEND", raising=False)
