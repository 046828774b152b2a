"""report.html's detailed sections against strings written out by hand: every reason and
error, the conformance heading and its failed tests (at most 20), the per-op table, which
end-to-end entries are batches, which profiling row is the synced batch-1 T=0 fixed one and
its milliseconds, the graphs table, the fallbacks and the sections that did not finish."""

from __future__ import annotations

import re

import pytest

from dflash2rt.qualify import details
from dflash2rt.qualify.summary import summarize

NR = "not recorded"


def _page(r: dict) -> str:
    return details.render(r, summarize(r))


def _between(page: str, start: str, end: str) -> str:
    return page[page.index(start):page.index(end)]


# ---- verdict and reasons ------------------------------------------------------------------

def test_every_reason_is_listed_in_order_and_escaped():
    page = _page({"verdict": {"result": "fail", "reasons": ["a", "<b>", "c & d"]}})
    assert "\n<ol><li>a</li><li>&lt;b&gt;</li><li>c &amp; d</li></ol>\n" in page


@pytest.mark.parametrize("result, said", [("pass", "<p>no reason to fail recorded</p>"),
                                          ("fail", f"<p>reasons {NR}</p>"),
                                          (None, f"<p>reasons {NR}</p>")])
def test_a_verdict_without_reasons(result, said):
    page = _page({"verdict": {"result": result, "reasons": []}})
    verdict = _between(page, 'id="verdict-reasons"', 'id="conformance"')
    assert said in verdict and "<ol>" not in verdict
    other = {"<p>no reason to fail recorded</p>", f"<p>reasons {NR}</p>"} - {said}
    assert not any(o in verdict for o in other)


def test_errors_outside_tests_are_shown_each_with_the_end_of_its_message():
    long = "x" * 10 + "y" * 3000
    errors = [{"phase": "collect", "where": "suite_a", "message": "ImportError: <x>"},
              {"phase": "setup", "where": "b", "message": long}, {"where": "c"}]
    page = _page({"sections": {"conformance": {"errors": errors}}})
    assert ("\n<h3>Errors outside tests (collection, setup, teardown)</h3>\n"
            "<p><b>collect</b> in <code>suite_a</code></p><pre>ImportError: &lt;x&gt;</pre>\n"
            f"<p><b>setup</b> in <code>b</code></p><pre>{'y' * 3000}</pre>\n"
            "<p><b>None</b> in <code>c</code></p><pre></pre>\n") in page


def test_no_errors_no_errors_heading():
    assert "Errors outside tests" not in _page({"sections": {"conformance": {"errors": []}}})
    assert "Errors outside tests" not in _page({})


# ---- conformance ----------------------------------------------------------------------------

@pytest.mark.parametrize("conf, heading", [
    ({"result": "fail", "status": "pass"}, "fail"), ({"status": "error"}, "error"),
    ({"result": "", "status": "timeout"}, "timeout"), ({}, "not run"),
    ({"result": "pass"}, "pass")])
def test_the_conformance_heading_says_its_result_else_its_status(conf, heading):
    page = _page({"sections": {"conformance": conf}})
    assert f'<h2 id="conformance">Conformance: {heading}</h2>' in page


def test_a_level_shows_its_why_only_when_it_has_one():
    page = _page({"sections": {"conformance": {"levels": {
        "L1": {"result": "fail", "reasons": ["3 test(s) failed", "x"]},
        "L2": {"result": "pass"}}}}})
    l1 = _between(page, "<h3>L1 —", "<h3>L2 —")
    l2 = _between(page, "<h3>L2 —", "<h3>Near-tie")
    assert '</h3>\n<p class="why">3 test(s) failed; x</p>\n<p class="note">no metrics</p>' in l1
    assert "why" not in l2


def _tests(outcomes: list[str]) -> list[dict]:
    return [{"test": f"t{i}", "outcome": o, "message": f"m{i}"} for i, o in enumerate(outcomes)]


def test_failed_and_errored_tests_are_shown_and_the_others_not():
    tests = _tests(["failed", "passed", "error", "skipped", "xfailed", "failed"])
    page = _page({"sections": {"conformance": {"levels": {"L1": {"tests": tests}}}}})
    shown = re.findall(r"<p class=why>(t\d+)</p><pre>(m\d+)</pre>", page)
    assert shown == [("t0", "m0"), ("t2", "m2"), ("t5", "m5")]


@pytest.mark.parametrize("n", [19, 20, 21, 25])
def test_at_most_20_failed_tests_are_shown_per_level(n):
    page = _page({"sections": {"conformance": {"levels": {
        "L1": {"tests": _tests(["failed"] * n)}}}}})
    shown = re.findall(r"<p class=why>t(\d+)</p>", page)
    assert shown == [str(i) for i in range(min(n, 20))]


