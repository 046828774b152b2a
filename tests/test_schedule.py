"""The adaptive block-size schedule: the rule, its dependence on the past only, and the engine
running it (greedy output schedule-independent; choices made before the step's noise)."""

from __future__ import annotations

import math
import random

import pytest
import torch

from dflash2rt import get_backend
from dflash2rt.engine.engine import Engine
from dflash2rt.engine.request import Request, SamplingParams
from dflash2rt.engine.policy.adaptive import AdaptivePolicy
from dflash2rt.engine.policy.acceptance import ALPHA_CAP, ROW_WEIGHT
from dflash2rt.engine.policy.schedule import (AdaptiveSchedule, add_measured_begin_listener,
                                              default_candidates)
from dflash2rt.engine.policy.table import MIN_STEPS, POOL_MIN, bucket_of
from dflash2rt.errors import InvalidInputError

from fake_clock import Clock
from tiny_models import oracle_pair, tiny_pair

CANDS = (1, 2, 4, 8)
COSTS = {1: 1.0, 2: 1.6, 4: 1.8, 8: 2.2}        # a spec step costs more than a target-only one


def _drive(s, rows, accept, steps=40):
    """Choose and observe ``steps`` times; ``accept(b)``: drafts accepted at block b."""
    chosen = []
    for _ in range(steps):
        b = s.choose(rows)
        chosen.append(b)
        s.observe(rows, b, [accept(b) if b > 1 else 0 for _ in rows], 0.0)
    return chosen


def test_default_candidates_and_buckets():
    assert default_candidates(8) == (1, 2, 4, 8, 16)
    assert default_candidates(6) == (1, 2, 4, 6, 12)
    assert default_candidates(2) == (1, 2, 4)
    assert [bucket_of(n) for n in (1, 2, 3, 4, 5, 33)] == [1, 2, 4, 4, 8, 64]
    with pytest.raises(InvalidInputError):
        AdaptiveSchedule((0, 2))


def test_expected_committed_tokens():
    s = AdaptiveSchedule(CANDS, COSTS, prior=0.5)
    assert s.expected("r", 1) == 1.0
    assert s.expected("r", 4) == pytest.approx(1 + 0.5 + 0.25 + 0.125)


def test_unreached_slots_expect_what_the_last_reached_slot_did():
    """A chain that always breaks at slot 1 never reaches slots 2..7: they take slot 1's
    estimate as their prior, not the optimistic prior (which kept a failing block 8 looking
    worth 2.6 tokens a step and made batches of sampled requests speculate at a loss)."""
    s = AdaptiveSchedule(CANDS, COSTS, prior=0.8)
    for _ in range(6):
        s.observe(["r"], 8, [0])
    a1 = s.alpha("r", 1)
    assert a1 < 0.2
    assert [s.alpha("r", j) for j in range(2, 8)] == pytest.approx([a1] * 6)
    assert s.expected("r", 8) == pytest.approx(sum(a1 ** j for j in range(8)))
    s.observe(["q"], 8, [7])                        # every slot reached and accepted once
    assert all(s.alpha("q", j) > 0.8 for j in range(1, 8))


def test_no_acceptance_picks_target_only_full_acceptance_picks_the_largest_block():
    rows = ["a", "b"]
    never = _drive(AdaptiveSchedule(CANDS, COSTS), rows, lambda b: 0)
    assert never[-10:].count(1) >= 8                       # 1, and rare probes
    always = _drive(AdaptiveSchedule(CANDS, COSTS), rows, lambda b: b - 1)
    assert always[-10:] == [8] * 10


def test_probes_back_off_while_speculation_keeps_failing():
    chosen = _drive(AdaptiveSchedule(CANDS, COSTS), ["a"], lambda b: 0, steps=200)
    probes = [i for i, b in enumerate(chosen) if b > 1 and i > 5]
    gaps = [j - i for i, j in zip(probes, probes[1:])]
    assert probes and gaps == sorted(gaps) and gaps[-1] > gaps[0]


