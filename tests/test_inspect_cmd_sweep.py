"""``dflash2rt inspect`` with the inspection replaced by a recorder: the device it is given
(only with ``--backend``), the report's text or two-space JSON, and the exit code once the
fit is raised, written out here by hand."""

from __future__ import annotations

import types

import pytest

import dflash2rt.models.inspection
from dflash2rt.cli import main
from dflash2rt.errors import InvalidInputError
from dflash2rt.registry import Registry


class Report:
    def __init__(self, fits=True):
        self.fits = fits

    def as_dict(self):
        return {"format": "dflash2", "layers": [1, 2]}

    def text(self):
        return "format dflash2"

    def raise_for_fit(self):
        if not self.fits:
            raise InvalidInputError("the draft does not fit")


def _inspect(monkeypatch, report):
    calls = []

    def inspect_models(*a):
        calls.append(a)
        return report

    monkeypatch.setattr(dflash2rt.models.inspection, "inspect_models", inspect_models)
    return calls


def test_without_backend_no_device_is_asked_for(monkeypatch, capsys):
    calls = _inspect(monkeypatch, Report())
    monkeypatch.setattr(Registry, "discover", classmethod(lambda cls: pytest.fail("discovered")))
    assert main(["inspect", "t,d", "--draft-revision", "r2"]) == 0
    assert calls == [(("t", "d"), None, None, "r2", None)]
    assert capsys.readouterr().out == "format dflash2\n"


def test_with_backend_its_device_and_json_indented_by_two(monkeypatch, capsys):
    calls = _inspect(monkeypatch, Report())
    picked = []

    class Reg:
        def select(self, name):
            picked.append(name)
            return types.SimpleNamespace(backend=types.SimpleNamespace(device="cuda:1"))

    monkeypatch.setattr(Registry, "discover", classmethod(lambda cls: Reg()))
    assert main(["inspect", "m", "--draft", "dr", "--revision", "v", "--backend", "x",
                 "--json"]) == 0
    assert picked == ["x"] and calls == [("m", "dr", "v", None, "cuda:1")]
    assert capsys.readouterr().out == \
        '{\n  "format": "dflash2",\n  "layers": [\n    1,\n    2\n  ]\n}\n'


def test_a_draft_that_does_not_fit_prints_the_report_then_exits_2(monkeypatch, capsys):
    _inspect(monkeypatch, Report(fits=False))
    assert main(["inspect", "m"]) == 2
    out = capsys.readouterr()
    assert out.out == "format dflash2\n"
    assert out.err == "dflash2rt: error: InvalidInputError: the draft does not fit\n"
