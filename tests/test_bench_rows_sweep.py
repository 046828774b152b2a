"""dflash2rt.bench.rows where a sweep found classes the other tests let through: the numbers of
``compare``, ``measure_rows`` (rows, paired and median speedups, the greedy compare dict, the
adaptive schedule's cost table, the profiling pass and its sampled / greedy ratios, the log
lines) and ``block_sweep`` (the fitted speedup model), each from a scripted engine whose seconds,
acceptances, phase times and outputs are given per call. Expected values worked out by hand."""

from __future__ import annotations

import pytest

from dflash2rt.bench import measure as bm, rows
from dflash2rt.engine.request import RequestOutput
from dflash2rt.engine.stats import RunStats
from dflash2rt.errors import InvalidInputError

T0, T07, T1 = bm.TEMPERATURES


class Scripted:
    """Engine.generate stand-in. A call's mode: "target_only", "fixed" (spec at a block size) or
    "adaptive" (spec, no block size); its number ``n`` counts the earlier calls of the same
    mode, temperature and prompts (0: the warm-up). ``seconds[mode][n]``: the call's timed
    seconds (wall less capture); ``capture[mode]``: capture seconds of every call;
    ``accepted[mode]``: drafts accepted per request at each step (tau = accepted + 1);
    ``phase[mode]``: ``RunStats.time``; ``wrong``: (mode, prompt) pairs whose tokens differ
    from target-only's; ``plan``: prompts the adaptive schedule runs target-only; adaptive
    calls predict ``costs`` {block: {batch: 10 n + first prompt id}}."""

    def __init__(self, seconds, capture=None, accepted=None, phase=None, wrong=(), plan=()):
        self.seconds, self.capture = seconds, capture or {}
        self.accepted = accepted or {"fixed": 3, "adaptive": 1}
        self.phase, self.wrong, self.plan = phase or {}, set(wrong), set(plan)
        self.counts: dict[tuple, int] = {}

    def generate(self, reqs, spec=True, block_size=None):
        mode = "adaptive" if spec and block_size is None else "fixed" if spec else "target_only"
        prompts = tuple(r.prompt_ids for r in reqs)
        key = (mode, block_size, reqs[0].params.temperature, prompts)
        n = self.counts[key] = self.counts.get(key, -1) + 1
        new = reqs[0].params.max_new_tokens
        a = self.accepted.get(mode, 0)
        st = RunStats("spec" if spec else "target-only", "fake", "cpu", block_size or 8,
                      requests=len(reqs))
        st.steps = new // (a + 1)
        for _ in range(st.steps):
            st.record_accepts([a] * len(reqs), (block_size or 3) if spec else 1)
        st.generated = new * len(reqs)
        st.capture_s = self.capture.get(mode, 0.0)
        st.wall_s = self.seconds[mode][min(n, len(self.seconds[mode]) - 1)] + st.capture_s
        st.time.update(self.phase.get(mode, {}))
        if mode == "adaptive":
            st.costs = {4: {len(reqs): float(10 * n + prompts[0][0])}}
            st.call_plan = "short prompt" if prompts[0] in self.plan else ""
        outs = [RequestOutput(p, [7] * new if (mode, p) in self.wrong else list(range(new)))
                for p in prompts]
        return outs, st


class FakeHF:
    """HFGreedy stand-in: target-only's tokens, ``seconds`` per generate() call."""

    def __init__(self, seconds: float = 1.0) -> None:
        self.seconds = seconds

    def generate(self, prompts, max_new, temperature=0.0, top_p=1.0, seed=0):
        return [list(range(max_new)) for _ in prompts], self.seconds


def test_compare_speedups_efficiency_and_mismatches():
    """target-only rounds 2, 4, 1 s for 8 tokens (4, 2, 8 tok/s: median 4); spec 1, 1, 2 s
    (8, 8, 4: median 8), tau 4; transformers 4 s (2 tok/s); spec differs on prompt 1."""
    eng = Scripted({"target_only": [9.0, 2.0, 4.0, 1.0], "fixed": [9.0, 1.0, 1.0, 2.0]},
                   capture={"target_only": 0.25, "fixed": 0.5}, wrong={("fixed", (4, 5))})
    lines: list[str] = []
    res = rows.compare([(1, 2, 3), (4, 5)], eng, FakeHF(4.0), 4, 4, 3, log=lines.append)
    assert (res["target_only_tokens_per_s"], res["spec_tokens_per_s"],
            res["hf_tokens_per_s"]) == (4.0, 8.0, 2.0)
    assert res["speedup_vs_target_only"] == res["speedup_vs_ar"] == 2.0
    assert res["speedup_vs_hf"] == 4.0
    assert res["tau"] == 4.0 and res["efficiency"] == 0.5
    assert res["greedy_equal"] is False and res["mismatched_prompts"] == [1]
    assert res["hf_equal"] is True
    assert res["capture_s"] == {"target_only": 1.0, "spec": 2.0, "hf": 0.0}
    assert lines == ["batch 2: target-only 4.0 tok/s, spec 8.0 tok/s (x2.00, tau 4.00), "
                     "hf 2.0 tok/s"]


