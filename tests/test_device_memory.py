"""Free-memory queries never fail a load: a driver whose query raises (XPU without Level Zero
Sysman) gets the documented estimate, total − reserved, or no check, and the runs say which."""

from __future__ import annotations

import types

import pytest
import torch

from dflash2rt.errors import ResourceError
from dflash2rt.models import memory


@pytest.fixture
def fake_xpu(monkeypatch):
    """torch.xpu whose mem_get_info raises as Arc drivers without Sysman do."""
    monkeypatch.setattr(memory, "NOTES", {}, raising=False)
    state = {"reserved": 3 * 10**9}

    def refuse(device=None):
        raise RuntimeError("The device (Intel(R) Arc(TM) A770) doesn't support querying the "
                           "available free memory")
    fake = types.SimpleNamespace(
        mem_get_info=refuse, memory_reserved=lambda d=None: state["reserved"],
        memory_allocated=lambda d=None: 10**9,
        get_device_properties=lambda d=None: types.SimpleNamespace(total_memory=16 * 10**9))
    monkeypatch.setattr(torch, "xpu", fake, raising=False)
    return state


def test_a_refused_query_is_estimated_and_said(fake_xpu):
    dev = torch.device("xpu:0")
    assert memory.available_bytes(dev) == 13 * 10**9                  # total − reserved
    note = memory.memory_note(dev)
    assert "estimated as total - reserved" in note and "ZES_ENABLE_SYSMAN=1" in note
    memory.check_fits(12 * 10**9, dev, "the weights", "the dtype")    # fits the estimate
    with pytest.raises(ResourceError, match=r"14.00 GB but only 13.00 GB .*estimated.*lower "
                                            r"the dtype"):
        memory.check_fits(14 * 10**9, dev, "the weights", "the dtype")


def test_no_total_either_skips_the_check_and_says_so(fake_xpu, monkeypatch):
    def broken(d=None):
        raise RuntimeError("no properties")
    monkeypatch.setattr(torch.xpu, "get_device_properties", broken)
    dev = torch.device("xpu:0")
    assert memory.available_bytes(dev) is None
    memory.check_fits(10**15, dev, "the weights", None)               # unchecked, not refused
    assert "not checked" in memory.memory_note(dev) and "no properties" in memory.memory_note(dev)


def test_a_working_query_leaves_no_note(fake_xpu, monkeypatch):
    monkeypatch.setattr(torch.xpu, "mem_get_info", lambda d=None: (5 * 10**9, 16 * 10**9))
    dev = torch.device("xpu:0")
    assert memory.available_bytes(dev) == 5 * 10**9 + 2 * 10**9       # + reserved, unused
    assert memory.memory_note(dev) is None


def test_runs_report_the_estimate(monkeypatch):
    """The engine puts the note of its device in every run's fallbacks."""
    from dflash2rt import get_backend
    from dflash2rt.engine.engine import Engine
    from dflash2rt.engine.request import Request, SamplingParams

    from tiny_models import tiny_pair

    monkeypatch.setattr(memory, "NOTES", {"cpu": "free memory of cpu estimated (test)"})
    _, stats = Engine(tiny_pair(), get_backend("cpu")).generate(
        [Request((1, 2), SamplingParams(max_new_tokens=3))], block_size=4)
    assert "free memory of cpu estimated (test)" in stats.fallbacks