def test_acceptance_change_is_tracked():
    s, flip = AdaptiveSchedule(CANDS, COSTS), {"good": True}
    first = _drive(s, ["a"], lambda b: b - 1 if flip["good"] else 0, 20)
    flip["good"] = False
    later = _drive(s, ["a"], lambda b: b - 1 if flip["good"] else 0, 40)
    assert first[-1] == 8 and later[-10:].count(1) >= 7


def test_choices_depend_only_on_the_past():
    """Replaying one outcome history (and the timing, which observe ignores) gives the same
    choices: nothing but committed outcomes and the cost table enters a decision."""
    def run(seed, timings):
        g, s = random.Random(seed), AdaptiveSchedule(CANDS, {1: 1.0, 2: 1.9, 4: 2.5, 8: 4.0})
        out = []
        for t in timings:
            rows = ["x", "y", "z"][:1 + len(out) % 3]
            b = s.choose(rows)
            out.append(b)
            s.observe(rows, b, [g.randrange(b) * (g.random() < 0.6) for _ in rows], t)
        return out

    a = run(7, [0.01] * 60)
    assert a == run(7, [random.random() for _ in range(60)])
    assert len(set(a)) > 1


def test_measured_table_is_calibrated_then_frozen():
    s = AdaptiveSchedule((1, 4), reps=2)
    with pytest.raises(InvalidInputError, match="calibrate"):
        s.choose(["a"])
    assert s.calibrate(1) == [1, 4]
    for b, sec in ((1, 3.0), (4, 5.0), (1, 2.0), (4, 4.0), (1, 0.001)):
        s.measure(b, 1, sec)
    assert s.calibrate(1) == [] and s.costs == {(1, 1): 2.5, (4, 1): 4.5}     # medians
    s.observe(["a"], 4, [3], 1e-9)                           # decode steps never move the table
    assert s.costs == {(1, 1): 2.5, (4, 1): 4.5} and s.calibrate(2) == [1, 4]
    s.begin("sampled")                     # a sampled batch's steps are timed on their own
    assert s.calibrate(1) == [1, 4] and s.costs == {}
    for b, sec in ((1, 6.0), (1, 7.0), (4, 9.0), (4, 8.0)):
        s.measure(b, 1, sec)
    assert s.costs == {(1, 1): 6.5, (4, 1): 8.5}
    s.begin("greedy")
    assert s.costs == {(1, 1): 2.5, (4, 1): 4.5}
    with pytest.raises(InvalidInputError, match="mode"):
        s.begin("fast")


def test_finish_time_rule_waits_for_the_slowest_row():
    """With remaining budgets, the batch's projected time to finish decides: a spec block that
    the rate rule takes (two rows accept everything, one nothing) loses when the batch must
    wait for the row that accepts nothing; at batch 1 the rule is the rate rule, except that
    a last token is a target-only step."""
    costs = {1: 1.0, 2: 1.2, 4: 1.3, 8: 1.5}
    s = AdaptiveSchedule(CANDS, costs, prior=0.5)
    for _ in range(30):
        s.observe(["fast1", "fast2", "slow"], 8, [7, 7, 0])
    rows = ["fast1", "fast2", "slow"]
    assert max(s.scores(rows), key=s.scores(rows).get) == 8          # rate: 15+ tokens / 1.5
    fin = s.finish_scores(rows, [64, 64, 64])
    assert max(fin, key=fin.get) == 1                                 # the slow row rules
    assert s.choose(rows, [64, 64, 64]) == 1
    fast = s.finish_scores(["fast1", "fast2"], [64, 64])
    assert max(fast, key=fast.get) == 8
    one = AdaptiveSchedule(CANDS, costs, prior=0.9)
    r1, r64 = one.finish_scores(["a"], [1]), one.finish_scores(["a"], [64])
    assert max(r1, key=r1.get) == 1 and max(r64, key=r64.get) == max(
        one.scores(["a"]), key=one.scores(["a"]).get)
    with pytest.raises(InvalidInputError, match="budgets"):
        s.finish_scores(rows, [1])