# measure_rows, batch 1 over two prompts of 4 new tokens (a round: 8 tokens over 2 calls):
# target-only rounds 1, 2, 4 s a call (4, 2, 1 tok/s: median 2); fixed 0.5, 1, 0.5 s (8, 4, 8:
# median 8, paired ratios 2, 2, 8: median 2, of medians 4); adaptive 1 s (4 tok/s: paired 1, 2,
# 4: median 2, of medians 2); transformers 1 s a call (4 tok/s). Every temperature alike.
ROUNDS = {"target_only": [9.0, 1.0, 2.0, 4.0], "fixed": [9.0, 0.5, 1.0, 0.5],
          "adaptive": [9.0, 1.0, 1.0, 1.0]}
PROMPTS = [(1, 2), (3, 4)]
# profiling pass: the fixed contender's step seconds per round (the machine slows down)
FIXED_STEPS = {0.0: [1.0, 2.0, 4.0], 0.7: [1.1, 2.4, 4.4], 1.0: [1.2, 2.2, 4.8]}


@pytest.fixture
def fake_profile(monkeypatch):
    """profile_steps stand-in: the fixed contender's step seconds from FIXED_STEPS by round, the
    others 3 s (target-only) or 5 s (adaptive); records (temperature, spec, block) per call."""
    calls: list[tuple] = []

    def profile_steps(engine, batches, spec, block=None):
        temp = batches[0][0].params.temperature
        calls.append((temp, spec, block))
        mode = "adaptive" if spec and block is None else "fixed" if spec else "target_only"
        n = sum(1 for c in calls if c == calls[-1]) - 1
        step = FIXED_STEPS[temp][n] if mode == "fixed" else 3.0 if not spec else 5.0
        return {"draft": 0.0, "verify": step, "host": 0.0, "step": step, "steps": 2,
                "tau": 1.0, "block_sizes": {}, "round": n}
    monkeypatch.setattr(rows, "profile_steps", profile_steps)
    return calls


