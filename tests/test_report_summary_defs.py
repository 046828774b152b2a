"""The report summary (verdict, levels, speed, implementation) against the report contract
written out by hand: each field read from where the report keeps it, one field missing or
changed at a time, counts and ratios computed anew, the texts spelled out."""

from __future__ import annotations

from fractions import Fraction

import pytest

from dflash2rt.qualify.summary import (LEVELS, Level, executed_text, implementation_text,
                                       ops_text, summarize)

NR = "not recorded"


def _report(**conf) -> dict:
    return {"sections": {"conformance": conf}}


def _levels(levels: dict) -> list[Level]:
    return summarize(_report(levels=levels)).levels


def test_level_counts_when_executed_is_not_recorded():
    """executed: the recorded value, else passed + failed + xfailed + xpassed when any of them
    is recorded, else None; skipped never counts."""
    cases = [({"executed": 9, "passed": 1}, 9), ({"executed": 0, "passed": 4}, 0),
             ({"passed": 2}, 2), ({"failed": 3}, 3), ({"xfailed": 4}, 4), ({"xpassed": 5}, 5),
             ({"passed": 1, "failed": 2, "xfailed": 4, "xpassed": 8, "skipped": 16}, 15),
             ({"passed": 0}, 0), ({"skipped": 6}, None), ({}, None)]
    for d, want in cases:
        (lv,) = _levels({"L0": {"result": "pass", **d}})
        assert lv.executed == want, d


def test_level_fields():
    (a, b) = _levels({"L1": {"title": "T", "result": "fail", "passed": 3, "failed": 2,
                             "skipped": 7, "minimum": 4, "reasons": ["r1", "r2"],
                             "note": "n"},
                      "L0": {"note": "only a note"}})
    assert (b.name, b.title, b.result, b.executed, b.minimum, b.passed, b.failed, b.skipped,
            b.why) == ("L1", "T", "fail", 5, 4, 3, 2, 7, "r1; r2")
    assert (a.name, a.title, a.result, a.executed, a.minimum, a.passed, a.failed, a.skipped,
            a.why) == ("L0", "L0", NR, None, None, 0, 0, 0, "only a note")
    (c,) = _levels({"L2": {"reasons": [], "note": "kept"}})
    assert c.why == "kept"


def test_level_order_is_levels_then_the_rest_in_report_order():
    names = [lv.name for lv in _levels({"zz": {}, "graphs": {}, "aa": {}, "L3": {}, "L0": {}})]
    assert names == ["L0", "L3", "graphs", "zz", "aa"]
    only_other = [lv.name for lv in _levels({"x": {}})]
    assert only_other == ["x"]


def test_no_levels_lists_every_level_not_run():
    for r in ({}, _report(), _report(levels={})):
        lv = summarize(r).levels
        assert [x.name for x in lv] == list(LEVELS)
        assert all((x.result, x.executed, x.minimum, x.title) == ("not run", None, None, x.name)
                   for x in lv)


def _speed(e2e: dict):
    return summarize({"sections": {"end_to_end": e2e}}).speed


def test_speed_rows_read_batch_keys_only_sorted_by_number():
    row = {"target_only_tokens_per_s": 10.0, "spec_tokens_per_s": 20.0}
    e2e = {"batch10": row, "batch2": row, "batch": row, "batchx": row, "batch3": 5,
           "rows": [row], "status": "done", "batch1": row, "xbatch4": row}
    assert [s.batch for s in _speed(e2e)] == [1, 2, 10]
    assert _speed({}) == [] and summarize({}).speed == []


def test_speed_fields_and_ratio():
    (s,) = _speed({"batch4": {"target_only_tokens_per_s": 8.0, "spec_tokens_per_s": 20.0,
                              "tau": 3.5, "greedy_equal": False}})
    assert (s.batch, s.target_only, s.speculative, s.ratio, s.tau, s.greedy_equal) == \
        (4, 8.0, 20.0, 2.5, 3.5, False)
    # the recorded ratio wins over the computed one
    (s,) = _speed({"batch1": {"target_only_tokens_per_s": 8.0, "spec_tokens_per_s": 20.0,
                              "speedup_vs_target_only": 7.0}})
    assert s.ratio == 7.0
    (s,) = _speed({"batch1": {"target_only_tokens_per_s": 3.0, "spec_tokens_per_s": 1.0}})
    assert s.ratio == float(Fraction(1, 3))            # the correctly rounded quotient
    for tonly, spec in ((0.0, 5.0), (None, 5.0), (4.0, None)):
        (s,) = _speed({"batch1": {"target_only_tokens_per_s": tonly,
                                  "spec_tokens_per_s": spec}})
        assert s.ratio is None, (tonly, spec)
    (s,) = _speed({"batch1": {"target_only_tokens_per_s": 4.0, "spec_tokens_per_s": 0.0}})
    assert s.ratio == 0.0
    (s,) = _speed({"batch1": {}})
    assert (s.target_only, s.speculative, s.ratio, s.tau, s.greedy_equal) == (None,) * 5