def _reqs(prompts, n_new=16, **kw):
    return [Request(p, SamplingParams(max_new_tokens=n_new, ignore_eos=True, **kw), key=i)
            for i, p in enumerate(prompts)]


def test_choice_is_made_before_the_step_noise_is_drawn(monkeypatch):
    """Per decode step: choose, then the step's noise (a calibration step's noise is drawn under
    other keys and its results are discarded)."""
    pair, backend = oracle_pair(4), get_backend("cpu")
    engine, events = Engine(pair, backend), []
    engine.generate(_reqs([(1, 2)], 4, temperature=1.0))             # calibrates bucket 1
    noise, choose = backend.noise, engine.policy.schedule.choose
    monkeypatch.setattr(backend, "noise", lambda *a: events.append("noise") or noise(*a))
    monkeypatch.setattr(engine.policy.schedule, "choose",
                        lambda rows, rem=None: events.append("choose") or choose(rows, rem))
    _, stats = engine.generate(_reqs([(1, 2)], 20, temperature=1.0))
    assert stats.calibration_steps == 0 and events.count("choose") == stats.steps
    spec_steps = stats.steps - stats.block_sizes.get(1, 0)
    assert events.count("noise") == spec_steps > 0
    seq = "".join(e[0] for e in events)                           # c: choose, n: noise
    assert seq.startswith("c") and all(seq[i - 1] == "c" for i, e in enumerate(seq) if e == "n")


def test_greedy_output_is_schedule_independent_on_the_bundled_pair():
    from dflash2rt.api import resolve_model

    pair = resolve_model("stdlib-code")
    prompts = [tuple(pair.tokenizer.encode(t)) for t in ("def f(x):", "import os\n")]
    engine = Engine(pair, get_backend("cpu"))
    adaptive, stats = engine.generate(_reqs(prompts, 24))
    target, _ = engine.generate(_reqs(prompts, 24), spec=False)
    fixed, _ = engine.generate(_reqs(prompts, 24), block_size=8)
    assert [o.token_ids for o in adaptive] == [o.token_ids for o in target] == \
        [o.token_ids for o in fixed]
    assert stats.adaptive and stats.block_size == 16 and sum(stats.block_sizes.values()) == \
        stats.steps
    assert set(stats.costs) == {1, 2, 4, 8, 16} and all(2 in v for v in stats.costs.values())


def test_sampled_adaptive_run_reports_its_block_sizes():
    """T=1 on the bundled pair (low acceptance): runs, reports the sizes and the cost table."""
    from dflash2rt.api import resolve_model

    pair = resolve_model("stdlib-code")
    engine = Engine(pair, get_backend("cpu"))
    reqs = _reqs([tuple(pair.tokenizer.encode("def f(x):"))], 32, temperature=1.0, seed=3)
    outs, stats = engine.generate(reqs)
    again, st2 = engine.generate(_reqs([reqs[0].prompt_ids], 32, temperature=1.0, seed=3))
    assert len(outs[0].token_ids) == 32 == len(again[0].token_ids)
    assert st2.calibration_steps == 0 and set(st2.costs) == set(stats.costs)
    assert stats.adaptive and set(stats.block_sizes) <= {1, 2, 4, 8, 16}
    assert sum(stats.block_sizes.values()) == stats.steps == stats.syncs
    assert set(stats.costs) == {1, 2, 4, 8, 16} and stats.calibration_steps in (0, 30)  # shared
    assert stats.committed == sum(a + 1 for a in range(len(stats.accept_hist))
                                  for _ in range(stats.accept_hist[a]))