# ---- implementation -------------------------------------------------------------------------

def test_the_per_op_table_and_the_other_implementation_facts():
    impl = {"ops": {"verify": "torch ops", "select": "triton kernel"}, "kernels": "k",
            "graphs": "none"}
    page = _page({"sections": {"conformance": {"implementation": impl}}})
    assert ('<h2 id="implementation-detail">Implementation that ran</h2>\n'
            '<table class=""><tr><th>op</th><th>implementation</th></tr>'
            "<tr><td>verify</td><td>torch ops</td></tr>"
            "<tr><td>select</td><td>triton kernel</td></tr></table>\n"
            '<table class="kv"><tr><th>kernels</th><td>k</td></tr>'
            "<tr><th>graphs</th><td>none</td></tr></table>\n") in page


def test_implementation_without_ops():
    page = _page({"sections": {"conformance": {"implementation": {"kernels": "k"}}}})
    assert ('<h2 id="implementation-detail">Implementation that ran</h2>\n'
            "<p>none recorded</p>\n"
            '<table class="kv"><tr><th>kernels</th><td>k</td></tr></table>\n') in page


# ---- end to end -----------------------------------------------------------------------------

def test_only_batch_entries_that_are_dicts_are_rows():
    e2e = {"batch1": {"tau": 2.0}, "batch_note": "a string", "other": {"tau": 3.0},
           "rows": [], "batch4": {"tau": 1.5}}
    page = _page({"sections": {"end_to_end": e2e}})
    table = _between(page, 'id="end-to-end"', 'id="block-sweep"')
    assert re.findall(r"<tr><td>([^<]+)</td>", table) == ["batch1", "batch4"]


def _temperature_row(temperature: str, block: int) -> dict:
    return {"temperature": temperature, "batch": 1, "greedy_equal": True, "contenders": {
        "target_only": {"tokens_per_s": 40.0},
        "fixed": {"tokens_per_s": 100.0, "speedup_vs_target_only": 2.5, "tau": 3.0,
                  "block_size": block},
        "adaptive": {"tokens_per_s": 90.0, "speedup_vs_target_only": 2.25, "tau": 2.75,
                     "block_sizes": {"4": 1}}}}


def test_the_temperature_table_one_line_per_row_every_contender_side_by_side():
    """The heading names the first row's fixed block; a single row is a whole table."""
    num = '<span class="num">{}</span>'.format
    line = ("<tr><td>{}</td>" + f"<td>{num(1)}</td><td>{num(40)}</td><td>{num(100)}</td>"
            f"<td>{num(2.5)}</td><td>{num(3)}</td><td>{num(90)}</td><td>{num(2.25)}</td>"
            f"<td>{num(2.75)}</td><td><table class=\"kv\"><tr><th>4</th><td>{num(1)}</td>"
            "</tr></table></td><td>yes</td></tr>")
    head = ("<h3>By temperature: target-only, block {}, adaptive</h3>\n"
            '<table class=""><tr><th>temperature</th><th>batch</th><th>target-only tok/s</th>'
            "<th>fixed-block tok/s</th><th>fixed-block ×</th><th>fixed-block τ</th>"
            "<th>adaptive tok/s</th><th>adaptive ×</th><th>adaptive τ</th>"
            "<th>adaptive blocks (size: steps)</th><th>greedy spec == target-only</th></tr>")
    for rows, block in (([_temperature_row("T=0", 8)], 8),
                        ([_temperature_row("T=0", 4), _temperature_row("T=1", 16)], 4)):
        page = _page({"sections": {"end_to_end": {"rows": rows}}})
        want = head.format(block) + "".join(line.format(r["temperature"]) for r in rows)
        assert want + "</table>\n" in page


def _profile_row(batch: int, contender: str, temperature: str, draft: float | None) -> dict:
    return {"batch": batch, "contender": contender, "temperature": temperature,
            "draft": draft, "verify": 0.004, "host": None, "step": 0.02, "steps": 4}


def _latency_chart(page: str) -> str:
    return re.search(r'<svg[^>]*aria-label="latency breakdown[^"]*".*?</svg>', page, re.S)[0]


