"""``dflash2rt backends`` over a registry of scripted rows: which rows build their backend, the
table's columns, widths and extra lines, and the JSON, each written out here by hand."""

from __future__ import annotations

import json
import types

import pytest

from dflash2rt.cli import backends_cmd, main
from dflash2rt.registry import BackendStatus, Registry


def _row(name, available=True, **kw):
    base = dict(reason="" if available else "no device", device="dev0" if available else "",
                distribution="dist", version="1.0")
    return BackendStatus(name, available, **{**base, **kw})


class FakeReg:
    def __init__(self, rows, raises=()):
        self.rows, self.raises, self.created = rows, set(raises), []
        self.entries = {r.name: object() for r in rows}

    def statuses(self):
        return self.rows

    def create(self, name):
        self.created.append(name)
        if name in self.raises:
            raise RuntimeError("no driver")
        return types.SimpleNamespace(implementation_summary=lambda: f"{name} kernels",
                                     standing_fallbacks=(f"{name} falls back",))


def _use(monkeypatch, reg):
    monkeypatch.setattr(Registry, "discover", classmethod(lambda cls: reg))


@pytest.mark.parametrize("row, in_entries, built", [
    (_row("a"), True, True),
    (_row("a", available=False), True, False),
    (_row("a", opt_in=True), True, False),
    (_row("a"), False, False),
])
def test_only_available_auto_pickable_registered_rows_are_built(row, in_entries, built):
    reg = FakeReg([row])
    if not in_entries:
        reg.entries = {}
    got = backends_cmd._built(reg, row)
    if built:
        assert got == {"implementation": "a kernels", "fallbacks": ["a falls back"]}
        assert reg.created == ["a"]
    else:
        assert got == {"implementation": "", "fallbacks": []} and reg.created == []


def test_a_backend_that_cannot_be_created_is_shown_not_raised():
    reg = FakeReg([_row("x")], raises={"x"})
    assert backends_cmd._built(reg, reg.rows[0]) == {
        "implementation": "create raised RuntimeError: no driver", "fallbacks": []}


def test_the_table(monkeypatch, capsys):
    rows = [
        _row("cpu", priority=10, kernels="torch", dtypes=("float32", "bfloat16"),
             graphs="none"),
        _row("gpu-long-name", available=False, kernels="triton", dtypes=("float16",),
             fp64=False),
        _row("gone", available=False, reason="not installed"),
        _row("lab", priority=0, opt_in=True, kernels="k", dtypes=("float32",), graphs="cuda"),
    ]
    _use(monkeypatch, FakeReg(rows))
    assert main(["backends"]) == 0
    w = len("gpu-long-name") + 1
    pad = " " * w
    want = [
        f"{'backend':<{w}} avail  prio  {'plugin':<28} device / reason",
        f"{'cpu':<{w}} yes      10  {'dist 1.0':<28} dev0",
        f"{pad} kernels: torch; dtypes: float32, bfloat16; float64: yes; graphs: none",
        f"{pad} runs: cpu kernels",
        f"{pad} fallback: cpu falls back",
        f"gpu-long-name  no           {'dist 1.0':<28} no device",
        f"{pad} kernels: triton; dtypes: float16; float64: no; graphs: ",
        f"{'gone':<{w}} no           {'dist 1.0':<28} not installed",
        f"{'lab':<{w}} yes       0  {'dist 1.0':<28} dev0",
        f"{pad} kernels: k; dtypes: float32; float64: yes; graphs: cuda (opt-in)",
    ]
    assert capsys.readouterr().out.splitlines() == want


def test_short_names_keep_the_header_width(monkeypatch, capsys):
    _use(monkeypatch, FakeReg([_row("c", available=False)]))
    assert main(["backends"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"backend  avail  prio  {'plugin':<28} device / reason",
        f"c        no           {'dist 1.0':<28} no device"]


def test_json_is_every_row_with_what_it_built(monkeypatch, capsys):
    rows = [_row("cpu", priority=3, dtypes=("float32",)), _row("off", available=False)]
    _use(monkeypatch, FakeReg(rows))
    assert main(["backends", "--json"]) == 0
    out = capsys.readouterr().out
    common = dict(distribution="dist", version="1.0", opt_in=False, kernels="", graphs="",
                  summary="", fp64=True)
    assert json.loads(out) == [
        dict(name="cpu", available=True, reason="", device="dev0", priority=3,
             dtypes=["float32"], implementation="cpu kernels", fallbacks=["cpu falls back"],
             **common),
        dict(name="off", available=False, reason="no device", device="", priority=None,
             dtypes=[], implementation="", fallbacks=[], **common)]
    assert out.startswith('[\n  {\n    "name": "cpu",')