def test_fixed_cost_table_makes_engines_agree():
    """Two engines given one fixed table choose alike: seeded sampled output equal."""
    pair = tiny_pair("dflash2", block=4, seed=1)
    reqs = lambda: _reqs([(1, 2, 3), (4, 5)], 12, temperature=0.8, seed=5)   # noqa: E731
    outs = []
    for _ in range(2):
        engine = Engine(pair, get_backend("cpu"))
        engine.policy = AdaptivePolicy((1, 2, 4), {1: 1.0, 2: 1.2, 4: 1.3})
        o, stats = engine.generate(reqs())
        outs.append([x.token_ids for x in o])
        assert stats.calibration_steps == 0 and stats.costs == {1: {0: 1.0}, 2: {0: 1.2},
                                                                4: {0: 1.3}}
    assert outs[0] == outs[1]
    with torch.inference_mode():
        assert engine.policy.schedule.choose([0, 1]) in (1, 2, 4)


def test_engines_given_one_table_share_what_it_measured():
    """The measured table is its owner's (``Engine.table``; the api keeps one per pair and
    device, ``measured_table``): a second engine given the first one's table (here on another
    backend) calibrates nothing and decides with the table as the first engine's steps left
    it; two policies over that table with ``track=0`` sample alike. An engine with a table of
    its own calibrates again."""
    from dflash2rt.api import measured_table

    pair = tiny_pair("dflash2", block=4, seed=2, dtype=torch.float32)
    reqs = lambda: _reqs([(1, 2, 3), (4, 5)], 12, temperature=0.8, seed=5)   # noqa: E731
    first = Engine(pair, get_backend("cpu"), table=measured_table(pair, "cpu"))
    _, sa = first.generate(reqs())
    table = first.table
    assert first.policy.table is table and measured_table(pair, "cpu") is table
    cands = first.policy.schedule.candidates
    now = AdaptiveSchedule(cands, table=table)
    now.begin("sampled")
    want: dict = {}
    for (b, k), c in now.costs.items():
        want.setdefault(b, {})[k] = c
    second = Engine(pair, get_backend("cpu-nofp64"), table=table)
    _, sb = second.generate(reqs())
    assert second.policy.table is table
    assert sa.calibration_steps > 0 and sb.calibration_steps == 0 and sb.costs == want
    outs = []
    for name in ("cpu", "cpu-nofp64"):
        engine = Engine(pair, get_backend(name))
        engine.policy = AdaptivePolicy(cands, track=0.0, table=table)
        outs.append([o.token_ids for o in engine.generate(reqs())[0]])
    assert outs[0] == outs[1]
    _, own = Engine(pair, get_backend("cpu")).generate(reqs())
    assert own.calibration_steps > 0


def test_table_follows_observed_steps_between_calls_never_within():
    """``observe`` keeps a call's step seconds; only ``end`` moves the table (``track`` of the
    way to the call's median), for entries with MIN_STEPS steps; an entry the call did not run
    is its calibration times the bucket's drift (observed / calibrated); ``track=0``: frozen."""
    def calibrated(track):
        s = AdaptiveSchedule((1, 4), reps=1, track=track)
        s.measure(1, 1, 2.0)
        s.measure(4, 1, 4.0)
        s.measure(1, 2, 3.0)
        s.begin("greedy")
        return s

    s = calibrated(0.5)
    rows = ["a"]
    for _ in range(MIN_STEPS):
        s.observe(rows, 1, [0], 6.0)
        s.observe(["a", "b"], 4, [0, 0], 100.0)      # bucket 2: no calibration of block 4
        assert s.costs == {(1, 1): 2.0, (1, 2): 3.0, (4, 1): 4.0} and s.cost(1, 1) == 2.0
    s.observe(rows, 4, [1], 50.0)                    # fewer than MIN_STEPS: not folded
    s.end()
    assert s.costs == {(1, 1): 2.0, (1, 2): 3.0, (4, 1): 4.0}      # the call's table
    s.begin("greedy")
    assert s.costs == {(1, 1): 4.0, (1, 2): 3.0, (4, 1): 8.0}      # 2 + 0.5·(6 − 2); 4 × 2
    s.begin("sampled")
    assert s.costs == {}                             # another mode's entries are apart
    s.end()
    frozen = calibrated(0.0)
    for _ in range(MIN_STEPS):
        frozen.observe(rows, 1, [0], 6.0)
    frozen.end()
    frozen.begin("greedy")
    assert frozen.costs == {(1, 1): 2.0, (1, 2): 3.0, (4, 1): 4.0}
    with pytest.raises(InvalidInputError, match="track"):
        AdaptiveSchedule((1, 4), track=1.5)