def test_the_latency_chart_reads_the_batch_1_t0_fixed_row_of_the_synced_pass():
    """Each of batch, contender and temperature must match; the first row that does is used,
    seconds shown as milliseconds, a missing phase as an exact 0."""
    rows = [_profile_row(4, "fixed", "T=0", 0.001), _profile_row(1, "adaptive", "T=0", 0.002),
            _profile_row(1, "fixed", "T=1", 0.003), _profile_row(1, "fixed", "T=0", 0.0125),
            _profile_row(1, "fixed", "T=0", 0.005)]
    page = _page({"sections": {"end_to_end": {"step_profile": {"rows": rows}}}})
    chart = _latency_chart(page)
    assert "latency breakdown per step, batch 1, T=0 (synced profiling pass)" in chart
    assert re.findall(r"<title>ms: ([^<]+)</title>", chart) == ["12.5", "4"]
    assert chart.count("0 (exact)") == 1                                # host: None
    assert re.findall(r'text-anchor="end">(\w+)</text>', chart) == ["draft", "verify", "host"]


def test_without_a_synced_row_the_chart_reads_the_in_run_split():
    rows = [_profile_row(4, "fixed", "T=0", 0.001)]
    split = {"draft": 0.0133, "verify": 0.022}
    page = _page({"sections": {"end_to_end": {"step_profile": {"rows": rows},
                                              "batch1": {"time_split_per_step_s": split}}}})
    chart = _latency_chart(page)
    assert 'aria-label="latency breakdown per step, batch 1"' in chart
    assert re.findall(r"<title>ms: ([^<]+)</title>", chart) == ["13.3", "22"]


def test_the_step_profile_table_in_milliseconds():
    rows = [_profile_row(1, "fixed", "T=0", 0.0125)]
    page = _page({"sections": {"end_to_end": {"step_profile": {"rows": rows}}}})
    num = '<span class="num">{}</span>'.format
    assert ("<h3>Per-step cost split (separate profiling pass, device synced between phases)"
            "</h3>\n"
            '<table class=""><tr><th>temperature</th><th>batch</th><th>contender</th>'
            "<th>draft ms</th><th>verify ms</th><th>host ms</th><th>step ms</th><th>steps</th>"
            f"</tr><tr><td>T=0</td><td>{num(1)}</td><td>fixed</td><td>{num(12.5)}</td>"
            f"<td>{num(4)}</td><td>{num(0)}</td><td>{num(20)}</td><td>{num(4)}</td></tr>"
            "</table>\n") in page


def test_the_profiling_method_note_only_when_recorded():
    rows = [_profile_row(1, "fixed", "T=0", 0.0125)]
    for method, said in (("a separate <pass>", True), ("", False), (None, False)):
        page = _page({"sections": {"end_to_end": {"step_profile": {"rows": rows,
                                                                   "method": method}}}})
        assert ("<p class=note>a separate &lt;pass&gt;</p>" in page) == said
        assert page.count("<p class=note>") == 1 + said       # + the section times


# ---- graphs, fallbacks, sections --------------------------------------------------------------

def test_the_graphs_table_leaves_out_status_and_seconds():
    page = _page({"sections": {"graphs": {"status": "done", "seconds": 2.0,
                                          "applicable": True, "adapter": "cuda"}}})
    assert ('<h2 id="graphs">Graphs vs eager</h2>\n<table class="kv"><tr><th>applicable</th>'
            "<td>yes</td></tr><tr><th>adapter</th><td>cuda</td></tr></table>\n") in page
    page = _page({"sections": {"graphs": {"status": "done", "seconds": 2.0}}})
    assert f'<h2 id="graphs">Graphs vs eager</h2>\n<p>{NR}</p>\n' in page


@pytest.mark.parametrize("r, items", [
    ({"fallbacks": ["a <x>", "b"]}, ["fallback: a &lt;x&gt;", "fallback: b"]),
    ({"fallbacks": []}, ["no fallback"]), ({}, [f"fallbacks {NR}"]),
    ({"fallbacks": [], "known_deviations": ["d1", "d2"]}, ["no fallback", "d1", "d2"])])
def test_fallbacks_and_known_deviations(r, items):
    page = _page(r)
    ul = _between(page, '<h2 id="deviations">', "</ul>")
    assert re.findall(r"<li>(.*?)</li>", ul) == items


def test_sections_that_did_not_finish_are_listed_with_their_error():
    secs = {"graphs": {"status": "error", "error": "RuntimeError: <x>", "seconds": 1.5},
            "op_microbench": {"status": "done", "seconds": 0.25},
            "conformance": {"status": "pass"}, "block_sweep": {"status": "fail"},
            "end_to_end": {"status": "interrupted"}}
    page = _page({"sections": secs, "fallbacks": []})
    ul = _between(page, '<h2 id="deviations">', "</ul>")
    assert re.findall(r"<li>(.*?)</li>", ul) == [
        "no fallback", "section graphs: error RuntimeError: &lt;x&gt;",
        "section end_to_end: interrupted "]
    assert "<p class=note>section times: graphs 1.5 s, op_microbench 0.25 s</p>" in page
