"""``report merge`` on hand-built reports against the matrix written out by hand from the
report contract: every check's value and key order, each verdict row field, the Markdown
lines and the HTML cells, which rows differ (one field changed at a time)."""

from __future__ import annotations

import copy
import json

import pytest

from dflash2rt.errors import InvalidInputError
from dflash2rt.qualify.merge import merge

COMMIT = "0123456789abcdef0123+dirty"


def report_a() -> dict:
    """A failing report with a level order that is not LEVELS' (and a level outside it)."""
    return {
        "backend": "alpha", "complete": True,
        "verdict": {"result": "fail", "reasons": ["L1: 1 test(s) failed", "a|b"]},
        "system": {"device": "Dev|A", "commit": COMMIT},
        "sections": {
            "conformance": {
                "status": "fail", "environment": {"dflash2rt.sizes": "quick"},
                "levels": {
                    "custom": {"result": "pass", "passed": 2, "failed": 0},
                    "L1": {"result": "fail", "passed": 3, "failed": 1, "executed": 4,
                           "minimum": 4},
                    "L0": {"result": "pass", "executed": 7, "minimum": 5}},
                "implementation": {"ops": {"conv": "triton kernel", "select": "torch ops",
                                           "verify": "triton kernel"},
                                   "kernels": "k", "graphs": "cuda graphs",
                                   "fallbacks": ["select: x"]},
                "ops": [{"op": "conv.out", "dtype": "float32", "passed": True},
                        {"op": "verify.probs", "dtype": "bfloat16", "passed": False},
                        {"op": "select.tok", "dtype": "float16"}]},
            "end_to_end": {
                "batch4": {"target_only_tokens_per_s": 50, "spec_tokens_per_s": 125.126,
                           "speedup_vs_target_only": 2.5111, "tau": 3.14159,
                           "greedy_equal": True},
                "batch1": {"target_only_tokens_per_s": 10.0, "spec_tokens_per_s": 25.0,
                           "tau": 2.5, "greedy_equal": False}},
            "graphs": {"replay_equals_eager": False},
            "block_sweep": {"recommended_block_size": 6}},
        "fallbacks": ["conv: y"],
    }


A_CHECKS = [
    ("verdict", "fail"), ("device", "Dev|A"), ("commit", COMMIT), ("complete", True),
    ("conformance", "fail"), ("conformance L2-L4 sizes", "quick"),
    ("conformance L0", "pass"), ("conformance L0 executed / minimum", "7 / 5"),
    ("conformance L1", "fail"), ("conformance L1 executed / minimum", "4 / 4"),
    ("conformance custom", "pass"), ("conformance custom executed / minimum",
                                     "2 / not recorded"),
    ("kernels", "k"),
    ("per-op implementation", "triton kernel: conv, verify; torch ops: select"),
    ("graph mode", "cuda graphs"),
    ("op conv.out float32", "pass"), ("op verify.probs bfloat16", "fail"),
    ("op select.tok float16", "fail"),
    ("target-only tok/s (batch 1)", 10.0), ("speculative tok/s (batch 1)", 25.0),
    ("tau (batch 1)", 2.5), ("speedup vs target-only (batch 1)", 2.5),
    ("target-only tok/s (batch 4)", 50), ("speculative tok/s (batch 4)", 125.13),
    ("tau (batch 4)", 3.14), ("speedup vs target-only (batch 4)", 2.51),
    ("greedy spec == target-only", False), ("graph replay == eager", False),
    ("recommended block size", 6), ("fallbacks", 2)]

B_CHECKS = [("verdict", "not recorded"), ("device", None), ("commit", None),
            ("complete", None), ("conformance", "not run"), ("conformance L2-L4 sizes", "n/a")]
for _lv in ("L0", "L1", "L2", "L3", "L4", "graphs"):
    B_CHECKS += [(f"conformance {_lv}", "not run"),
                 (f"conformance {_lv} executed / minimum", "– / not recorded")]
