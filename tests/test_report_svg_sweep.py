"""The report's inline SVG charts against values and markup worked out by hand: tick values
(1, 2, 2.5, 5 × 10^k steps, the slack at both ends, decades every k-th), tick labels at their
thresholds, and whole small charts (coordinates from W = 560, H = 280, PAD = 56, LABEL_W =
190: a line chart, a linear and a log bar chart, an exact zero, a bar under one pixel)."""

from __future__ import annotations

import pytest

from dflash2rt.qualify import svg


@pytest.mark.parametrize("lo, hi, n, want", [
    (0, 3.35, 5, [0, 1, 2, 3, 4]),                 # raw 0.8375 → step 1
    (0, 4, 5, [0, 1, 2, 3, 4]),                    # raw 1 is a step itself
    (0, 4.2, 5, [0, 2, 4, 6]),                     # raw 1.05 → step 2
    (5, 5, 5, [5, 5.25, 5.5, 5.75, 6]),            # hi <= lo: hi = lo + 1; raw 0.25 → 2.5
    (3, 1, 5, [3, 3.25, 3.5, 3.75, 4]),
    (-3, 7, 5, [-5, -2.5, 0, 2.5, 5, 7.5]),        # raw 2.5; floor(-1.2) = -2
    (0.6, 1.4, 5, [0.6, 0.8, 1.0, 1.2, 1.4]),      # 0.6 / 0.2 = 2.999…: the slack keeps 0.6
    (0, 0.6, 5, [0, 0.2, 0.4, 0.6]),               # 0.2 × 3 = 0.600…1 covers 0.6: no 0.8
    (0, 3 + 1e-9, 5, [0, 1, 2, 3]),                # within step × 1e-9 of 3: 3 covers it
    (0, 3 + 1.5e-9, 5, [0, 1, 2, 3, 4]),           # past it: one more tick
    (0, 3 + 2e-9, 5, [0, 1, 2, 3, 4]),
    (3 - 0.5e-9, 6, 5, [3, 4, 5, 6]),              # lo within step × 1e-9 of 3 starts at 3
    (3 - 1.5e-9, 6, 5, [2, 3, 4, 5, 6]),           # further below: at 2
    (0.3, 0.9, 5, [0.2, 0.4, 0.6, 0.8, 1.0]),      # raw 0.15 → 0.2
    (0, 100, 5, [0, 25, 50, 75, 100]),             # raw 25 → 2.5 × 10
    (0, 6, 5, [0, 2, 4, 6]),                       # raw 1.5 → 2
    (0, 30, 5, [0, 10, 20, 30]),                   # raw 7.5 → 10 × 1
    (0, 10, 3, [0, 5, 10]), (0, 10, 2, [0, 10]), (0, 10, 1, [0, 10]),
    (0, 10, 6, [0, 2, 4, 6, 8, 10]), (0, 0.004, 5, [0, 0.001, 0.002, 0.003, 0.004])])
def test_nice_ticks(lo, hi, n, want):
    assert svg.nice_ticks(lo, hi, n) == pytest.approx(want, abs=1e-12)
    assert len(svg.nice_ticks(lo, hi, n)) == len(want)


def test_nice_ticks_default_is_about_five():
    assert svg.nice_ticks(0, 8) == [0, 2, 4, 6, 8]


@pytest.mark.parametrize("lo, hi, n, want", [
    (-16.6, -1, 8, [-18, -16, -14, -12, -10, -8, -6, -4, -2, 0]),    # k 2; -17 % 2 = 1
    (-3.5, -1.2, 8, [-4, -3, -2, -1]), (-2, -2, 8, [-2]), (-2.5, -2.5, 8, [-3, -2]),
    (3.2, 20, 8, [3, 6, 9, 12, 15, 18, 21]),      # k 3 = ceil(17 / 8); 18 < 20 → 21
    (0, 16, 8, [0, 2, 4, 6, 8, 10, 12, 14, 16]), (0, 17, 8, [0, 3, 6, 9, 12, 15, 18]),
    (0, 10, 2, [0, 5, 10]), (1, 10, 3, [0, 3, 6, 9, 12]),
    (-7, -2, 1, [-10, -5, 0])])                   # k 5; -7 % 5 = 3
def test_decade_ticks(lo, hi, n, want):
    assert svg.decade_ticks(lo, hi, n) == want