def test_a_slow_target_only_step_turns_the_choice_after_one_call():
    """The measured failure: target-only calibrated cheap, then running slower than the spec
    block pays back. Before the fold the rate rule takes target-only; after one call whose
    target-only steps ran at 3x the calibration, it takes speculation."""
    s = AdaptiveSchedule((1, 4), reps=1, prior=0.5, prior_weight=1e9)
    s.measure(1, 1, 1.0)
    s.measure(4, 1, 2.0)
    s.begin("greedy")
    assert s.choose(["a"]) == 1                      # E[4] = 1.875 over 2.0 < 1 over 1.0
    for _ in range(MIN_STEPS):
        s.observe(["a"], 1, [0], 3.0)
    s.end()
    s.begin("greedy")
    assert s.cost(1, 1) == 2.0 and s.cost(4, 1) == 4.0     # drift scales the unobserved one
    s2 = AdaptiveSchedule((1, 4), reps=1, prior=0.5, prior_weight=1e9, track=1.0)
    s2.measure(1, 1, 1.0)
    s2.measure(4, 1, 2.0)
    s2.begin("greedy")
    for _ in range(MIN_STEPS):
        s2.observe(["a"], 1, [0], 3.0)
        s2.observe(["a"], 4, [1], 2.5)
    s2.end()
    s2.begin("greedy")
    assert s2.costs == {(1, 1): 3.0, (4, 1): 2.5} and s2.choose(["a"]) == 4


def test_finish_rule_counts_the_last_steps_exactly():
    """Near a row's end a block that may finish it in one step beats a cheaper one that
    cannot: with α = 0.85 and 6 tokens left, ⌈6 / E⌉ is 2 steps for both block 8 and block 4
    (so the cheaper block 4 would win), while block 8 finishes in one step with probability
    0.85⁵ ≈ 0.44 and needs ≈ 1.6 steps in expectation. The exact count is the recurrence
    S(n) = 1 + Σ_k P(commit k)·S(n − k), checked against a direct enumeration."""
    s = AdaptiveSchedule(CANDS, {1: 1.0, 2: 1.2, 4: 1.3, 8: 1.5}, prior=0.85, prior_weight=1e9)
    assert s.expected("a", 8) < 6 and math.ceil(6 / s.expected("a", 4)) == 2
    fin = s.finish_scores(["a"], [6])
    assert max(fin, key=fin.get) == 8 and s.choose(["a"], [6]) == 8

    def enumerate_steps(n, block, a=0.85):              # E[steps] by direct expansion
        if n <= 0:
            return 0.0
        probs = [a ** (k - 1) * (1 - a) for k in range(1, block)] + [a ** (block - 1)]
        return 1.0 + sum(p * enumerate_steps(n - k, block) for k, p in enumerate(probs, 1))
    for block, n in ((8, 6), (4, 6), (2, 5), (1, 3), (8, 1)):
        assert s.steps_to_finish("a", block, n) == pytest.approx(enumerate_steps(n, block))
    assert s.steps_to_finish("a", 8, 1) == 1.0
    assert s.steps_to_finish("a", 4, 1000) == math.ceil(1000 / s.expected("a", 4))


