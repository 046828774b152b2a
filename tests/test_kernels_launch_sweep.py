"""The kernels' launch helper (``dflash2rt/kernels/launch.py``) against values written out here
by hand: Triton's integer classes at their range edges, the pointer type names, the
``do_not_specialize`` lists read by index or name (attribute or interpreter ``kwargs``), the
compile key of a launch with keyword arguments and options, the record of launches, the
``recording`` / ``collecting`` blocks, and the warm-up pool's report. No kernel runs: fake
kernels record what they are given."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import os
import sys

import pytest
import torch

from dflash2rt.kernels import launch as L


class constexpr:                                                  # noqa: N801
    """Stands in for ``tl.constexpr`` in an annotation."""


def _kern(x_ptr, n, m, BLOCK: constexpr, FLAG: constexpr):           # noqa: N803
    """A kernel's signature (``compile_key`` reads its parameters)."""


class Kernel:
    """Stands in for a JITFunction: ``kernel[grid](...)`` and ``warmup`` record their calls."""

    fn = staticmethod(_kern)

    def __init__(self, **options):
        for name, value in options.items():
            setattr(self, name, value)
        self.ran: list = []
        self.warmed: list = []

    def __getitem__(self, grid):
        return lambda *args, **kw: self.ran.append((grid, args, kw))

    def warmup(self, *args, grid, **kw):
        if kw.get("BLOCK") == 0:
            raise RuntimeError("x" * 1000)
        self.warmed.append((args, grid, kw))


NAME = f"{__name__.rsplit('.', 1)[-1]}._kern"


def test_module_constants():
    assert L.OPTIONS == ("num_warps", "num_stages", "enable_fp_fusion")
    assert L.COMPILE_THREADS == max(1, min(8, os.cpu_count() or 1))


@pytest.mark.parametrize("cpus, want", [(None, 1), (1, 1), (2, 2), (5, 5), (8, 8), (64, 8)])
def test_compile_threads_follow_the_cpu_count(monkeypatch, cpus, want):
    """A fresh copy of the module (the one in use is left alone) on a machine of ``cpus``."""
    monkeypatch.setattr(os, "cpu_count", lambda: cpus)
    spec = importlib.util.spec_from_file_location("launch_copy", L.__file__)
    copy = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "launch_copy", copy)        # its dataclasses look it up
    spec.loader.exec_module(copy)
    assert copy.COMPILE_THREADS == want


@pytest.mark.parametrize("dtype, name", [
    (torch.float32, "*fp32"), (torch.float16, "*fp16"), (torch.bfloat16, "*bf16"),
    (torch.float64, "*fp64"), (torch.int64, "*i64"), (torch.int32, "*i32"),
    (torch.int16, "*i16"), (torch.int8, "*i8"), (torch.uint8, "*u8"), (torch.bool, "*u1")])
def test_pointer_type_names(dtype, name):
    assert L.arg_class(torch.zeros(4, dtype=dtype)) == (name, "D")
    assert L.arg_class(L.Pointer(dtype, 32)) == (name, "D")


@pytest.mark.parametrize("value, want", [
    (1, ("constexpr", 1)), (0, ("i32", "D")), (2**31 - 1, ("i32", None)),
    (2**31 - 16, ("i32", "D")), (-2**31, ("i32", "D")), (-2**31 - 1, ("i64", None)),
    (2**31, ("i64", "D")), (2**63 - 1, ("i64", None)), (2**63, ("u64", "D")),
    (2**63 + 1, ("u64", None)), (-16, ("i32", "D")), (17, ("i32", None)), (8, ("i32", None)),
    (True, ("u1", None)), (False, ("u1", None)), (0.0, ("fp32", None)),
    (None, ("constexpr", None))])
def test_int_classes_at_their_edges(value, want):
    assert L.arg_class(value) == want


def test_specialize_and_align_flags():
    assert L.arg_class(1, specialize=False) == ("i32", None)
    assert L.arg_class(1, align=False) == ("constexpr", 1)
    for spec, align in ((False, True), (True, False), (False, False)):
        assert L.arg_class(32, spec, align) == ("i32", None)
        assert L.arg_class(torch.zeros(4), spec, align) == ("*fp32", None)
        assert L.arg_class(L.Pointer(torch.float32, 0), spec, align) == ("*fp32", None)


def test_pointer_alignment_is_the_offsets_bytes():
    x = torch.zeros(64)
    assert [L.aligned(x[i:]) for i in range(6)] == [True, False, False, False, True, False]
    h = torch.zeros(64, dtype=torch.float16)
    assert [L.aligned(h[i:]) for i in (0, 4, 8, 16)] == [True, False, True, True]
    assert L.aligned(torch.empty(64, device="meta")[8:])
    assert L.arg_class(x[2:]) == ("*fp32", None)
    assert [L.arg_class(L.Pointer(torch.int8, p))[1] for p in (0, 8, 16, 24, 48)] == \
        ["D", None, "D", None, "D"]