B_CHECKS += [("kernels", None), ("per-op implementation", "not recorded"), ("graph mode", None),
             ("greedy spec == target-only", None), ("graph replay == eager", "n/a"),
             ("recommended block size", None), ("fallbacks", "not recorded")]

NOT_RUN = {"result": "not run", "executed": None, "minimum": None}
A_ROW = {"backend": "alpha", "verdict": "fail", "reasons": ["L1: 1 test(s) failed", "a|b"],
         "levels": {"L0": {"result": "pass", "executed": 7, "minimum": 5},
                    "L1": {"result": "fail", "executed": 4, "minimum": 4},
                    "custom": {"result": "pass", "executed": 2, "minimum": None}},
         "implementation": "triton kernel: conv, verify; torch ops: select",
         "fallbacks": ["conv: y", "select: x"], "speedup_batch1": 2.5, "tau_batch1": 2.5,
         "block_size": 6, "device": "Dev|A", "commit": COMMIT}
B_ROW = {"backend": "beta", "verdict": "not recorded", "reasons": [],
         "levels": {lv: NOT_RUN for lv in ("L0", "L1", "L2", "L3", "L4", "graphs")},
         "implementation": "not recorded (per op not recorded)", "fallbacks": "not recorded",
         "speedup_batch1": None, "tau_batch1": None, "block_size": None,
         "device": "not recorded", "commit": "not recorded"}


def _dirs(tmp_path, *reports):
    out = []
    for n, r in enumerate(reports):
        d = tmp_path / f"r{n}"
        d.mkdir()
        (d / "report.json").write_text(json.dumps(r, ensure_ascii=False), encoding="utf-8")
        out.append(d)
    return out


def _merge(tmp_path, *reports):
    m = merge(_dirs(tmp_path, *reports), tmp_path / "out")
    md = (tmp_path / "out" / "matrix.md").read_text(encoding="utf-8")
    page = (tmp_path / "out" / "matrix.html").read_text(encoding="utf-8")
    return m, md, page


def test_checks_and_verdict_rows_written_out(tmp_path):
    m, _, _ = _merge(tmp_path, report_a(), {"backend": "beta"})
    assert m["backends"] == ["alpha", "beta"]
    assert m["verdicts"] == [A_ROW, B_ROW]
    a, b = dict(A_CHECKS), dict(B_CHECKS)
    keys = list(a) + [k for k in b if k not in a]         # first seen, first listed
    assert [r["check"] for r in m["rows"]] == keys
    for r in m["rows"]:
        assert r["values"] == [a.get(r["check"]), b.get(r["check"])], r["check"]
        assert type(r["values"][0]) is type(a.get(r["check"])), r["check"]
    on_disk = json.loads((tmp_path / "out" / "matrix.json").read_text(encoding="utf-8"))
    assert on_disk == m


def test_only_the_changed_check_differs(tmp_path):
    """Two copies of one report with one field changed: exactly that row differs."""
    changes = [(("system", "device"), "Dev B", "device"),
               (("sections", "block_sweep", "recommended_block_size"), 8,
                "recommended block size"),
               (("sections", "end_to_end", "batch4", "tau"), 3.14159 + 1e-9, None),
               (("sections", "end_to_end", "batch4", "tau"), 3.2, "tau (batch 4)"),
               (("sections", "graphs", "replay_equals_eager"), True, "graph replay == eager")]
    for n, (path, value, row) in enumerate(changes):
        a, b = report_a(), report_a()
        at = b
        for k in path[:-1]:
            at = at[k]
        at[path[-1]] = value
        sub = tmp_path / f"c{n}"
        sub.mkdir()
        m, md, page = _merge(sub, a, b)
        differ = [r["check"] for r in m["rows"] if r["differs"]]
        assert differ == ([row] if row else []), path
        assert sum(line.startswith("| **") for line in md.split("## All checks")[1]
                   .splitlines()) == len(differ)
        assert page.count('<tr class="diff">') == len(differ)