def test_pooled_acceptance_is_the_prior_of_the_next_calls_requests():
    """A call's per-slot acceptance counts, pooled per sampling mode by ``end``, are the prior of
    the next calls' requests: one early rejection no longer makes a new request's deep slots
    look hopeless (the chain alone drops them to the rejected slot's estimate and the rate rule
    shrinks the block). Nothing moves within a call, and ``track=0`` pools nothing."""
    def run(track):
        s = AdaptiveSchedule(CANDS, COSTS, track=track)
        s.begin("greedy")
        for i in range(POOL_MIN):                   # a call whose requests accept everything
            s.observe([i], 8, [7], None)
        before = s.alphas("new", 7)
        s.end()
        s.begin("greedy")
        assert s.alphas("new", 7) != before or track == 0
        assert s.alphas("new", 7) == ([ALPHA_CAP] * 7 if track else before)   # the pool, capped
        s.observe(["new"], 8, [1], None)             # slot 2 rejected at the first step
        return s

    pooled, plain = run(0.5), run(0.0)
    deep = pooled.alphas("new", 7)
    assert deep == [deep[0]] * 7 and 0.9 < deep[0] < 1.0       # every slot a little lower
    assert plain.alphas("new", 7)[2] == plain.alphas("new", 7)[1] < 0.5   # the chain
    assert pooled.choose(["new"]) == 8 and plain.choose(["new"]) < 8
    pooled.begin("sampled")                         # the greedy pool is not the sampled one
    assert pooled.alphas("x", 3) == AdaptiveSchedule(CANDS, COSTS).alphas("x", 3)


def _pooled(profile, cands=CANDS, costs=COSTS, mode="greedy"):
    """A schedule whose pool holds ``profile`` (per slot, reached by every step) exactly."""
    s = AdaptiveSchedule(cands, costs, track=0.5)
    s.begin(mode)
    n = 64 * POOL_MIN
    s._counts = ([p * n for p in profile], [float(n)] * len(profile))
    s.end()
    s.begin(mode)
    return s


@pytest.mark.parametrize("profile", [[0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3], [0.95] * 3,
                                     [0.5, 0.99, 0.2]])
def test_a_row_scales_the_pooled_profile_by_its_own_evidence(profile):
    """With a pool, a row's α is the pooled profile (chained past its last slot) times one
    factor: its accepted drafts over what the profile expected of the slots it reached, each
    with ``ROW_WEIGHT`` of prior. Rejections lower it, acceptances raise it (never to 1), the
    profile's shape stays, and a long run at half the profile's rates moves the factor well
    below 1 (not all the way: counts are forgotten step by step, and the prior stays)."""
    s = _pooled(profile)
    fresh = s.alphas("fresh", 7)
    assert fresh == pytest.approx(profile + [profile[-1]] * (7 - len(profile)))
    s.observe(["bad"], 8, [0])                       # slot 1 rejected
    s.observe(["good"], 8, [7])                      # every draft accepted
    bad, good = s.alphas("bad", 7), s.alphas("good", 7)
    want = ROW_WEIGHT / (profile[0] + ROW_WEIGHT)
    assert bad == pytest.approx([min(a * want, ALPHA_CAP) for a in fresh])
    assert all(g >= f for g, f in zip(good, fresh)) and max(good) <= ALPHA_CAP < 1.0
    assert all(b < f for b, f in zip(bad, fresh))
    rng = random.Random(0)
    for _ in range(400):                             # a row that accepts at half the profile
        k = 0
        while k < 7 and rng.random() < fresh[k] / 2:
            k += 1
        s.observe(["half"], 8, [k])
    ratio = [h / f for h, f in zip(s.alphas("half", 7), fresh)]
    assert ratio == pytest.approx([ratio[0]] * 7) and 0.4 < ratio[0] < 0.8


def test_a_chance_rejection_does_not_drive_a_batch_to_target_only_steps():
    """The finish rule prices a batch by its slowest rows. With a pool that says block 8 pays,
    a batch of 16 whose rows each met one early rejection in a step keeps speculating; the
    per-slot chain (no pool), whose one rejection halves a slot, gives up on it."""
    cands, costs = (1, 2, 4, 8), {1: 1.0, 2: 1.6, 4: 2.2, 8: 3.4}   # a batch of 16's steps
    rows = list(range(16))
    outcomes = [7 if r % 4 else r % 3 for r in rows]  # a quarter of the rows reject early
    pooled = _pooled([0.9] * 7, cands, costs)
    chain = AdaptiveSchedule(cands, costs, prior=0.9, without={"pooled_prior"})
    chain.begin("greedy")
    assert pooled.choose(rows, [40] * 16) > 1
    for s in (pooled, chain):
        s.observe(rows, 8, outcomes)
    assert pooled.choose(rows, [40] * 16) > 1
    assert chain.choose(rows, [40] * 16) == 1


