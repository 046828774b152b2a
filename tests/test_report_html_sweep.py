"""report.html's first screen against strings written out by hand: the clip lengths at their
boundaries (reasons 150, level notes 90, fallbacks 300 characters), the "more reason(s)" link
from the sixth reason on, "reasons not recorded" only on a failing verdict, the class of a
level's note, the facts (model, mode) and every speed cell, recorded or not."""

from __future__ import annotations

import pytest

from dflash2rt.qualify import html
from dflash2rt.qualify.summary import summarize

NR = "not recorded"


def _first(r: dict) -> str:
    return html.first_screen(summarize(r))


def _verdict(result: str | None, reasons: list[str]) -> dict:
    return {"verdict": {"result": result, "reasons": reasons}}


@pytest.mark.parametrize("n", [149, 150])
def test_a_reason_up_to_150_characters_is_shown_whole(n):
    r = "a" * (n - 1) + "z"
    assert f'<li title="{r}">{r}</li>' in _first(_verdict("fail", [r]))


@pytest.mark.parametrize("n", [151, 152, 400])
def test_a_longer_reason_is_clipped_to_149_characters_and_an_ellipsis(n):
    r = "a" * (n - 1) + "z"
    assert f'<li title="{r}">{"a" * 149}…</li>' in _first(_verdict("fail", [r]))


def test_a_reason_is_escaped_in_its_title_and_its_text():
    assert '<li title="&lt;b&gt; &amp; &quot;q&quot;">&lt;b&gt; &amp; &quot;q&quot;</li>' in \
        _first(_verdict("fail", ['<b> & "q"']))


@pytest.mark.parametrize("n, more", [(1, None), (4, None), (5, None), (6, 1), (7, 2), (12, 7)])
def test_five_reasons_are_shown_and_a_link_counts_the_rest(n, more):
    reasons = [f"reason {i}" for i in range(n)]
    page = _first(_verdict("fail", reasons))
    shown = [f'<li title="{r}">{r}</li>' for r in reasons[:5]]
    link = ("" if more is None else
            f'<li><a href="#verdict-reasons">{more} more reason(s) below</a></li>')
    assert f'<ul id="reasons" class="reasons">{"".join(shown)}{link}</ul>' in page
    assert page.count("more reason(s) below") == (0 if more is None else 1)
    assert f'<li title="reason {5}">' not in page


@pytest.mark.parametrize("result, big, said", [
    ("fail", '<div id="verdict" class="big fail">FAIL</div>', True),
    ("pass", '<div id="verdict" class="big pass">PASS</div>', False),
    (None, f'<div id="verdict" class="big not-recorded">verdict {NR}</div>', False)])
def test_reasons_not_recorded_only_on_a_failing_verdict_without_reasons(result, big, said):
    page = _first(_verdict(result, []))
    assert big in page
    assert (f'{big}<p class="why">reasons {NR}</p><dl class="facts">' in page) == said
    assert (f"reasons {NR}" in page) == said
    assert 'id="reasons"' not in page


@pytest.mark.parametrize("model, quick, model_text, mode_text", [
    ("stdlib-code", True, "stdlib-code", "quick"), ("m<1>", False, "m&lt;1&gt;", "full"),
    (None, None, NR, NR), ("", False, NR, "full")])
def test_the_model_and_mode_facts(model, quick, model_text, mode_text):
    page = _first({"model": model, "quick": quick})
    assert (f"<dt>model</dt><dd>{model_text}</dd><dt>mode</dt><dd>{mode_text}</dd></dl>"
            in page)


def _levels(**levels) -> dict:
    return {"sections": {"conformance": {"levels": levels}}}


@pytest.mark.parametrize("result, cls", [("fail", "why"), ("pass", "note"),
                                         ("skipped", "note"), ("not run", "note")])
def test_a_failing_level_shows_its_why_in_red_the_others_as_a_note(result, cls):
    page = _first(_levels(L1={"result": result, "reasons": ["r"]}))
    assert f'<td><span class="{cls}" title="r">r</span></td></tr>' in page


@pytest.mark.parametrize("n", [89, 90])
def test_a_level_note_up_to_90_characters_is_shown_whole(n):
    note = "n" * (n - 1) + "z"
    page = _first(_levels(L0={"result": "pass", "note": note}))
    assert f'<span class="note" title="{note}">{note}</span>' in page


