"""``dflash2rt qualify`` and ``report merge`` with the qualification replaced by recorders:
required flags, the argv each device's process gets, the exit code from the verdicts and
outliers, and what is printed, written out here by hand."""

from __future__ import annotations

import pytest

import dflash2rt.qualify.devices
import dflash2rt.qualify.merge
import dflash2rt.qualify.run
from dflash2rt.cli import build_parser, main


@pytest.mark.parametrize("argv", [
    ["qualify", "--backend", "cpu"], ["report"], ["report", "merge", "d1"],
])
def test_required_arguments(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(argv)
    assert exc.value.code == 2
    capsys.readouterr()


def test_no_backend_and_no_devices_is_refused(capsys):
    assert main(["qualify", "--out", "o"]) == 2
    assert capsys.readouterr().err == ("dflash2rt: error: InvalidInputError: qualify needs "
                                       "--backend NAME (or --devices all|LIST)\n")


@pytest.mark.parametrize("verdict, rc", [
    ({"verdict": {"result": "pass"}}, 0), ({"verdict": {"result": "fail"}}, 1), ({}, 1),
])
def test_one_device_exits_0_only_on_a_pass(monkeypatch, verdict, rc):
    calls = []

    def qualify(*a, **kw):
        calls.append((a, kw))
        return verdict

    monkeypatch.setattr(dflash2rt.qualify.run, "qualify", qualify)
    assert main(["qualify", "--backend", "cpu", "--out", "o", "--quick",
                 "--conformance-select", "L0"]) == rc
    assert calls == [(("cpu", "o", "stdlib-code", True),
                      dict(conformance_select="L0", conformance_small=False,
                           allow_fallback=False))]


def _devices(monkeypatch, summary):
    calls = {}

    def device_list(devices, backend):
        calls["list"] = (devices, backend)
        return ["cpu:0", "cpu:1"]

    def qualify_devices(devices, out, argv):
        calls["run"] = (devices, out, argv)
        return summary

    monkeypatch.setattr(dflash2rt.qualify.devices, "device_list", device_list)
    monkeypatch.setattr(dflash2rt.qualify.devices, "qualify_devices", qualify_devices)
    monkeypatch.setattr(dflash2rt.qualify.devices, "summary_lines", lambda s: ["L1", "L2"])
    return calls


def _summary(verdicts, no_report=(), outliers=None):
    return {"verdicts": verdicts, "no_report": list(no_report), "outliers": outliers or {}}


@pytest.mark.parametrize("flags, argv", [
    ([], ["--model", "stdlib-code"]),
    (["--quick", "--conformance-select", "L0 or L1", "--conformance-small", "--allow-fallback",
      "--model", "m"],
     ["--model", "m", "--quick", "--conformance-select", "L0 or L1", "--conformance-small",
      "--allow-fallback"]),
    (["--conformance-small"], ["--model", "stdlib-code", "--conformance-small"]),
    (["--allow-fallback"], ["--model", "stdlib-code", "--allow-fallback"]),
])
def test_devices_pass_the_flags_on_to_each_process(monkeypatch, capsys, flags, argv):
    calls = _devices(monkeypatch, _summary({"cpu:0": "pass", "cpu:1": "pass"}))
    assert main(["qualify", "--devices", "all", "--backend", "cpu", "--out", "o", *flags]) == 0
    assert calls == {"list": ("all", "cpu"), "run": (["cpu:0", "cpu:1"], "o", argv)}
    assert capsys.readouterr().out == ("L1\nL2\n2 device reports -> o/matrix.html, matrix.md, "
                                       "devices.json\n")


@pytest.mark.parametrize("summary, rc", [
    (_summary({"a": "pass", "b": "pass"}), 0),
    (_summary({"a": "pass", "b": "fail"}), 1),
    (_summary({"a": "fail", "b": "fail"}), 1),
    (_summary({"a": "pass"}, no_report=["b"]), 1),
    (_summary({"a": "pass", "b": "pass"}, outliers={"b": {"x": {}}}), 1),
    (_summary({"a": "fail"}, no_report=["b"], outliers={"a": {"x": {}}}), 1),
])
def test_devices_exit_0_only_when_all_pass_all_report_and_none_differs(monkeypatch, capsys,
                                                                       summary, rc):
    _devices(monkeypatch, summary)
    assert main(["qualify", "--devices", "0,1", "--backend", "cpu", "--out", "o"]) == rc
    capsys.readouterr()


def test_merge_prints_the_matrix_size(monkeypatch, capsys):
    calls = []

    def merge(dirs, out):
        calls.append((dirs, out))
        return {"rows": [1, 2, 3], "backends": ["cpu", "x"]}

    monkeypatch.setattr(dflash2rt.qualify.merge, "merge", merge)
    assert main(["report", "merge", "d1", "d2", "--out", "m"]) == 0
    assert calls == [(["d1", "d2"], "m")]
    assert capsys.readouterr().out == "3 checks × 2 backends -> m/matrix.html, matrix.md\n"