def test_a_single_report_differs_nowhere(tmp_path):
    m, md, page = _merge(tmp_path, report_a())
    assert not any(r["differs"] for r in m["rows"]) and 'class="diff"' not in page


def test_speedup_and_tau_of_batch_one_only(tmp_path):
    r = report_a()
    del r["sections"]["end_to_end"]["batch1"]
    m, md, _ = _merge(tmp_path, r)
    v = m["verdicts"][0]
    assert v["speedup_batch1"] is None and v["tau_batch1"] is None
    assert "| ×2.5 |" not in md and "| – | – | 6 |" in md


def test_markdown_verdict_lines(tmp_path):
    c = report_a()
    c.update(backend="gamma", fallbacks=[], verdict={"result": "pass", "reasons": []})
    c["system"]["commit"] = "fedcba9876543210fedc"
    c["sections"]["conformance"]["implementation"]["fallbacks"] = []
    _, md, _ = _merge(tmp_path, report_a(), {"backend": "beta"}, c)
    lines = md.splitlines()
    head = ("| backend | verdict | L0 | L1 | L2 | L3 | L4 | graphs | custom | implementation | "
            "fallbacks | speedup b1 | τ b1 | block | device | commit |")
    i = lines.index(head)
    assert lines[i + 1] == "|---|---|" + "---|" * 7 + "---|" * 7
    assert lines[i + 2] == (
        "| alpha | **FAIL** | PASS 7/5 | FAIL 4/4 | not run | not run | not run | not run | "
        "PASS 2/? | triton kernel: conv, verify; torch ops: select | conv: y; select: x | "
        f"×2.5 | 2.5 | 6 | Dev\\|A | `{COMMIT}` |")
    assert lines[i + 3] == (
        "| beta | **NOT RECORDED** | " + "NOT RUN –/? | " * 6 + "not run | "
        "not recorded (per op not recorded) | not recorded | – | – | – | not recorded | "
        "`not recorded` |")
    assert lines[i + 4].startswith("| gamma | **PASS** |")
    assert "| conv: y; select: x |" not in lines[i + 4] and "| none | ×2.5 |" in lines[i + 4]
    assert lines[i + 4].endswith("| `fedcba9876543210fedc` |")
    j = lines.index("### Reasons")
    assert lines[j + 1:j + 4] == ["", "- **alpha**: L1: 1 test(s) failed", "- **alpha**: a|b"]
    assert lines[j + 4] == ""
    k = lines.index("| check | alpha | beta | gamma |")
    assert lines[k + 1] == "|---|---|---|---|"
    assert lines[k + 2] == "| **verdict** | fail | not recorded | pass |"
    assert "| **complete** | yes | – | yes |" in lines
    assert "| **conformance L0** | pass | not run | pass |" in lines
    assert "| kernels | k | – | k |" not in lines and "| **kernels** | k | – | k |" in lines


def test_markdown_without_reasons_has_no_reasons_section(tmp_path):
    c = report_a()
    c["verdict"] = {"result": "pass", "reasons": []}
    _, md, page = _merge(tmp_path, c, {"backend": "beta"})
    assert "### Reasons" not in md and 'id="reasons"' not in page
    assert "| **verdict** | pass | not recorded |" in md
    assert "| graph mode | cuda graphs |" not in md


