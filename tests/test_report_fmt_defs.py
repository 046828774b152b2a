"""The report's value formatting against hand-written strings from its documented rules:
numbers at both sides of every threshold, labels, plain-text cells and HTML (tables, lists,
the 80-character list rule, badges), each case alone."""

from __future__ import annotations

import pytest

from dflash2rt.qualify import fmt


@pytest.mark.parametrize("v, want", [
    (True, "yes"), (False, "no"), (0, "0"), (7, "7"), (999, "999"), (1000, "1,000"),
    (-1234567, "-1,234,567"),
    (0.0, "0"), (-0.0, "0"), (float("nan"), "nan"), (float("inf"), "inf"),
    (float("-inf"), "-inf"),
    # 4 significant digits between 1e-3 and 1e6
    (1.0, "1"), (2.5, "2.5"), (3.14159, "3.142"), (-3.14159, "-3.142"), (0.001, "0.001"),
    (0.0012345, "0.001234"), (1234.5678, "1235"), (9999.4, "9999"),
    # from 1e4 (after rounding to 4 digits) to 1e6: 4 significant digits with separators
    (9999.5, "10,000"), (-9999.5, "-10,000"), (10000.0, "10,000"), (12346.0, "12,350"),
    (-12346.0, "-12,350"), (86658.0, "86,660"), (999949.0, "999,900"),
    # scientific, 3 significant digits, below 1e-3 and from 1e6 on (either sign)
    (0.00099949, "0.000999"), (0.00012345, "0.000123"), (7.13e-17, "7.13e-17"),
    (-0.00012345, "-0.000123"), (1e6, "1e+06"), (1234567.0, "1.23e+06"),
    (-1234567.0, "-1.23e+06"), (1e300, "1e+300"),
    ("x", "x"), (None, "None")])
def test_num(v, want):
    assert fmt.num(v) == want


@pytest.mark.parametrize("key, want", [
    ("tau", "τ"), ("chi2", "χ²"), ("dof", "degrees of freedom"), ("p_value", "p-value"),
    ("ar_tokens_per_s", "target-only tok/s"), ("ratio", "sampled / greedy"),
    ("foo_bar_baz", "foo bar baz"), ("a1_b", "a1 b"), ("Foo_Bar", "Foo_Bar"),
    ("L1_x", "L1_x"), ("_", "_"), ("", "")])
def test_label(key, want):
    assert fmt.label(key) == want


@pytest.mark.parametrize("v, want", [
    (None, "–"), ({}, "–"), ([], "none"), ((), "none"), (3, "3"), (True, "yes"),
    (2.5, "2.5"), ("a|b", "a\\|b"), ("a\nb", "a b"), ("a\n|b", "a \\|b"),
    ({"tau": 2.5, "x_y": None}, "τ 2.5, x y –"), ([1, "s", None, 1000], "1, s, –, 1,000"),
    ((True, 0.5), "yes, 0.5"), ([[], {}], "none, –"), ({"a": [1, 2]}, "a 1, 2"),
    (["a|b"], "a\\|b"), ({"k": ["x|y", {"z": "p|q"}]}, "k x\\|y, z p\\|q")])   # once at any depth
def test_text(v, want):
    assert fmt.text(v) == want


@pytest.mark.parametrize("v, want", [
    (None, "–"), ({}, "–"), ([], "none"), ((), "none"),
    (3, '<span class="num">3</span>'), (2.5, '<span class="num">2.5</span>'),
    (True, "yes"), (False, "no"), ("<a&b>", "&lt;a&amp;b&gt;"),
    ([1, "<x>", None, True], "1, &lt;x&gt;, None, yes"), ((1, 2), "1, 2"),
    ({"tau": 1}, '<table class="kv"><tr><th>τ</th><td><span class="num">1</span></td></tr>'
                 "</table>")])
def test_html_scalars_dicts_and_short_lists(v, want):
    assert fmt.html(v) == want


def test_html_list_length_rule():
    """A list of scalars is one line while its numbers' texts total under 80 characters."""
    short = ["a" * 79]
    assert fmt.html(short) == "a" * 79
    at = ["a" * 80]
    assert fmt.html(at) == "<ul><li>" + "a" * 80 + "</li></ul>"
    split = ["a" * 40, "b" * 39]
    assert fmt.html(split) == "a" * 40 + ", " + "b" * 39
    split = ["a" * 40, "b" * 40]
    assert fmt.html(split) == "<ul><li>" + "a" * 40 + "</li><li>" + "b" * 40 + "</li></ul>"
    nums = [1000] * 16                                 # "1,000" * 16: 80 characters
    assert fmt.html(nums) == "<ul>" + '<li><span class="num">1,000</span></li>' * 16 + "</ul>"
    assert fmt.html(nums[:15]) == ", ".join(["1,000"] * 15)


def test_html_lists_that_are_not_all_scalars():
    assert fmt.html([1, [2]]) == ('<ul><li><span class="num">1</span></li><li>2</li></ul>')
    assert fmt.html([{"a": 1}, 2]) == ('<ul><li><table class="kv"><tr><th>a</th><td>'
                                       '<span class="num">1</span></td></tr></table></li>'
                                       '<li><span class="num">2</span></li></ul>')


def test_html_lists_of_dicts_are_tables_with_every_column():
    got = fmt.html([{"b": 1, "a_b": "x"}, {"c": None, "b": 2}])
    assert got == ('<table class=""><tr><th>b</th><th>a b</th><th>c</th></tr>'
                   '<tr><td><span class="num">1</span></td><td>x</td><td>–</td></tr>'
                   '<tr><td><span class="num">2</span></td><td>–</td><td>–</td></tr></table>')


def test_kv_table_and_table():
    assert fmt.kv_table({}) == '<table class="kv"></table>'
    assert fmt.kv_table({"p_value": "<1"}, cls="z") == \
        '<table class="z"><tr><th>p-value</th><td>&lt;1</td></tr></table>'
    assert fmt.table([], ["a"]) == "<p>none recorded</p>"
    rows = [{"r": "not run", "v": 1}, {"v": 2}, {"r": 'a"b', "v": 3}]
    assert fmt.table(rows, ["v"], cls="t", row_cls="r") == (
        '<table class="t"><tr><th>v</th></tr>'
        '<tr class="not-run"><td><span class="num">1</span></td></tr>'
        '<tr><td><span class="num">2</span></td></tr>'
        '<tr class="a&quot;b"><td><span class="num">3</span></td></tr></table>')
    assert fmt.table(rows[:1], ["v"]) == \
        '<table class=""><tr><th>v</th></tr><tr><td><span class="num">1</span></td></tr></table>'


@pytest.mark.parametrize("args, want", [
    (("pass",), '<span class="badge pass">PASS</span>'),
    (("not run",), '<span class="badge not-run">NOT RUN</span>'),
    ((None,), '<span class="badge not-recorded">NOT RECORDED</span>'),
    (("",), '<span class="badge not-recorded">NOT RECORDED</span>'),
    (("fail", "<2>"), '<span class="badge fail">&lt;2&gt;</span>'),
    (("fail", ""), '<span class="badge fail">FAIL</span>')])
def test_badge(args, want):
    assert fmt.badge(*args) == want
