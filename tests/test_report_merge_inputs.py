"""``report merge`` over reports it did not write: a file that is not JSON, not an object, or
whose fields have other types than qualify writes is refused naming the file
(InvalidInputError), never a traceback from the renderer; a good report beside it still
merges."""

from __future__ import annotations

import copy
import json

import pytest

from dflash2rt.errors import InvalidInputError
from dflash2rt.qualify.merge import merge
from report_fixtures import failing_gpu, passing_cpu

BAD = [None, 3, -1, 1.5, "x", "", [], {}, True, [1, "a"], {"a": None}, float("nan")]


def _paths(d, p=()):
    """Every key path of ``d`` (the first 3 items of each list)."""
    items = d.items() if isinstance(d, dict) else enumerate(d[:3]) if isinstance(d, list) \
        else ()
    for k, v in items:
        yield p + (k,)
        yield from _paths(v, p + (k,))


def _write(root, name: str, report) -> object:
    d = root / name
    d.mkdir()
    (d / "report.json").write_text(report if isinstance(report, str) else
                                   json.dumps(report, default=str), encoding="utf-8")
    return d


@pytest.mark.parametrize("text, why", [("{", "JSONDecodeError"), ("[]", "a JSON list"),
                                       ("3", "a JSON int"), ("", "JSONDecodeError")])
def test_a_file_that_is_not_a_report_object(tmp_path, text, why):
    good = _write(tmp_path, "good", passing_cpu())
    bad = _write(tmp_path, "bad", text)
    with pytest.raises(InvalidInputError, match=f"{bad}/report.json is not a report .*{why}"):
        merge([good, bad], tmp_path / "out")
    assert not (tmp_path / "out").exists()            # nothing half written


@pytest.mark.parametrize("make", [passing_cpu, failing_gpu])
def test_any_field_of_another_type_merges_or_is_refused_by_name(tmp_path, make):
    base = make()
    merged = refused = 0
    for n, path in enumerate(_paths(base)):
        r = copy.deepcopy(base)
        at = r
        for k in path[:-1]:
            at = at[k]
        at[path[-1]] = BAD[n % len(BAD)]
        d = _write(tmp_path, f"r{n}", r)
        try:
            merge([d], d / "out")
            merged += 1
        except InvalidInputError as exc:
            assert str(exc).startswith(f"{d}/report.json is not a report")
            refused += 1
    assert merged and refused                          # both outcomes occur


def test_good_reports_merge_beside_each_other(tmp_path):
    dirs = [_write(tmp_path, "a", passing_cpu()), _write(tmp_path, "b", failing_gpu())]
    m = merge(dirs, tmp_path / "out")
    assert len(m["backends"]) == 2 and (tmp_path / "out" / "matrix.html").is_file()