def test_speed_reads_the_deprecated_keys_only_without_the_new_ones():
    (s,) = _speed({"batch1": {"ar_tokens_per_s": 5.0, "spec_tokens_per_s": 20.0,
                              "speedup_vs_ar": 9.0}})
    assert (s.target_only, s.ratio) == (5.0, 9.0)
    (s,) = _speed({"batch1": {"ar_tokens_per_s": 5.0, "spec_tokens_per_s": 20.0}})
    assert (s.target_only, s.ratio) == (5.0, 4.0)
    (s,) = _speed({"batch1": {"target_only_tokens_per_s": 10.0, "ar_tokens_per_s": 5.0,
                              "spec_tokens_per_s": 20.0, "speedup_vs_target_only": 3.0,
                              "speedup_vs_ar": 9.0}})
    assert (s.target_only, s.ratio) == (10.0, 3.0)


def test_fallbacks_recorded_none_or_merged_in_order():
    assert summarize({}).fallbacks is None
    assert summarize({"fallbacks": []}).fallbacks == []
    assert summarize(_report(implementation={})).fallbacks == []
    assert summarize(_report(implementation={"fallbacks": None})).fallbacks == []
    r = {"fallbacks": ["b", "a", "b"],
         **_report(implementation={"fallbacks": ["c", "a", "d"]})}
    assert summarize(r).fallbacks == ["b", "a", "c", "d"]
    r = _report(implementation={"fallbacks": ["x"]})
    assert summarize(r).fallbacks == ["x"]


def test_implementation_prefers_the_conformance_record():
    sysd = {"kernels": "sk", "graphs": "sg", "device": "sd", "commit": "sc"}
    env = {"device": "ed", "git.commit": "ec"}
    impl = {"kernels": "ik", "graphs": "ig", "ops": {"a": "x"}, "allow_fallback": True}
    s = summarize({"system": sysd, **_report(implementation=impl, environment=env)})
    assert (s.kernels, s.graphs, s.ops, s.allow_fallback, s.device, s.commit) == \
        ("ik", "ig", {"a": "x"}, True, "sd", "sc")
    s = summarize({"system": sysd, **_report(implementation={}, environment=env)})
    assert (s.kernels, s.graphs, s.ops, s.allow_fallback) == ("sk", "sg", None, None)
    s = summarize(_report(environment=env))
    assert (s.kernels, s.graphs, s.device, s.commit) == (None, None, "ed", "ec")
    s = summarize(_report(implementation={"ops": {}}))
    assert s.ops is None


def test_verdict_and_scalars():
    s = summarize({})
    assert (s.backend, s.verdict, s.reasons, s.complete, s.conformance, s.block_size,
            s.quick, s.model, s.errors, s.sampled_over_greedy) == \
        ("?", None, [], False, "not run", None, None, None, [], [])
    r = {"backend": 3, "verdict": {"result": "fail", "reasons": ["r"]}, "complete": 1,
         "quick": False, "model": "m",
         "sections": {"conformance": {"result": "pass", "status": "fail",
                                      "errors": [{"where": "w"}]},
                      "block_sweep": {"recommended_block_size": 0},
                      "end_to_end": {"step_profile": {"sampled_over_greedy": [{"r": 1}]}}}}
    s = summarize(r)
    assert (s.backend, s.verdict, s.reasons, s.complete, s.conformance, s.block_size,
            s.quick, s.model, s.errors, s.sampled_over_greedy) == \
        ("3", "fail", ["r"], True, "pass", 0, False, "m", [{"where": "w"}], [{"r": 1}])
    assert summarize(_report(status="fail")).conformance == "fail"
    assert summarize({"verdict": None}).verdict is None


@pytest.mark.parametrize("ops, want", [
    (None, NR), ({}, NR), ({"a": "k"}, "k (all ops)"), ({"a": "k", "b": "k"}, "k (all ops)"),
    ({"c": "t", "a": "k", "b": "t", "d": "k"}, "t: c, b; k: a, d"),
    ({"a": "k", "b": "t"}, "k: a; t: b")])
def test_ops_text(ops, want):
    s = summarize(_report(implementation={"ops": ops, "kernels": "K"}))
    assert ops_text(s) == want
    assert implementation_text(s) == (want if ops else f"K (per op {NR})")
    assert s.ops_uniform == (want[:-len(" (all ops)")] if want.endswith("(all ops)") else None)


def test_implementation_text_without_kernels():
    assert implementation_text(summarize({})) == f"{NR} (per op {NR})"


@pytest.mark.parametrize("executed, minimum, want", [
    (198, 85, "198 / 85"), (0, 0, "0 / 0"), (None, 3, "– / 3"), (5, None, f"5 / {NR}"),
    (None, None, f"– / {NR}")])
def test_executed_text(executed, minimum, want):
    assert executed_text(Level("L0", "t", "pass", executed, minimum)) == want


def test_level_counts_default_to_zero():
    lv = Level("L0", "t", "pass", None, None)
    assert (lv.passed, lv.failed, lv.skipped, lv.why) == (0, 0, 0, "")
