"""The ``triton-interpret`` and ``triton-interpret-nofp64`` backends (dflash2rt.cpu.interpret)
where a sweep found classes the other tests let through: the probe without triton, with triton
imported outside the interpreter and available (every field written out), TRITON_INTERPRET
set only before triton's first import, the backends built, and their registry rows (opt-in,
priority 1)."""

from __future__ import annotations

import importlib.util
import os
import sys
from importlib.metadata import version

import pytest
import torch

from dflash2rt.cpu import interpret
from dflash2rt.plugin_kit.triton_hints import install_hint
from dflash2rt.registry import Registry

GRAPHS = "none: the interpreter has no graphs (eager launches)"


def test_without_triton_both_probes_say_install_it(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "triton" else real(name, *a))
    for probe in (interpret.probe, interpret.probe_nofp64):
        p = probe()
        assert not p.available
        assert p.reason == f"triton is not installed: {install_hint()}"


def test_triton_imported_outside_the_interpreter_is_refused(monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.setitem(sys.modules, "triton", sys.modules.get("triton") or object())
    monkeypatch.setattr(interpret, "interpreting", lambda: False)
    for probe in (interpret.probe, interpret.probe_nofp64):
        p = probe()
        assert not p.available and p.reason == (
            "triton was already imported in this process without TRITON_INTERPRET=1; start "
            "the process with TRITON_INTERPRET=1")


def test_triton_not_yet_imported_is_available(monkeypatch):
    """Not imported yet: create() will set TRITON_INTERPRET itself, so the probe says yes."""
    pytest.importorskip("triton")
    monkeypatch.delitem(sys.modules, "triton", raising=False)
    monkeypatch.setattr(interpret, "interpreting", lambda: False)
    assert interpret.probe().available


def test_probe_fields_when_interpreting(monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.setattr(interpret, "interpreting", lambda: True)
    p = interpret.probe()
    assert (p.available, p.reason, p.device, p.dtypes, p.graphs, p.fp64) == (
        True, "", "cpu (Triton interpreter)", ("float32", "float16"), GRAPHS, True)
    assert p.kernels == ("triton kernels under the interpreter: conv, selector walk, verify, "
                         "attention, noise, RMSNorm, attention prologue")
    assert p.details == {"triton": version("triton"), "torch": torch.__version__}
    q = interpret.probe_nofp64()
    assert (q.available, q.device, q.dtypes, q.graphs, q.fp64, q.details) == (
        True, "cpu (Triton interpreter, float64 forbidden)", ("float32", "float16"), GRAPHS,
        False, p.details)
    assert q.kernels == ("triton kernels under the interpreter, float32 formulation of the "
                         "sampled select / verify (FP64=False)")


@pytest.mark.parametrize("create", [interpret.create, interpret.create_nofp64])
def test_create_sets_the_interpreter_only_before_triton_is_imported(monkeypatch, create):
    pytest.importorskip("triton")
    import dflash2rt.kernels.backend  # noqa: F401  (imported while TRITON_INTERPRET=1 holds)

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setitem(sys.modules, "triton", sys.modules["triton"])
    create(None)
    assert "TRITON_INTERPRET" not in os.environ                  # too late: left alone
    monkeypatch.delitem(sys.modules, "triton")
    create(None)
    assert os.environ["TRITON_INTERPRET"] == "1"


def test_the_backends_built():
    pytest.importorskip("triton")
    b = interpret.create(None)
    assert (b.name, b.device, b.dtypes, b.has_fp64) == (
        "triton-interpret", torch.device("cpu"), (torch.float32, torch.float16), True)
    n = interpret.create_nofp64(None)
    assert (n.name, n.device, n.dtypes, n.has_fp64) == (
        "triton-interpret-nofp64", torch.device("cpu"), (torch.float32, torch.float16), False)
    assert type(n).__name__ == "KernelBackendNoFp64"


def test_registry_rows_opt_in_at_priority_1():
    rows = {s.name: s for s in Registry.discover().statuses()}
    for name in ("triton-interpret", "triton-interpret-nofp64"):
        assert (rows[name].priority, rows[name].opt_in) == (1, True)
    assert (interpret.SPEC.probe, interpret.SPEC.create) == (interpret.probe, interpret.create)
    assert (interpret.SPEC_NOFP64.probe, interpret.SPEC_NOFP64.create) == (
        interpret.probe_nofp64, interpret.create_nofp64)
