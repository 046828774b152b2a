"""Free memory (``dflash2rt.models.memory``) against answers written out anew: MemAvailable of a
given /proc/meminfo text in bytes, each accelerator query a fake torch module offers or lacks,
the estimate's exact note, and ``check_fits``'s boundary and exact messages."""

from __future__ import annotations

import io
import types

import pytest
import torch

from dflash2rt.errors import ResourceError
from dflash2rt.models import memory

XPU = torch.device("xpu:0")


@pytest.fixture(autouse=True)
def fresh_notes(monkeypatch):
    monkeypatch.setattr(memory, "NOTES", {})


def _fake(monkeypatch, kind: str = "xpu", **attrs) -> None:
    """torch.<kind> replaced by a module holding exactly ``attrs``."""
    monkeypatch.setattr(torch, kind, types.SimpleNamespace(**attrs), raising=False)


def _refuse(device=None):
    raise RuntimeError("no")


def _props(total):
    return lambda device=None: types.SimpleNamespace(total_memory=total)


def _meminfo(monkeypatch, text: str | None) -> None:
    def fake_open(path, *a, **k):
        assert path == "/proc/meminfo"
        if text is None:
            raise OSError("no such file")
        return io.StringIO(text)
    monkeypatch.setattr(memory, "open", fake_open, raising=False)


@pytest.mark.parametrize("text,want", [
    ("MemTotal:       64000 kB\nMemFree:  100 kB\nMemAvailable:   12345 kB\nCached: 7 kB\n",
     12345 * 1024),
    ("MemAvailable: 1 kB\n", 1024),
    ("MemTotal:       64000 kB\nMemFree:  100 kB\n", None),        # an old kernel: no line
    ("MemAvailable: lots kB\n", None),
    ("MemAvailable:\n", None),
    (None, None),                                                   # not Linux
])
def test_cpu_reads_memavailable_in_bytes(monkeypatch, text, want):
    _meminfo(monkeypatch, text)
    assert memory.available_bytes(torch.device("cpu")) == want
    assert memory.memory_note("cpu") is None and memory.NOTES == {}


def test_a_module_without_the_query_is_not_checked(monkeypatch):
    """Even with a total to estimate from: no query is 'not checked', not an estimate."""
    _fake(monkeypatch, get_device_properties=_props(16 * 10**9), memory_reserved=lambda d=None: 0)
    assert memory.available_bytes(XPU) is None
    assert memory.memory_note(XPU) == ("free memory of xpu:0 not checked: torch.xpu has no "
                                       "mem_get_info")
    memory.check_fits(10**18, XPU, "the weights", "the dtype")       # unchecked, not refused


def test_no_torch_module_for_the_device_is_not_checked(monkeypatch):
    monkeypatch.delattr(torch, "xpu", raising=False)
    assert memory.available_bytes(XPU) is None
    assert memory.memory_note("xpu:0") == ("free memory of xpu:0 not checked: torch.xpu has no "
                                           "mem_get_info")


@pytest.mark.parametrize("attrs,want", [
    ({}, 5000),
    ({"memory_reserved": lambda d=None: 300}, 5000),          # one of the two: no correction
    ({"memory_allocated": lambda d=None: 100}, 5000),
    ({"memory_reserved": lambda d=None: 300, "memory_allocated": lambda d=None: 100}, 5200),
])
def test_cached_blocks_count_only_with_both_counters(monkeypatch, attrs, want):
    _fake(monkeypatch, mem_get_info=lambda d=None: (5000, 9000), **attrs)
    assert memory.available_bytes(XPU) == want and memory.memory_note(XPU) is None


def test_estimate_without_reserved_is_the_total_and_only_xpu_gets_the_hint(monkeypatch):
    _fake(monkeypatch, "mtia", mem_get_info=_refuse, get_device_properties=_props(16 * 10**9))
    dev = torch.device("mtia:0")
    assert memory.available_bytes(dev) == 16 * 10**9
    assert memory.memory_note(dev) == (
        "free memory of mtia:0 estimated as total - reserved (16.00 GB; other processes' use "
        "not seen): torch.mtia.mem_get_info raised RuntimeError: no")
    _fake(monkeypatch, mem_get_info=_refuse, get_device_properties=_props(16 * 10**9),
          memory_reserved=lambda d=None: 2_500_000_000)
    assert memory.available_bytes(XPU) == 13_500_000_000
    assert memory.memory_note(XPU) == (
        "free memory of xpu:0 estimated as total - reserved (13.50 GB; other processes' use "
        "not seen): torch.xpu.mem_get_info raised RuntimeError: no; " + memory.SYSMAN_HINT)


def test_no_total_is_not_checked_with_both_reasons(monkeypatch):
    def unreadable(device=None):
        raise ValueError("no total")
    _fake(monkeypatch, "mtia", mem_get_info=_refuse, get_device_properties=unreadable)
    dev = torch.device("mtia:0")
    assert memory.available_bytes(dev) is None
    assert memory.memory_note(dev) == (
        "free memory of mtia:0 not checked: torch.mtia.mem_get_info raised RuntimeError: no, "
        "and the total could not be read (ValueError: no total)")


def test_check_fits_boundary_and_messages(monkeypatch):
    _fake(monkeypatch, mem_get_info=lambda d=None: (1_500_000_000, 4 * 10**9))
    memory.check_fits(1_500_000_000, XPU, "the weights", "the dtype")     # exactly fits
    memory.check_fits(0, "xpu:0", "the weights", None)
    with pytest.raises(ResourceError) as info:
        memory.check_fits(1_500_000_001, "xpu:0", "the weights", "the dtype")
    assert str(info.value) == ("the weights needs 1.50 GB but only 1.50 GB are available on "
                               "xpu:0; lower the dtype")
    with pytest.raises(ResourceError) as info:
        memory.check_fits(2 * 10**9, XPU, "the cache", None)
    assert str(info.value) == ("the cache needs 2.00 GB but only 1.50 GB are available on "
                               "xpu:0; use a device with more memory")


def test_check_fits_names_the_estimate(monkeypatch):
    _fake(monkeypatch, "mtia", mem_get_info=_refuse, get_device_properties=_props(10**9))
    with pytest.raises(ResourceError) as info:
        memory.check_fits(3 * 10**9, "mtia:0", "the weights", "the dtype")
    assert str(info.value) == (
        "the weights needs 3.00 GB but only 1.00 GB are available on mtia:0 (free memory of "
        "mtia:0 estimated as total - reserved (1.00 GB; other processes' use not seen): "
        "torch.mtia.mem_get_info raised RuntimeError: no); lower the dtype")