def test_html_verdict_cells(tmp_path):
    c = report_a()
    c.update(backend="gamma", fallbacks=[], verdict={"result": "pass", "reasons": []})
    c["system"]["commit"] = "fedcba9876543210fedc"
    c["sections"]["conformance"]["implementation"]["fallbacks"] = []
    _, _, page = _merge(tmp_path, report_a(), {"backend": "beta"}, c)
    assert page.index('id="verdict-matrix"') < page.index('id="checks"')
    head = ("<tr><th>backend</th><th>verdict</th>" + "".join(
        f"<th>{lv}</th>" for lv in ("L0", "L1", "L2", "L3", "L4", "graphs", "custom"))
        + "<th>implementation</th><th>fallbacks</th><th>speedup b1</th><th>τ b1</th>"
        "<th>block</th><th>device</th><th>commit</th></tr>")
    assert head in page
    alpha = page[page.index('<tr data-backend="alpha">'):]
    alpha = alpha[:alpha.index("</tr>")]
    assert alpha == (
        '<tr data-backend="alpha"><th>alpha</th><td class="big fail">FAIL</td>'
        '<td class="lv pass"><b>PASS</b><br>7/5</td>'
        '<td class="lv fail"><b>FAIL</b><br>4/4</td>'
        + '<td class="lv not-run"><b>not run</b></td>' * 4
        + '<td class="lv pass"><b>PASS</b><br>2/?</td>'
        '<td class="small impl">triton kernel: conv, verify; torch ops: select</td>'
        '<td class="small fail">conv: y; select: x</td><td>×2.5</td>'
        '<td><span class="num">2.5</span></td><td><span class="num">6</span></td>'
        '<td class=small>Dev|A</td><td class=small>0123456789ab+dirty</td>')
    beta = page[page.index('<tr data-backend="beta">'):]
    beta = beta[:beta.index("</tr>")]
    assert beta.startswith('<tr data-backend="beta"><th>beta</th>'
                           '<td class="big not-recorded">NOT RECORDED</td>'
                           + '<td class="lv not-run"><b>NOT RUN</b><br>–/?</td>' * 6
                           + '<td class="lv not-run"><b>not run</b></td>')
    assert beta.endswith('<td class="small ">not recorded</td><td>–</td><td>–</td><td>–</td>'
                         "<td class=small>not recorded</td><td class=small>not recorded</td>")
    gamma = page[page.index('<tr data-backend="gamma">'):]
    gamma = gamma[:gamma.index("</tr>")]
    assert '<td class="big pass">PASS</td>' in gamma
    assert '<td class="small ">none</td>' in gamma
    assert gamma.endswith("<td class=small>fedcba987654</td>")
    assert ('<ul id="reasons" class="reasons"><li><b>alpha</b>: L1: 1 test(s) failed</li>'
            "<li><b>alpha</b>: a|b</li></ul>") in page


def test_html_check_rows(tmp_path):
    _, _, page = _merge(tmp_path, report_a(), {"backend": "beta"})
    assert "<tr><th>check</th><th>alpha</th><th>beta</th></tr>" in page
    assert ('<tr class="diff"><td>verdict</td><td class="fail">fail</td>'
            '<td class="">not recorded</td></tr>') in page
    assert ('<tr class="diff"><td>op conv.out float32</td><td class="pass">pass</td>'
            '<td class="">–</td></tr>') in page


def test_a_short_commit_without_dirty(tmp_path):
    r = report_a()
    r["system"]["commit"] = "abc"
    _, md, page = _merge(tmp_path, r)
    assert "<td class=small>abc</td>" in page and "| `abc` |" in md


def test_a_directory_without_a_report_is_refused(tmp_path):
    good = _dirs(tmp_path, report_a())[0]
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InvalidInputError, match=f"^{empty}: no report.json"):
        merge([good, empty], tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_unicode_is_written_as_itself(tmp_path):
    r = copy.deepcopy(report_a())
    r["system"]["device"] = "γ-device"
    _merge(tmp_path, r)
    text = (tmp_path / "out" / "matrix.json").read_text(encoding="utf-8")
    assert "γ-device" in text and "\\u" not in text


def test_out_is_made_with_its_parents_and_may_exist(tmp_path):
    dirs = _dirs(tmp_path, report_a())
    nested = tmp_path / "x" / "y" / "out"
    first = merge(dirs, nested)
    assert (nested / "matrix.md").is_file()
    assert merge(dirs, nested) == first                 # a second merge into the same folder