def test_no_key_for_an_unknown_argument():
    with pytest.raises(TypeError, match="argument of type str"):
        L.arg_class("x")


def test_bytes_of():
    flags = torch.tensor([True, False, True])
    b = L.bytes_of(flags)
    assert b.dtype == torch.int8 and b.tolist() == [1, 0, 1]
    assert b.data_ptr() == flags.data_ptr()                      # a view, no copy
    i = L.bytes_of(torch.tensor([0, 1, 1], dtype=torch.int32))
    assert i.dtype == torch.int8 and i.tolist() == [0, 1, 1]


def test_kernel_name_of_a_function_or_a_jit_object():
    assert L.kernel_name(_kern) == NAME
    assert L.kernel_name(Kernel()) == NAME

    def walk(x):
        pass

    walk.__module__ = "dflash2rt.kernels.selector"
    assert L.kernel_name(walk) == "selector.walk"
    walk.__module__ = "flat"
    assert L.kernel_name(walk) == "flat.walk"


def test_do_not_specialize_by_index_or_name_attribute_or_kwargs():
    want = [("x_ptr", False, True, False), ("n", False, False, True), ("m", False, False, True),
            ("BLOCK", True, True, True), ("FLAG", True, True, True)]
    k = Kernel(do_not_specialize=(1, "m"), do_not_specialize_on_alignment=("x_ptr",))
    assert L._params(k) == want
    assert L._params(k) is L._params(k)                          # cached on the kernel
    k2 = Kernel(kwargs={"do_not_specialize": ("n", 2), "do_not_specialize_on_alignment": (0,)})
    assert L._params(k2) == want
    assert L._params(Kernel())[:3] == [("x_ptr", False, True, True), ("n", False, True, True),
                                       ("m", False, True, True)]


def test_params_of_a_kernel_that_takes_no_attribute():
    class Slotted:
        __slots__ = ()
        fn = staticmethod(_kern)

    assert [p[0] for p in L._params(Slotted())] == ["x_ptr", "n", "m", "BLOCK", "FLAG"]


def test_compile_key_with_keyword_arguments_and_options():
    k = Kernel(do_not_specialize=("m",))
    x = torch.zeros(8)
    key = L.compile_key(k, (x[1:], 16), {"m": 32, "BLOCK": 64, "FLAG": True, "num_warps": 4,
                                        "num_stages": 2, "enable_fp_fusion": False})
    assert key == (NAME, (("*fp32", None), ("i32", "D"), ("i32", None), ("constexpr", 64),
                          ("constexpr", True)),
                   (("enable_fp_fusion", False), ("num_stages", 2), ("num_warps", 4)))
    all_pos = L.compile_key(k, (x, 1, 1, 8, False), {})
    assert all_pos == (NAME, (("*fp32", "D"), ("constexpr", 1), ("i32", None),
                              ("constexpr", 8), ("constexpr", False)), ())


def test_launches_count_calls_keep_the_first_of_each_key():
    k, rec = Kernel(), L.Launches()
    x = torch.zeros(8)
    kw = {"BLOCK": 16, "FLAG": True}
    rec.add(k, (x, 5, 7), kw)
    kw["BLOCK"] = 99                                             # the record holds its own copy
    rec.add(k, (x, 5, 9), {"BLOCK": 16, "FLAG": True})           # same key (7, 9: plain i32)
    rec.add(k, (x, 5, 7), {"BLOCK": 32, "FLAG": False})
    assert rec.count == 3 and rec.calls == {NAME: 3} and len(rec.keys()) == 2
    first = rec.by_key[L.compile_key(k, (x, 5, 7), {"BLOCK": 16, "FLAG": True})]
    assert first.kwargs == {"BLOCK": 16, "FLAG": True} and first.args[2] == 7
    assert first.args[0] == L.Pointer(torch.float32, 0, 32) and first.name == NAME
    assert first.constexprs() == {"BLOCK": 16, "FLAG": True}
    assert [x.constexprs()["BLOCK"] for x in rec.variants(NAME, FLAG=False)] == [32]
    assert len(rec.variants(NAME)) == 2 and rec.variants("other._kern") == []
    assert rec.variants(NAME, BLOCK=16, FLAG=False) == []
    assert rec.per_kernel() == {NAME: 2}


def test_per_kernel_is_sorted_by_name():
    rec = L.Launches()

    def b_kern(x):
        pass

    def a_kern(x):
        pass

    for f, n in ((b_kern, 3), (a_kern, 5), (b_kern, 16)):
        rec.add(f, (n,), {})
    assert list(rec.per_kernel().items()) == [(L.kernel_name(a_kern), 1),
                                             (L.kernel_name(b_kern), 2)]


