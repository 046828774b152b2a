"""The Prometheus file against the text exposition format written out by hand (whole files,
escapes, every label-name rule alone at its edges) and the metrics path rules one at a time."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dflash2rt.engine.stats import RunStats
from dflash2rt.errors import InvalidInputError
from dflash2rt.metrics import (check_metrics_path, labels_text, prometheus_text, value_text,
                               write_metrics)


def _stats() -> RunStats:
    """Two drafts of block 3 (2 draft tokens each): one accepts both, one accepts none."""
    s = RunStats("spec", "cpu", "cpu", 3)
    s.record_accepts([2, 0], 3)
    s.generated = 5
    return s


def _family(name, kind, help_, samples):
    name = "dflash2rt:" + name
    return [f"# HELP {name} {help_}", f"# TYPE {name} {kind}",
            *(f"{name}{lab} {v}" for lab, v in samples)]


def _want(lab: str, pos) -> str:
    """The whole file for ``_stats()``, every value worked out by hand: drafts 2, draft tokens
    4, accepted 2 (position 0: 1, position 1: 1), reached (2, 1), generated 5, mean acceptance
    length 1 + 2/2, rate 2/4, per position 1/2 and 1/2, conditional 1/2 and 1/1."""
    one = lambda v: [(lab, v)]                                          # noqa: E731
    per = lambda vs: [(pos(i), v) for i, v in enumerate(vs)]            # noqa: E731
    lines = [
        *_family("spec_decode_num_drafts_total", "counter", "Speculative request-steps (one "
                 "draft block verified for one request); target-only steps are not drafts.",
                 one("2")),
        *_family("spec_decode_num_draft_tokens_total", "counter", "Draft tokens verified.",
                 one("4")),
        *_family("spec_decode_num_accepted_tokens_total", "counter", "Draft tokens accepted.",
                 one("2")),
        *_family("spec_decode_num_accepted_tokens_per_pos_total", "counter", "Draft tokens "
                 "accepted per draft position (0: the first draft token).", per(["1", "1"])),
        *_family("spec_decode_num_reached_tokens_per_pos_total", "counter", "Drafts that "
                 "verified the draft position (the block had it and every earlier position "
                 "was accepted).", per(["2", "1"])),
        *_family("generation_tokens_total", "counter", "Tokens returned to the caller.",
                 one("5")),
        *_family("spec_decode_mean_acceptance_length", "gauge", "Mean tokens committed per "
                 "draft, the bonus token included: 1 + accepted / drafts (0: no drafts).",
                 one("2.0")),
        *_family("spec_decode_acceptance_rate", "gauge", "Accepted over drafted tokens "
                 "(0: no drafts).", one("0.5")),
        *_family("spec_decode_acceptance_rate_per_pos", "gauge", "Drafts that accepted the "
                 "draft position over all drafts, as vLLM's per-position acceptance rate "
                 "(0: no drafts).", per(["0.5", "0.5"])),
        *_family("spec_decode_conditional_acceptance_rate_per_pos", "gauge", "P(draft "
                 "position accepted | reached) (0: never reached).", per(["0.5", "1.0"])),
    ]
    return "".join(line + "\n" for line in lines)


def test_whole_file_without_labels():
    want = _want("", lambda i: f'{{position="{i}"}}')
    assert prometheus_text(_stats()) == want
    assert prometheus_text(_stats(), {}) == want
    assert prometheus_text(_stats(), None) == want


def test_whole_file_with_labels_on_every_sample():
    labels = {"model_name": "m", "backend": "cpu"}
    want = _want('{model_name="m",backend="cpu"}',
                 lambda i: f'{{model_name="m",backend="cpu",position="{i}"}}')
    assert prometheus_text(_stats(), labels) == want
    assert labels == {"model_name": "m", "backend": "cpu"}         # the caller's dict untouched


def test_target_only_run_has_zero_counters_and_gauges():
    s = RunStats("target-only", "cpu", "cpu", 1)
    s.generated = 3
    text = prometheus_text(s)
    samples = [line for line in text.splitlines() if not line.startswith("#")]
    assert samples == ["dflash2rt:spec_decode_num_drafts_total 0",
                       "dflash2rt:spec_decode_num_draft_tokens_total 0",
                       "dflash2rt:spec_decode_num_accepted_tokens_total 0",
                       "dflash2rt:generation_tokens_total 3",
                       "dflash2rt:spec_decode_mean_acceptance_length 0.0",
                       "dflash2rt:spec_decode_acceptance_rate 0.0"]


@pytest.mark.parametrize("labels, want", [
    ({}, ""), ({"a": "x"}, '{a="x"}'), ({"a": "x", "b": "y"}, '{a="x",b="y"}'),
    ({"b": "y", "a": "x"}, '{b="y",a="x"}'), ({"a": ""}, '{a=""}'), ({"a": 7}, '{a="7"}'),
    ({"a": "\\"}, '{a="\\\\"}'), ({"a": '"'}, '{a="\\""}'), ({"a": "\n"}, '{a="\\n"}'),
    ({"a": 'x\\"\ny'}, '{a="x\\\\\\"\\ny"}'), ({"a": "\\n"}, '{a="\\\\n"}'),
    ({"a": "\t\r}{,="}, '{a="\t\r}{,="}'),
])
def test_labels_text(labels, want):
    assert labels_text(labels) == want


@pytest.mark.parametrize("v, want", [(0, "0"), (17, "17"), (-3, "-3"), (0.0, "0.0"),
                                     (2.0, "2.0"), (0.1, "0.1"), (1 / 3, "0.3333333333333333"),
                                     (1e-20, "1e-20")])
def test_value_text(v, want):
    assert value_text(v) == want


@pytest.mark.parametrize("name, ok", [
    ("a", True), ("_", True), ("Z", True), ("_a", True), ("a9", True), ("a__", True),
    ("a_b_C_9", True), ("_position", True), ("positions", True), ("Position", True),
    ("_9", True),
    ("9a", False), ("", False), ("a-b", False), ("a b", False), ("a:b", False), ("é", False),
    ("aé", False), ("a\n", False), ("__", False), ("__a", False), ("position", False),
    (1, False), (None, False),
])
def test_label_names_each_rule_alone(name, ok):
    """A name is kept only if it is a str, matches [a-zA-Z_][a-zA-Z0-9_]* (ASCII), does not
    start with "__" and is not "position"; each bad one is refused beside a good one."""
    labels = {"good_one": "g", name: "v"}
    if ok:
        assert f'{name}="v"' in prometheus_text(_stats(), labels)
    else:
        with pytest.raises(InvalidInputError) as err:
            prometheus_text(_stats(), labels)
        assert str(err.value).endswith(f": {[name]!r}")


def test_every_bad_label_name_is_listed():
    with pytest.raises(InvalidInputError) as err:
        prometheus_text(_stats(), {"ok": "1", "1x": "2", "position": "3", "__y": "4"})
    assert str(err.value) == ("metric label names must match [a-zA-Z_][a-zA-Z0-9_]* (ASCII, "
                              "Prometheus's grammar), not be 'position' nor start with '__': "
                              "['1x', 'position', '__y']")


def test_only_run_stats_are_accepted():
    class Sub(RunStats):
        pass

    assert prometheus_text(Sub("spec", "cpu", "cpu", 3)) == \
        prometheus_text(RunStats("spec", "cpu", "cpu", 3))
    for bad in ({"num_drafts": 1}, None, "stats"):
        with pytest.raises(InvalidInputError) as err:
            prometheus_text(bad)
        assert str(err.value) == ("prometheus_text needs a RunStats (RunResult.stats), got "
                                  f"{type(bad).__name__}")


# the metrics path -----------------------------------------------------------------------------

@pytest.mark.parametrize("bad", ["", 5, None, b"run.prom", 1.5])
def test_path_must_be_a_non_empty_str_or_pathlike(bad):
    with pytest.raises(InvalidInputError) as err:
        check_metrics_path(bad)
    assert str(err.value) == f"metrics must be a file path, got {bad!r}"


def test_path_rules_each_alone(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    assert check_metrics_path("run.prom") == Path("run.prom")
    assert check_metrics_path(tmp_path / "sub" / "r.prom") == tmp_path / "sub" / "r.prom"
    assert check_metrics_path(str(tmp_path / "new.prom")) == tmp_path / "new.prom"
    (tmp_path / "exists.prom").write_text("old")
    assert check_metrics_path(tmp_path / "exists.prom") == tmp_path / "exists.prom"
    for folder in (tmp_path / "sub", "sub", Path(""), "."):
        with pytest.raises(InvalidInputError) as err:
            check_metrics_path(folder)
        assert str(err.value) == (f"metrics path {str(Path(folder))!r} is a directory; give a "
                                  "file name (e.g. run.prom)")
    missing = tmp_path / "nope" / "m.prom"
    with pytest.raises(InvalidInputError) as err:
        check_metrics_path(missing)
    assert str(err.value) == (f"metrics path {str(missing)!r}: folder "
                              f"{str(tmp_path / 'nope')!r} does not exist; create it or give "
                              "another path")
    (tmp_path / "file").write_text("")
    with pytest.raises(InvalidInputError, match="does not exist"):
        check_metrics_path(tmp_path / "file" / "m.prom")


def test_path_expands_the_home_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert check_metrics_path("~/run.prom") == tmp_path / "run.prom"
    with pytest.raises(InvalidInputError, match="does not exist"):
        check_metrics_path("~/nope/run.prom")


def test_write_replaces_the_file_whole_and_leaves_no_temporary(tmp_path):
    p = tmp_path / "run.prom"
    p.write_text("old contents that are longer than nothing\n" * 100)
    assert write_metrics(_stats(), p, {"m": "x"}) == p
    assert p.read_text(encoding="utf-8") == prometheus_text(_stats(), {"m": "x"})
    assert sorted(os.listdir(tmp_path)) == ["run.prom"]
    assert write_metrics(_stats(), str(p)) == p
    assert p.read_text(encoding="utf-8") == prometheus_text(_stats())


def test_failed_write_is_typed_names_the_os_reason_and_keeps_the_old_file(tmp_path):
    p = tmp_path / "run.prom"
    p.write_text("old")
    (tmp_path / ".run.prom.tmp").mkdir()            # the temporary's name is taken by a folder
    with pytest.raises(InvalidInputError) as err:
        write_metrics(_stats(), p)
    assert str(err.value) == (f"cannot write metrics file {str(p)!r}: Is a directory; give a "
                              "writable path")
    assert isinstance(err.value.__cause__, IsADirectoryError)
    assert p.read_text() == "old"


def test_bad_labels_or_path_write_nothing(tmp_path):
    p = tmp_path / "run.prom"
    with pytest.raises(InvalidInputError):
        write_metrics(_stats(), p, {"position": "1"})
    with pytest.raises(InvalidInputError):
        write_metrics({"num_drafts": 1}, p)
    assert os.listdir(tmp_path) == []