def test_measure_rows_numbers_of_every_row(fake_profile):
    eng = Scripted(ROUNDS, capture={"fixed": 0.5}, wrong={("fixed", (3, 4))}, plan={(3, 4)})
    lines: list[str] = []
    res = rows.measure_rows(eng, {1: PROMPTS}, 4, 4, 3, FakeHF(), log=lines.append)
    assert [(r["temperature"], r["batch"]) for r in res["rows"]] == [
        (t.label, 1) for t in bm.TEMPERATURES]
    for r in res["rows"]:
        c = r["contenders"]
        assert r["tokens"] == 8 and r["prompts"] == 2
        assert [c[k]["tokens_per_s"] for k in ("target_only", "fixed", "adaptive", "hf")] == [
            2.0, 8.0, 4.0, 4.0]
        assert [c[k]["speedup_vs_target_only"] for k in ("target_only", "fixed", "adaptive",
                                                         "hf")] == [1.0, 2.0, 2.0, 2.0]
        assert [c[k]["speedup_of_medians"] for k in ("target_only", "fixed", "adaptive",
                                                     "hf")] == [1.0, 4.0, 2.0, 2.0]
        assert c["fixed"]["block_size"] == 4
        assert "block_size" not in c["adaptive"] and "block_size" not in c["target_only"]
        # the schedule's table: the last timed call's (prompt 3, round 3); every timed call
        # of prompt (3, 4) ran target-only by plan
        ad = c["adaptive"]
        assert ad["cost_table_s"] == {"4": {"1": 33.0}}
        assert (ad["target_only_calls"], ad["calls"]) == (3, 6)
        for k in ("target_only", "fixed", "hf"):
            assert not {"cost_table_s", "target_only_calls", "calls"} & set(c[k])
        assert c["fixed"]["capture_s"] == 0.5 * 8               # warm-up + 3 rounds, 2 calls
        assert (c["fixed"]["tau"], ad["tau"]) == (4.0, 2.0)
    t0 = res["rows"][0]
    assert t0["greedy_equal"] is False and t0["hf_equal"] is True
    assert t0["mismatched_prompts"] == {"fixed": [1], "adaptive": []}
    assert all(r["greedy_equal"] is None and "mismatched_prompts" not in r
               for r in res["rows"][1:])
    assert lines == [
        "T=0, batch 1: target-only 2.0 tok/s, fixed 8.0 tok/s (x2.00, tau 4.00), adaptive "
        "4.0 tok/s (x2.00, tau 2.00), hf 4.0 tok/s; greedy spec == target-only: False",
        "T=0.7 top-p 0.95, batch 1: target-only 2.0 tok/s, fixed 8.0 tok/s (x2.00, tau 4.00), "
        "adaptive 4.0 tok/s (x2.00, tau 2.00), hf 4.0 tok/s",
        "T=1, batch 1: target-only 2.0 tok/s, fixed 8.0 tok/s (x2.00, tau 4.00), adaptive "
        "4.0 tok/s (x2.00, tau 2.00), hf 4.0 tok/s"]
    # the greedy compare dict of the batch size: T = 0's contenders, fixed as "spec"
    g = res["compare"][1]
    assert (g["target_only_tokens_per_s"], g["spec_tokens_per_s"], g["hf_tokens_per_s"],
            g["adaptive_tokens_per_s"]) == (2.0, 8.0, 4.0, 4.0)
    assert (g["speedup_vs_target_only"], g["speedup_vs_hf"], g["tau"], g["adaptive_tau"],
            g["efficiency"]) == (4.0, 2.0, 4.0, 2.0, 1.0)
    assert (g["greedy_equal"], g["mismatched_prompts"], g["adaptive_greedy_equal"],
            g["hf_equal"], g["tokens"], g["prompts"]) == (False, [1], True, True, 8, 2)
    assert set(g["capture_s"]) == {"target_only", "fixed", "adaptive", "hf"}
    assert g["capture_s"]["fixed"] == 4.0


def test_measure_rows_profiling_pass_and_sampled_over_greedy(fake_profile):
    res = rows.measure_rows(Scripted(ROUNDS), {1: PROMPTS}, 4, 4, 3, log=lambda m: None)
    prof = res["step_profile"]
    assert len(fake_profile) == 3 * 3 * 3          # rounds x temperatures x contenders
    assert [(x["temperature"], x["contender"], x["block_size"]) for x in prof["rows"]] == [
        (t.label, k, b) for t in bm.TEMPERATURES
        for k, b in (("target_only", None), ("fixed", 4), ("adaptive", None))]
    fixed = [x for x in prof["rows"] if x["contender"] == "fixed"]
    assert [(x["step"], x["rounds_step_s"]) for x in fixed] == [
        (2.0, [1.0, 2.0, 4.0]), (2.4, [1.1, 2.4, 4.4]), (2.2, [1.2, 2.2, 4.8])]
    ratios = prof["sampled_over_greedy"]
    assert [(x["temperature"], x["batch"], x["block_size"], x["greedy_step_s"],
             x["sampled_step_s"]) for x in ratios] == [(T07.label, 1, 4, 2.0, 2.4),
                                                       (T1.label, 1, 4, 2.0, 2.2)]
    assert ratios[0]["rounds_ratio"] == pytest.approx([1.1, 1.2, 1.1])
    assert ratios[1]["rounds_ratio"] == pytest.approx([1.2, 1.1, 1.2])
    assert (ratios[0]["ratio"], ratios[1]["ratio"]) == pytest.approx((1.1, 1.2))
    t0 = res["rows"][0]["contenders"]
    assert t0["fixed"]["step_split_s"]["step"] == 2.0
    assert t0["target_only"]["step_split_s"]["step"] == 3.0
    assert prof["method"] == rows.STEP_PROFILE_METHOD