def test_decade_ticks_default_is_at_most_about_eight():
    assert svg.decade_ticks(-20, 0) == [-21, -18, -15, -12, -9, -6, -3, 0]
    assert svg.decade_ticks(0, 17) == [0, 3, 6, 9, 12, 15, 18]     # k = ceil(17 / 8) = 3


@pytest.mark.parametrize("v, want", [
    (0, "0"), (0.0, "0"), (1, "1"), (2.5, "2.5"), (9999, "9999"), (10000, "1e4"),
    (12345.0, "1e4"), (-20000, "-2e4"), (1e10, "1e+10"), (0.01, "0.01"), (0.009, "9e-3"),
    (-0.009, "-9e-3"), (1e-8, "1e-8"), (-1e-5, "-1e-5"), (1e-10, "1e-10"), (0.25, "0.25"),
    (-0.01, "-0.01"), (-9999, "-9999")])
def test_tick_label(v, want):
    assert svg.tick_label(v) == want


def _frame(title: str, x: str, y: str, height: int) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="560" height="{height}" '
            f'viewBox="0 0 560 {height}" role="img" aria-label="{title}">'
            f'<text x="280.0" y="18" font-size="14" font-weight="bold" text-anchor="middle">'
            f'{title}</text><text x="280.0" y="{height - 6}" font-size="12" '
            f'text-anchor="middle" class="axis-title">{x}</text>'
            f'<text x="14" y="{height / 2}" font-size="12" text-anchor="middle" '
            f'class="axis-title" transform="rotate(-90 14 {height / 2})">{y}</text>')


def _ytick(y: float, label: str) -> str:
    return (f'<line x1="56" x2="504" y1="{y:.1f}" y2="{y:.1f}" stroke="#ddd"/>'
            f'<text x="50" y="{y + 4:.1f}" font-size="11" text-anchor="end" class="tick">'
            f"{label}</text>")


def _xtick(x: float, label: str) -> str:
    return (f'<line x1="{x:.1f}" x2="{x:.1f}" y1="224" y2="228" stroke="#888"/>'
            f'<text x="{x:.1f}" y="240" font-size="11" text-anchor="middle" class="tick">'
            f"{label}</text>")


def test_a_whole_line_chart():
    """x in {1, 2, 3} → 56 + (x - 1) / 2 × 448; y ticks nice_ticks(0, 4 × 1.05) = 0..6 by 2,
    y → 224 - y / 6 × 168; a None point is left out; legend entries 7.5 px a letter + 30."""
    got = svg.line_chart("T", {"a": [(1, 2.0), (3, 4.0)], "b": [(1, None), (2, 1.0)]},
                         "x", "y")
    want = (_frame("T", "x", "y", 280)
            + _ytick(224, "0") + _ytick(168, "2") + _ytick(112, "4") + _ytick(56, "6")
            + '<line x1="56" x2="56" y1="56" y2="224" stroke="#888"/>'
            + '<line x1="56" x2="504" y1="224" y2="224" stroke="#888"/>'
            + _xtick(56, "1") + _xtick(280, "2") + _xtick(504, "3")
            + '<polyline fill="none" stroke="#1f77b4" stroke-width="2" '
              'points="56.0,168.0 504.0,112.0"/>'
            + '<circle cx="56.0" cy="168.0" r="3" fill="#1f77b4"><title>a 1: 2</title></circle>'
            + '<circle cx="504.0" cy="112.0" r="3" fill="#1f77b4"><title>a 3: 4</title>'
              "</circle>"
            + '<polyline fill="none" stroke="#d62728" stroke-width="2" points="280.0,196.0"/>'
            + '<circle cx="280.0" cy="196.0" r="3" fill="#d62728"><title>b 2: 1</title>'
              "</circle>"
            + '<text x="56" y="38" fill="#1f77b4" font-size="12">&#9632; a</text>'
            + '<text x="94" y="38" fill="#d62728" font-size="12">&#9632; b</text></svg>')
    assert got == want