def test_replica_decides_as_the_call_did_and_learns_nothing():
    """``replica()``: the call's table as a fixed one and its pool; its own calls move
    neither, while the original's next call has learned from this one."""
    s = AdaptiveSchedule(CANDS, reps=1)
    for b, c in zip(CANDS, (1.0, 1.5, 1.7, 2.0)):
        s.measure(b, 1, c)
    s.begin("greedy")
    for i in range(2 * 8):
        s.observe([i], 8, [i % 8], 1.9)
    twin = s.replica()
    twin.begin("greedy")
    assert twin.costs == s.costs and twin.fixed
    assert twin.alphas("new", 7) == s.alphas("new", 7) and twin.track == 0.0
    s.end()
    twin.observe(["x"], 8, [7], 5.0)
    twin.end()
    twin.begin("greedy")
    s.begin("greedy")
    assert twin.alphas("new", 7) == AdaptiveSchedule(CANDS, COSTS).alphas("new", 7)
    assert s.alphas("new", 7) != twin.alphas("new", 7) and s.cost(8, 1) != 2.0


def test_a_spec_step_after_target_only_steps_is_observed_with_its_catch_up(monkeypatch):
    """The deferred draft context a speculative step catches up after target-only steps is
    part of what that step costs the schedule (so switching is not free in its table); the
    run's per-step timing (``step_time``) keeps the step alone. The engine's clock is a
    virtual one (a microsecond a reading, a second a catch-up), so no real time is measured."""
    from dflash2rt.engine import engine as engine_mod, mode as mode_mod, runner as runner_mod
    from dflash2rt.engine import stages

    class Scripted(AdaptiveSchedule):
        def __init__(self):
            super().__init__((1, 4), {1: 1.0, 4: 1.0})
            self.seen, self.n = [], 0

        def choose(self, rows, remaining=None):
            self.n += 1
            return (1, 1, 4)[(self.n - 1) % 3]

        def observe(self, rows, block, accepted, seconds=None):
            self.seen.append((block, seconds))
            super().observe(rows, block, accepted, seconds)

    clock = Clock(now=0.0, tick=1e-6).install(monkeypatch, engine_mod, mode_mod, runner_mod)
    real = stages.catch_up_draft

    def slow(*a, **k):
        clock.now += 1.0
        return real(*a, **k)

    monkeypatch.setattr(stages, "catch_up_draft", slow)
    engine = Engine(oracle_pair(4), get_backend("cpu"))
    engine.policy = AdaptivePolicy.of(Scripted())
    _, stats = engine.generate(_reqs([(1, 2, 3)], 12))
    spec = [sec for b, sec in engine.policy.schedule.seen if b == 4]
    assert spec and all(sec >= 1.0 for sec in spec)
    n, total = stats.step_time[4][1]
    assert total / n < 0.5 and stats.draft_deferred > 0
    assert stats.time["catch_up"] >= 1.0 * len(spec)


def test_measured_begin_listeners_hear_measured_schedules_only():
    heard: list[AdaptiveSchedule] = []
    remove = add_measured_begin_listener(heard.append)
    try:
        measured = AdaptiveSchedule((1, 2))              # begins once when made
        AdaptiveSchedule((1, 2), costs={1: 1.0, 2: 1.5}).begin("greedy")
        measured.begin("sampled")
    finally:
        remove()
    remove()                                             # a second removal is harmless
    assert heard == [measured, measured]
    AdaptiveSchedule((1, 2)).begin("greedy")             # removed: heard no more
    assert len(heard) == 2