def test_warm_form():
    x = torch.zeros(10, dtype=torch.float16)
    assert L.warm_form(x[3:]) == L.Pointer(torch.float16, 6, 20)
    assert L.warm_form(5) == 5 and L.warm_form(None) is None
    p = L.Pointer(torch.int8, 48, 7)
    assert p.data_ptr() == 48 and p.ptr_range() == 7
    assert L.Pointer(torch.int8, 16).ptr_range() == 0              # no size given


def test_recording_runs_and_records_collecting_neither_runs_nor_records():
    k, x = Kernel(), torch.zeros(4)
    with L.recording() as outer:
        L.launch(k, (3,), x, 16, 2, BLOCK=8, FLAG=False)
        with L.recording() as inner:
            assert not L.is_collecting()
            L.launch(k, (1, 2), x, 16, 2, BLOCK=8, FLAG=False)
            with L.collecting() as got:
                assert L.is_collecting()
                assert L.launch(k, (5,), x, 3, 2, BLOCK=4, FLAG=True) is None
                with L.collecting(stop=True) as stopped:
                    with pytest.raises(L.Collected):
                        L.launch(k, (5,), x, 3, 2, BLOCK=2, FLAG=True)
                assert L.is_collecting()
                L.launch(k, (5,), x, 3, 2, BLOCK=4, FLAG=True)
            assert not L.is_collecting()
    L.launch(k, (7,), x, 16, 2, BLOCK=8, FLAG=False)
    assert outer.count == 2 and inner.count == 1 and len(outer.keys()) == 1
    assert got.count == 2 and stopped.count == 1
    assert [c[0] for c in k.ran] == [(3,), (1, 2), (7,)]
    assert k.ran[0][1] == (x, 16, 2) and k.ran[0][2] == {"BLOCK": 8, "FLAG": False}


def test_recording_ends_on_an_error():
    with pytest.raises(ValueError):
        with L.recording():
            raise ValueError
    k = Kernel()
    with L.recording() as rec:
        pass
    L.launch(k, (1,), torch.zeros(2), 3, 4, BLOCK=1, FLAG=True)
    assert rec.count == 0 and len(k.ran) == 1


def test_warm_up_reports_each_failure_cut_to_600_characters():
    k, rec = Kernel(), L.Launches()
    x = torch.zeros(4)
    for block in (16, 0, 32):
        rec.add(k, (x, 3, 4), {"BLOCK": block, "FLAG": True})
    guards = []

    @contextlib.contextmanager
    def guard():
        guards.append(1)
        yield

    failed = L.warm_up(list(rec.by_key.values()), guard, threads=1)
    assert len(guards) == 3 and [w[2]["BLOCK"] for w in k.warmed] == [16, 32]
    assert all(w[1] == (1,) for w in k.warmed)
    [why] = failed.values()
    assert why == ("RuntimeError: " + "x" * 1000)[:600] and len(why) == 600
    assert L.warm_up([], guard, threads=4) == {}
    assert L.warm_up(list(rec.by_key.values())[:1], guard, threads=0) == {}


@pytest.mark.parametrize("threads, n, want", [(1, 3, 1), (2, 3, 2), (8, 3, 3), (0, 2, 1),
                                              (4, 0, 1)])
def test_warm_up_pool_size(monkeypatch, threads, n, want):
    """``threads`` workers, no more than there are launches, at least one."""
    sizes = []

    class Pool(L.ThreadPoolExecutor):
        def __init__(self, workers):
            sizes.append(workers)
            super().__init__(workers)

    monkeypatch.setattr(L, "ThreadPoolExecutor", Pool)
    k, rec = Kernel(), L.Launches()
    for block in range(1, n + 1):
        rec.add(k, (torch.zeros(4), 3, 4), {"BLOCK": block, "FLAG": True})
    assert L.warm_up(list(rec.by_key.values()), contextlib.nullcontext, threads) == {}
    assert sizes == [want] and len(k.warmed) == n


def test_pointer_and_launch_are_frozen_values():
    p = L.Pointer(torch.float16, 8, 4)
    assert {p: 1}[L.Pointer(torch.float16, 8, 4)] == 1
    assert repr(p) == "Pointer(dtype=torch.float16, ptr=8, nbytes=4)"
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.ptr = 16
    key = ("m.k", (("i32", None),), ())
    a = L.Launch(Kernel(), key, (1,), {})
    b = L.Launch(_kern, key, (2,), {"BLOCK": 4})
    assert a == b and {a: 1}[b] == 1                            # the key alone compares
    assert repr(a) == f"Launch(key={key!r})"
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.key = ()