@pytest.mark.parametrize("n", [91, 92])
def test_a_longer_level_note_is_clipped_to_89_characters_and_an_ellipsis(n):
    note = "n" * (n - 1) + "z"
    page = _first(_levels(L0={"result": "pass", "note": note}))
    assert f'<span class="note" title="{note}">{"n" * 89}…</span>' in page


def test_a_level_without_a_note_has_an_empty_why_cell():
    page = _first(_levels(L0={"result": "pass", "passed": 3, "failed": 1, "skipped": 2}))
    assert ('<td class=num>4 / not recorded</td><td class=num>3 / 1 / 2</td><td></td></tr>'
            in page)


def _fallbacks(fb: list[str]) -> dict:
    return {"fallbacks": fb}


@pytest.mark.parametrize("n", [299, 300])
def test_fallbacks_up_to_300_characters_are_shown_whole(n):
    fb = "f" * (n - 1) + "z"
    assert f'<span id="fallbacks" class="why">{fb}</span>' in _first(_fallbacks([fb]))


@pytest.mark.parametrize("n", [301, 302])
def test_longer_fallbacks_are_clipped_to_299_characters_and_an_ellipsis(n):
    fb = "f" * (n - 1) + "z"
    assert f'<span id="fallbacks" class="why">{"f" * 299}…</span>' in _first(_fallbacks([fb]))


def test_fallbacks_none_and_not_recorded():
    assert '<span id="fallbacks" class="">none</span>' in _first(_fallbacks([]))
    assert f'<span id="fallbacks" class="">{NR}</span>' in _first({})
    assert '<span id="fallbacks" class="why">a; b</span>' in _first(_fallbacks(["a", "b"]))


def _e2e(**batches) -> dict:
    return {"sections": {"end_to_end": batches}}


@pytest.mark.parametrize("row, cells", [
    ({"target_only_tokens_per_s": 40.0, "spec_tokens_per_s": 100.0, "tau": 2.5,
      "greedy_equal": True}, ("40", "100", "×2.5", "2.5", "yes")),
    ({"target_only_tokens_per_s": 40.0, "spec_tokens_per_s": 30.0, "tau": 1.25,
      "greedy_equal": False}, ("40", "30", "×0.75", "1.25", "NO")),
    ({"greedy_equal": None}, ("–", "–", "–", "–", "–")),
    ({"spec_tokens_per_s": 0.0, "target_only_tokens_per_s": 0.0, "tau": 0.0,
      "speedup_vs_target_only": 0.0}, ("0", "0", "×0", "0", "–"))])
def test_every_speed_cell_recorded_or_not(row, cells):
    tonly, spec, ratio, tau, greedy = cells
    want = (f'<tr class="speedrow" data-batch="2"><td>2</td><td class=num>{tonly}</td>'
            f"<td class=num>{spec}</td><td class='num ratio'>{ratio}</td>"
            f"<td class=num>{tau}</td><td>{greedy}</td></tr>")
    assert want in _first(_e2e(batch2=row))


@pytest.mark.parametrize("r, title, warn, tail", [
    ({}, "dflash2rt qualification ?: NO VERDICT",
     '<p class="warn">INCOMPLETE (interrupted or running)</p>',
     " · 0 s, INCOMPLETE (interrupted or running)</nav>"),
    ({"backend": "cpu", "complete": True, "elapsed_s": 56.94, "verdict": {"result": "pass"}},
     "dflash2rt qualification cpu: PASS", None, " · 56.94 s, complete</nav>"),
    ({"backend": "a<b", "complete": False, "elapsed_s": 3, "verdict": {"result": "fail"}},
     "dflash2rt qualification a&lt;b: FAIL",
     '<p class="warn">INCOMPLETE (interrupted or running)</p>',
     " · 3 s, INCOMPLETE (interrupted or running)</nav>")])
def test_the_page_title_warning_and_the_run_time_in_the_nav(r, title, warn, tail):
    page = html.render(r)
    assert f"<title>{title}</title>" in page
    assert ('class="warn"' in page) == (warn is not None)
    if warn:
        assert warn in page
    nav = page[page.index("<nav>"):page.index("</nav>") + 6]
    assert nav.endswith(tail), nav


def test_a_level_name_is_escaped_in_its_attribute_too():
    """A level name from the report with a quote or markup keeps the row's markup whole."""
    page = _first(_levels(**{'L"5<x>': {"result": "pass"}}))
    assert ('<tr class="pass" data-level="L&quot;5&lt;x&gt;"><td><b>L&quot;5&lt;x&gt;</b></td>'
            in page)