def test_measure_rows_profiles_only_the_named_contenders_for_repeats_rounds(fake_profile):
    res = rows.measure_rows(Scripted(ROUNDS), {1: PROMPTS}, 4, 4, 1, profile=("fixed",),
                            log=lambda m: None)
    assert fake_profile == [(t.temperature, True, 4) for t in bm.TEMPERATURES]   # one round
    prof = res["step_profile"]
    assert [(x["temperature"], x["contender"]) for x in prof["rows"]] == [
        (t.label, "fixed") for t in bm.TEMPERATURES]
    assert [x["rounds_step_s"] for x in prof["rows"]] == [[1.0], [1.1], [1.2]]
    assert [x["ratio"] for x in prof["sampled_over_greedy"]] == pytest.approx([1.1, 1.2])
    for r in res["rows"]:
        c = r["contenders"]
        assert c["target_only"]["step_split_s"] is None and c["adaptive"]["step_split_s"] is None
        assert c["fixed"]["step_split_s"]["rounds_step_s"] == [FIXED_STEPS[
            r["temperature_value"]][0]]


def test_measure_rows_without_the_fixed_profile_has_no_ratio(fake_profile):
    res = rows.measure_rows(Scripted(ROUNDS), {1: PROMPTS}, 4, 4, 1, profile=("adaptive",),
                            log=lambda m: None)
    assert [x["contender"] for x in res["step_profile"]["rows"]] == ["adaptive"] * 3
    assert res["step_profile"]["sampled_over_greedy"] == []


def test_measure_rows_first_temperature_not_greedy(fake_profile):
    """No greedy compare dict and no sampled / greedy ratio unless the first temperature is
    T = 0; the rows still come, without greedy_equal."""
    lines: list[str] = []
    res = rows.measure_rows(Scripted(ROUNDS), {1: PROMPTS}, 4, 4, 1, temperatures=(T1, T07),
                            log=lines.append)
    assert res["compare"] == {}
    assert res["step_profile"]["sampled_over_greedy"] == []
    assert len(res["step_profile"]["rows"]) == 2 * 3
    assert [r["greedy_equal"] for r in res["rows"]] == [None, None]
    assert lines[0] == ("T=1, batch 1: target-only 4.0 tok/s, fixed 8.0 tok/s (x2.00, tau "
                        "4.00), adaptive 4.0 tok/s (x1.00, tau 2.00)")


def test_block_sweep_fitted_model():
    """target-only: 2.5 s wall a call, 0.5 s of it capture, 0.4 s prefill, 4 new tokens:
    t_target = (2.5 - 0.5 - 0.4) / 4 = 0.4 s; spec: 2 steps (tau 2), draft 0.1 + select 0.3
    → 0.2 s a step, verify 0.2 + graphs 0.4 + host 0.6 → 0.6 s a step; predicted speedup
    2 × 0.4 / (0.2 + 0.6) = 1.0; measured: 4 / 1 s over 4 / 2 s = 2.0."""
    phase = {"draft": 0.1, "select": 0.3, "verify": 0.2, "graphs": 0.4, "host": 0.6,
             "prefill": 0.4}
    eng = Scripted({"target_only": [2.0], "fixed": [1.0]},
                   capture={"target_only": 0.5, "fixed": 0.5}, accepted={"fixed": 1},
                   phase={"target_only": phase, "fixed": phase})
    lines: list[str] = []
    out = rows.block_sweep([(1, 2)], eng, 4, (2, 4), 3, log=lines.append)
    for r, b in zip(out, (2, 4)):
        assert r["block_size"] == b and r["tau"] == 2.0
        assert r["t_target_s"] == pytest.approx(0.4)
        assert r["t_draft_s"] == pytest.approx(0.2) and r["t_verify_s"] == pytest.approx(0.6)
        assert r["predicted_speedup"] == pytest.approx(1.0)
        assert r["speedup_vs_target_only"] == r["speedup_vs_ar"] == 2.0
        assert r["capture_s"] == 0.5 * 4
    assert lines == ["block  2: tau 2.00, speedup x2.00 (model x1.00)",
                     "block  4: tau 2.00, speedup x2.00 (model x1.00)"]


@pytest.mark.parametrize("call", [
    lambda eng: rows.compare([], eng, None, 4, 4, 1, log=lambda s: None),
    lambda eng: rows.measure_rows(eng, {2: [], 1: PROMPTS}, 4, 4, 1, log=lambda s: None),
])
def test_an_empty_prompt_list_is_refused_before_any_call(call):
    """Every rate and ratio is per prompt: no prompts is an InvalidInputError naming the
    function, raised before the engine decodes anything (no division by zero)."""
    eng = Scripted(ROUNDS)
    with pytest.raises(InvalidInputError, match="at least one prompt"):
        call(eng)
    assert eng.counts == {}
