"""report.html and the merged matrix from report dicts (no qualification run, no browser): the
first screen comes first, metrics read as tables with real unicode, every plot axis has a title
and tick values, reports without the verdict fields say "not recorded"."""

from __future__ import annotations

import json
import re

import pytest

import report_fixtures as fixtures
from dflash2rt.qualify import html, svg
from dflash2rt.qualify.merge import merge
from dflash2rt.qualify.summary import summarize


def test_first_screen_comes_before_the_details():
    page = html.render(fixtures.passing_cpu())
    order = [page.index(f'id="{k}"') for k in ("first-screen", "verdict", "levels",
                                               "implementation", "speed", "details", "system")]
    assert order == sorted(order)
    first = page[page.index('id="first-screen"'):page.index('id="details"')]
    for text in ("PASS", "198 / 85", "39.75", "104.4", "×2.626", "6.8", 'id="block-size">8<',
                 "torch ops (all ops)", 'id="fallbacks" class="">none<', "e3cf9ee396f7"):
        assert text in first, text


def test_failing_first_screen_names_reasons_ops_and_fallbacks():
    first = html.first_screen(summarize(fixtures.failing_gpu()))
    assert 'class="big fail">FAIL<' in first and "collection error in" in first
    assert "2 more reason(s) below" in first                      # 7 reasons, 5 shown
    assert "triton kernel: conv_prepare, conv_finish, select; torch ops: verify, noise" in first
    assert "out of shared memory" in first and "--allow-fallback not given" in first
    assert 'data-level="graphs"' in first and "2 / 5" in first


def test_metrics_are_readable_tables_with_unicode():
    page = html.render(fixtures.passing_cpu())
    assert "\\u03b3" not in page and "γ=2" in page and "χ²" in page and ">τ<" in page
    assert "86,658" in page and "0.00971" in page and "7.13e-17" in page
    assert '{"' not in page and "{'" not in page                 # no JSON or repr dicts
    system = page[page.index('id="system"'):]
    assert re.search(r"<th>runtime</th><td><table class=\"kv\"><tr><th>torch</th>", system)


def test_every_plot_axis_has_a_title_and_tick_values():
    page = html.render(fixtures.passing_cpu())
    plots = re.findall(r"<svg.*?</svg>", page, re.S)
    assert len(plots) == 3
    for plot in plots:
        titles = re.findall(r'class="axis-title"[^>]*>([^<]*)<', plot)
        assert len(titles) == 2 and all(titles), titles
        assert len(re.findall(r'class="tick">[^<]+<', plot)) >= 3
    errors = next(p for p in plots if "op error vs tolerance" in p)
    assert {"1e-12", "1e-8", "1e-2"} <= set(re.findall(r'class="tick">([^<]+)<', errors))
    assert "absolute error (log10 scale)" in errors and "0 (exact)" in errors


def test_ticks_cover_the_data():
    assert svg.nice_ticks(0, 3.35) == [0, 1, 2, 3, 4]
    assert svg.decade_ticks(-16.6, -1)[-1] >= -1 and svg.decade_ticks(-16.6, -1)[0] <= -17
    assert svg.tick_label(1e-8) == "1e-8" and svg.tick_label(0.25) == "0.25"


def test_old_and_empty_reports_say_not_recorded():
    r = fixtures.passing_cpu()
    del r["verdict"], r["sections"]["conformance"]["implementation"]
    for lv in r["sections"]["conformance"]["levels"].values():
        del lv["executed"], lv["minimum"]
    page = html.render(r)
    assert "verdict not recorded" in page and "12 / not recorded" in page
    assert "per-op implementation not recorded" in page
    bare = html.render({"backend": "x"})
    assert "verdict not recorded" in bare and "end-to-end speed not recorded" in bare


def test_merged_matrix_opens_with_the_verdicts(tmp_path):
    dirs = []
    for name, r in (("cpu", fixtures.passing_cpu()), ("cuda", fixtures.failing_gpu())):
        (tmp_path / name).mkdir()
        (tmp_path / name / "report.json").write_text(json.dumps(r), encoding="utf-8")
        dirs.append(tmp_path / name)
    matrix = merge(dirs, tmp_path / "m")
    assert [v["verdict"] for v in matrix["verdicts"]] == ["pass", "fail"]
    md = (tmp_path / "m" / "matrix.md").read_text(encoding="utf-8")
    head, _, checks = md.partition("## All checks")
    assert "| cpu | **PASS** | PASS 12/12 | PASS 198/85 |" in head
    assert "| cuda | **FAIL** |" in head and "FAIL 2/5" in head and "×2.63" in head
    assert "- **cuda**: L1: 3 test(s) failed" in head and "out of shared memory" in head
    assert "| **verdict** | pass | fail |" in checks and "\\u" not in md
    page = (tmp_path / "m" / "matrix.html").read_text(encoding="utf-8")
    assert page.index('id="verdict-matrix"') < page.index('id="checks"')
    assert 'data-backend="cuda"' in page and 'class="big fail">FAIL<' in page


def test_reports_with_only_the_deprecated_ar_keys_still_render():
    """Reports written before the rename carry ar_tokens_per_s / speedup_vs_ar only: the first
    screen and the detail tables read them as the target-only numbers."""
    new, old = fixtures.passing_cpu(), fixtures.passing_cpu()
    sec = old["sections"]
    for row in [*(sec["end_to_end"][b] for b in ("batch1", "batch4")),
                *sec["block_sweep"]["rows"]]:
        row.pop("target_only_tokens_per_s", None)
        row.pop("speedup_vs_target_only")
    assert summarize(old).speed == summarize(new).speed
    assert summarize(old).speed[0].target_only == 39.75
    assert html.render(old) == html.render(new)


def test_temperature_rows_and_step_profile_render():
    """The end-to-end section shows every temperature × batch side by side (target-only,
    fixed block, adaptive with its blocks) and the synced per-step split with the sampled /
    greedy ratio; reports without them (older ones) still render."""
    r = fixtures.passing_cpu()
    page = html.render(r)
    for text in ("By temperature: target-only, block 8, adaptive", "T=0.7 top-p 0.95",
                 "adaptive blocks (size: steps)", "Per-step cost split",
                 "sampled / greedy", "synced profiling pass"):
        assert text in page, text
    assert summarize(r).sampled_over_greedy[0]["ratio"] == pytest.approx(0.0262 / 0.0242)
    old = fixtures.passing_cpu()
    for k in ("rows", "step_profile"):
        del old["sections"]["end_to_end"][k]
    page = html.render(old)
    assert "By temperature" not in page and "latency breakdown per step, batch 1" in page
    assert summarize(old).sampled_over_greedy == []


def test_report_fixture_matches_the_schema():
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is a dev dependency")
    from importlib import resources

    schema = json.loads(resources.files("dflash2rt.qualify").joinpath(
        "report.schema.json").read_text())
    jsonschema.validate(fixtures.passing_cpu(), schema)
