"""Shared fixtures: make the test helpers importable and keep the backend variable out."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from pathlib import Path

import pytest


def _has_gpu() -> bool:
    import torch

    return torch.cuda.is_available() or (hasattr(torch, "xpu") and torch.xpu.is_available())


# The Triton kernels are tested on CPU through the interpreter, which must be chosen before triton
# is first imported in this process (docs/portability.md). Not on a machine with a GPU: pytest also
# loads this file for `pytest --pyargs dflash2rt_conformance` run from the repository root (the
# testpaths' conftests), and there the GPU backend under test must get the real compiler.
if not _has_gpu():
    os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, str(Path(__file__).parent))
# No test reaches the model hub: hub ids resolve from a test's own cache (tests/test_hub.py), or
# fail at once as 'not in the cache' instead of going to the network (a name like "a/b" is a
# hub id when no such directory exists).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Hypothesis keeps what it caches (the constants it collects from the code under test) under
# .hypothesis/ in the working directory: keep that out of the repository (the tests that use it
# write no example database).
os.environ.setdefault("HYPOTHESIS_STORAGE_DIRECTORY",
                      os.path.join(tempfile.gettempdir(), "dflash2rt-hypothesis"))
import slow_guard  # noqa: E402 - a helper module of tests/, importable from the line above
# ``@triton.jit`` picks the interpreter when the decorated module is imported, not at launch:
# import every kernel module now, while TRITON_INTERPRET=1 holds, so that a test which unsets
# it for a while (monkeypatch.delenv, to exercise a GPU probe) cannot leave this worker with
# compiled-path kernels that need a driver ("0 active drivers"; it depended on test order).
if os.environ.get("TRITON_INTERPRET") == "1":
    import importlib
    import importlib.util

    if importlib.util.find_spec("triton") is not None:
        for _mod in ("attention", "conv", "selector", "verify", "watermark", "backend"):
            importlib.import_module(f"dflash2rt.kernels.{_mod}")
        # The interpreter imports Gluon's language on the first launch, which asserts the
        # interpreter is on: import it now, so that a first launch during such a test works.
        if importlib.util.find_spec("triton.experimental.gluon") is not None:
            importlib.import_module("triton.experimental.gluon.language")
# pytest-xdist workers (`pytest -n 2`, the README's test command) share the cores: one torch
# thread each, for them and the subprocesses they start (oversubscribed OpenMP slows torch 10x+).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)


@pytest.fixture
def one_thread():
    """One torch thread for the test: two wait on each other when a busy machine preempts one
    (tiny forwards then run many times slower), and the recipe's results are bit-identical for
    a fixed thread count; what pytest-xdist workers use anyway (above)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# The slow tier's rule (tests/slow_guard.py): a test here that trains, or starts pytest, the
# conformance suite, qualify, the compile check or a browser, fails unless marked slow.
TESTS = Path(__file__).resolve().parent


@contextlib.contextmanager
def _tier_rule(item):
    if not Path(item.path).resolve().is_relative_to(TESTS):   # --pyargs dflash2rt_conformance
        yield
        return
    with slow_guard.watch(item.nodeid, item.get_closest_marker("slow") is not None):
        yield


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    with _tier_rule(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    with _tier_rule(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    with _tier_rule(item):
        return (yield)


@pytest.fixture(autouse=True)
def _no_backend_env(monkeypatch):
    monkeypatch.delenv("DFLASH2RT_BACKEND", raising=False)


# Tests whose engines decide from a measured cost table, i.e. from this machine's timings. With
# DFLASH2RT_MEASURED_TESTS=DIR each worker writes their node ids to DIR/<worker>.txt, so that CI
# can run exactly them again with the timings distorted (DFLASH2RT_PERTURB_COSTS=SEED, see
# dflash2rt/engine/policy/table.py): none of them may depend on what the timings were.
MEASURED_ENV = "DFLASH2RT_MEASURED_TESTS"
_measured: set[str] = set()


@pytest.fixture(autouse=True)
def _record_measured_schedules(request):
    if not os.environ.get(MEASURED_ENV):
        yield
        return
    from dflash2rt.engine.policy.schedule import add_measured_begin_listener

    remove = add_measured_begin_listener(lambda schedule: _measured.add(request.node.nodeid))
    try:
        yield
    finally:
        remove()


def pytest_sessionfinish(session):
    out = os.environ.get(MEASURED_ENV)
    if out and _measured:
        Path(out).mkdir(parents=True, exist_ok=True)
        name = os.environ.get("PYTEST_XDIST_WORKER", "main")
        (Path(out) / f"{name}.txt").write_text("".join(f"{n}\n" for n in sorted(_measured)))