def test_a_line_chart_with_negative_values_and_one_x():
    """y ticks from min(0, -2) to 3 × 1.05: raw 1.3 → step 2: -2..4; one x value sits at PAD
    (its span counts as 1); the default y title is "value"."""
    got = svg.line_chart("N", {"s": [(5, -2.0), (5, 3.0)]}, "x")
    assert 'class="axis-title" transform="rotate(-90 14 140.0)">value</text>' in got
    for y, label in ((224, "-2"), (168, "0"), (112, "2"), (56, "4")):
        assert _ytick(y, label) in got
    assert 'points="56.0,224.0 56.0,84.0"' in got        # 224 - 5 / 6 × 168
    assert "<title>s 5: -2</title>" in got and "<title>s 5: 3</title>" in got


def test_the_sixth_series_takes_the_first_colour_again():
    got = svg.line_chart("C", {f"s{i}": [(i, 1.0)] for i in range(6)}, "x")
    strokes = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd"]
    order = [got[i + len('<polyline fill="none" stroke="'):][:7]
             for i in range(len(got)) if got.startswith('<polyline fill="none" stroke="', i)]
    assert order == strokes + ["#1f77b4"]


def test_empty_charts_say_so():
    assert svg.line_chart("a<b", {"s": [(1, None)]}, "x") == "<p>a&lt;b: no data</p>"
    assert svg.line_chart("t", {}, "x") == "<p>t: no data</p>"
    assert svg.bar_chart("a<b", []) == "<p>a&lt;b: no data</p>"
    assert svg.bar_chart("t", [("r", {"a": None, "b": 0})]) == "<p>t: no positive values</p>"
    assert svg.bar_chart("t", [("r", {"a": -1.0})]) == "<p>t: no positive values</p>"


def _xgrid(x: float, label: str, y0: int, y1: int) -> str:
    return (f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{y0}" y2="{y1 + 4}" stroke="#ddd"/><text '
            f'x="{x:.1f}" y="{y1 + 16}" font-size="11" text-anchor="middle" class="tick">'
            f"{label}</text>")


def test_a_whole_linear_bar_chart():
    """Ticks nice_ticks(0, 5) = 0..6 by 2; x = 190 + v / 6 × 346; height 52 + 2 rows × 13 ×
    (2 series + 1) + 44 = 174; a zero is written "0 (exact)", a None leaves its slot empty."""
    got = svg.bar_chart("B", [("r1", {"a": 2.0, "b": None}), ("r2", {"a": 0, "b": 5.0})],
                        xlabel="v", ylabel="r")
    want = (_frame("B", "v", "r", 174)
            + '<text x="190" y="38" fill="#1f77b4" font-size="12">&#9632; a</text>'
            + '<text x="228" y="38" fill="#d62728" font-size="12">&#9632; b</text>'
            + '<line x1="190" x2="536" y1="134" y2="134" stroke="#888"/>'
            + _xgrid(190, "0", 48, 134) + _xgrid(190 + 346 / 3, "2", 48, 134)
            + _xgrid(190 + 2 * 346 / 3, "4", 48, 134) + _xgrid(536, "6", 48, 134)
            + '<text x="184" y="68" font-size="11" text-anchor="end">r1</text>'
            + '<rect x="190" y="52" width="115.3" height="10" fill="#1f77b4"><title>a: 2'
              "</title></rect>"
            + '<text x="184" y="107" font-size="11" text-anchor="end">r2</text>'
            + '<text x="193" y="100" font-size="10" fill="#1f77b4">0 (exact)</text>'
            + '<rect x="190" y="104" width="288.3" height="10" fill="#d62728"><title>b: 5'
              "</title></rect></svg>")
    assert got == want


def test_a_whole_log_bar_chart():
    """log10 values -6 and -2: decade_ticks(-6.5, -2) = -7..-2; x = 190 + (e + 7) / 5 × 346;
    height 52 + 13 × 3 + 44 = 135."""
    got = svg.bar_chart("L", [("x", {"e": 1e-6, "t": 1e-2})], log=True)
    ticks = "".join(_xgrid(190 + k * 69.2, f"1e-{7 - k}", 48, 95) for k in range(6))
    want = (_frame("L", "", "", 135)
            + '<text x="190" y="38" fill="#1f77b4" font-size="12">&#9632; e</text>'
            + '<text x="228" y="38" fill="#d62728" font-size="12">&#9632; t</text>'
            + '<line x1="190" x2="536" y1="95" y2="95" stroke="#888"/>' + ticks
            + '<text x="184" y="68" font-size="11" text-anchor="end">x</text>'
            + '<rect x="190" y="52" width="69.2" height="10" fill="#1f77b4"><title>e: 1e-06'
              "</title></rect>"
            + '<rect x="190" y="65" width="346.0" height="10" fill="#d62728"><title>t: 0.01'
              "</title></rect></svg>")
    assert got == want


