"""A registered backend for a test, or the test skipped saying why that backend cannot run here."""

from __future__ import annotations

import pytest

from dflash2rt.backend import Backend
from dflash2rt.registry import Registry


def available(name: str = "triton-interpret") -> Backend:
    """A new instance of backend ``name`` from the registry; skips (with the probe's reason)
    where it is unavailable."""
    reg = Registry.discover()
    status = reg.probe(name)
    if not status.available:
        pytest.skip(f"{name} unavailable: {status.reason}")
    return reg.select(name).backend