def test_a_log_axis_through_one_is_labelled_1():
    """Values 0.5 and 20: decade_ticks(log10 0.5 - 0.5, log10 20) = -1..2; tick 0 reads "1"."""
    got = svg.bar_chart("L", [("x", {"a": 0.5, "b": 20.0})], log=True)
    labels = [got[i + len('class="tick">'):].split("<")[0]
              for i in range(len(got)) if got.startswith('class="tick">', i)]
    assert labels == ["1e-1", "1", "1e1", "1e2"]


def test_a_bar_under_one_pixel_is_drawn_one_pixel_wide():
    """0.001 on a 0..100 axis (ticks by 25) is 0.0035 px: drawn 1 px wide, still titled."""
    got = svg.bar_chart("S", [("a", {"s": 0.001}), ("b", {"s": 100.0})])
    assert ('<rect x="190" y="52" width="1.0" height="10" fill="#1f77b4"><title>s: 0.001'
            "</title></rect>") in got
    assert ('<rect x="190" y="78" width="346.0" height="10" fill="#1f77b4"><title>s: 100'
            "</title></rect>") in got
    assert '<text x="184" y="62" font-size="11" text-anchor="end">a</text>' in got


def test_labels_and_names_are_escaped():
    got = svg.bar_chart("t<1>", [("a&b", {"s<": 1.0})], xlabel="x<", ylabel="y>")
    assert 'aria-label="t&lt;1&gt;"' in got and ">a&amp;b</text>" in got
    assert "&#9632; s&lt;</text>" in got and "<title>s&lt;: 1</title>" in got
    assert 'class="axis-title">x&lt;</text>' in got and ">y&gt;</text>" in got


def test_a_line_chart_of_zeros_spans_0_to_1():
    """max y 0: the axis runs to 1 (nice_ticks(0, 1): raw 0.25 → 0..1 by 0.25); y = 224 - y ×
    168."""
    got = svg.line_chart("Z", {"s": [(1, 0.0), (2, 0.0)]}, "x")
    for y, label in ((224, "0"), (182, "0.25"), (140, "0.5"), (98, "0.75"), (56, "1")):
        assert _ytick(y, label) in got
    assert 'points="56.0,224.0 504.0,224.0"' in got


def test_a_log_axis_starts_half_a_decade_below_the_smallest_value():
    """log10 5e-6 = -5.30: the axis starts at floor(-5.80) = -6 (a whole decade lower would
    be -7); it ends at the largest value's decade, -2."""
    got = svg.bar_chart("L", [("x", {"a": 5e-6, "b": 1e-2})], log=True)
    labels = [got[i + len('class="tick">'):].split("<")[0]
              for i in range(len(got)) if got.startswith('class="tick">', i)]
    assert labels == ["1e-6", "1e-5", "1e-4", "1e-3", "1e-2"]


def test_an_exact_zero_is_written_in_its_series_colour():
    """Rows 13 px apart from y = 52; the text sits 9 px below its row's top."""
    got = svg.bar_chart("Z", [("r", {"a": 1.0, "b": 0.0, "c": 0})])
    assert ('<text x="193" y="74" font-size="10" fill="#d62728">0 (exact)</text>'
            '<text x="193" y="87" font-size="10" fill="#2ca02c">0 (exact)</text>') in got


def test_legend_entries_are_spaced_by_their_names():
    """Each entry moves the next 7.5 px a letter + 30: 56, 56 + 45, 101 + 52.5."""
    got = svg.line_chart("S", {"ab": [(1, 1.0)], "cde": [(1, 1.0)], "f": [(1, 1.0)]}, "x")
    assert ('<text x="56" y="38" fill="#1f77b4" font-size="12">&#9632; ab</text>'
            '<text x="101" y="38" fill="#d62728" font-size="12">&#9632; cde</text>'
            '<text x="154" y="38" fill="#2ca02c" font-size="12">&#9632; f</text></svg>') in got
