"""dflash2rt.bench.measure, the one measurement loop of bench, qualify and the training
evaluation: every contender warms up (untimed, same requests) before anything is timed, graph
capture stays out of timed seconds, and the deprecated ``ar`` JSON keys equal the new ones."""

from __future__ import annotations

import json
import statistics

import pytest
import torch

from dflash2rt.bench import measure as bm, profile, rows as bench_rows
from dflash2rt.engine.request import RequestOutput
from dflash2rt.engine.stats import RunStats

from tiny_models import save_pair_dir, tiny_pair

WARM_S, TIMED_S = 100.0, 1.0


class FakeEngine:
    """Engine.generate stand-in: logs every call; the first call of each (mode, block, prompts)
    takes WARM_S seconds (0.5 s of it graph capture), later calls TIMED_S."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.params: list[tuple] = []     # (call key, the requests' SamplingParams)

    def generate(self, reqs, spec=True, block_size=None):
        key = (spec, block_size if spec else None, tuple(r.prompt_ids for r in reqs))
        first = key not in self.calls
        self.calls.append(key)
        self.params.append((key, [r.params for r in reqs]))
        n = reqs[0].params.max_new_tokens
        st = RunStats("spec" if spec else "target-only", "fake", "cpu", block_size or 1,
                      requests=len(reqs))
        st.steps = n // 2 if spec else n
        for _ in range(st.steps):
            st.record_accepts([1 if spec else 0] * len(reqs), (block_size or 3) if spec else 1)
        st.generated = n * len(reqs)
        st.wall_s = WARM_S if first else TIMED_S
        st.capture_s = 0.5 if first else 0.0
        for k in st.time:
            st.time[k] = 0.01 * st.steps
        outs = [RequestOutput(r.prompt_ids, list(range(n))) for r in reqs]
        return outs, st


def test_measure_warms_every_contender_before_timing():
    log: list[tuple[str, int]] = []

    def contender(name):
        def run():
            log.append((name, sum(1 for x in log if x[0] == name)))   # (name, call index)
            call = log[-1][1]
            return [bm.Sample([[call]], WARM_S if call == 0 else TIMED_S, 10)]
        return bm.Contender(name, run)

    m = bm.measure([contender("a"), contender("b"), contender("c")], repeats=3)
    # every contender's first (warm-up) call comes before any contender's timed call
    assert log[:3] == [("a", 0), ("b", 0), ("c", 0)]
    assert [x[0] for x in log[3:]] == ["a", "b", "c"] * 3           # interleaved rounds
    for r in m.values():
        assert r.timed_runs == 3 and len(r.samples) == 3
        assert all(s.outputs != [[0]] for s in r.samples)          # the first call is untimed
        assert r.tokens_per_s == 10 / TIMED_S and r.warmup_s >= 0
    with pytest.raises(ValueError):
        bm.measure([contender("a"), contender("a")], 1)


def test_compare_times_no_first_call_and_reports_capture_apart():
    eng = FakeEngine()
    res = bench_rows.compare([(1, 2, 3)], eng, None, 8, 4, 2, log=lambda m: None)
    # warm-up: one call per mode before any timed call, then 2 interleaved rounds
    assert [c[0] for c in eng.calls] == [False, True, False, True, False, True]
    assert res["target_only_tokens_per_s"] == 8 / TIMED_S                # WARM_S never timed
    assert res["spec_tokens_per_s"] == 8 / TIMED_S
    assert res["capture_s"] == {"target_only": 0.5, "spec": 0.5}
    assert res["tau"] == 2.0 and res["steps"] == 4 and res["greedy_equal"]
    assert set(res["time_split_per_step_s"]) == set(bm.PHASES)


def test_block_sweep_warms_every_block_size_before_timing():
    eng = FakeEngine()
    prompts, blocks = [(1, 2), (3, 4)], (2, 4, 8)
    rows = bench_rows.block_sweep(prompts, eng, 8, blocks, 2, log=lambda m: None)
    n_modes = len(blocks) + 1
    warm = eng.calls[:n_modes * len(prompts)]
    assert len(set(warm)) == len(warm) == n_modes * len(prompts)       # each first call once
    assert {c[1] for c in warm if c[0]} == set(blocks)
    assert all(c in warm for c in eng.calls[len(warm):])                 # timed: all repeats
    assert len(eng.calls) == 3 * len(warm)
    assert [r["block_size"] for r in rows] == list(blocks)
    assert all(r["speedup_vs_target_only"] == 1.0 and r["capture_s"] == 1.0 for r in rows)


def test_deprecated_alias_keys_equal_the_new_keys():
    eng = FakeEngine()
    res = bench_rows.compare([(1, 2, 3)], eng, None, 8, 4, 1, log=lambda m: None)
    rows = bench_rows.block_sweep([(1, 2)], eng, 8, (2, 4), 1, log=lambda m: None)
    from dflash2rt.bench.suite import merge_batch1

    merged = merge_batch1([res, res])
    for d in (res, merged):
        assert d["ar_tokens_per_s"] == d["target_only_tokens_per_s"]
        assert d["speedup_vs_ar"] == d["speedup_vs_target_only"]
    for r in rows:
        assert r["speedup_vs_ar"] == r["speedup_vs_target_only"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    root = save_pair_dir(tmp_path_factory.mktemp("bench") / "model",
                         tiny_pair(dtype=torch.float32))
    (root / "heldout_prompts.json").write_text(json.dumps(["def f(x):", "import os"]))
    return root


def _cpu():
    from dflash2rt.registry import Registry

    return Registry.discover().select("cpu").backend


def test_run_bench_smoke_with_aliases(model_dir):
    """The bench end to end on a tiny pair (no transformers): JSON keys old and new agree."""
    from dflash2rt.api import resolve_model
    from dflash2rt.bench.suite import run_bench

    backend = _cpu()
    pair = resolve_model(model_dir, backend.device)
    res = run_bench(pair, model_dir, backend, max_new=6, repeats=1, blocks=(2, 4), n_prompts=1,
                    with_hf=False, log=lambda m: None)
    json.dumps(res)
    for d in (res, res["batch1"], res["batch8"]):
        assert d["ar_tokens_per_s"] == d["target_only_tokens_per_s"] > 0
        assert d["speedup_vs_ar"] == d["speedup_vs_target_only"] > 0
    assert [r["block_size"] for r in res["sweep"]] == [2, 4]
    assert set(res["capture_s"]) == {"cache_sizing", "batch1", "batch8", "sweep"}
    assert res["tau"] >= 1 and res["tau_t1"] >= 1
    # one row per temperature x batch, every contender, all in the one run
    assert [(r["temperature"], r["batch"]) for r in res["rows"]] == [
        (t.label, b) for b in (1, 8) for t in bm.TEMPERATURES]
    for r in res["rows"]:
        assert set(r["contenders"]) == {"target_only", "fixed", "adaptive"}
        assert r["contenders"]["fixed"]["block_size"] == 8
        assert sum(r["contenders"]["adaptive"]["block_sizes"].values()) > 0
        ad = r["contenders"]["adaptive"]
        assert set(ad["observed_step_s"]) == set(ad["block_sizes"])
        assert set(ad["observed_step_s"]) <= set(ad["cost_table_s"])
        assert 0 <= ad["target_only_calls"] <= ad["calls"] == 1      # one timed call a row
        for c in r["contenders"].values():
            assert c["tokens_per_s"] > 0 and c["tau"] >= 1
            assert set(bm.STEP_PHASES) <= set(c["step_split_s"])
        assert (r["greedy_equal"] is None) == (r["temperature_value"] > 0)
        assert r["tokens"] == 6 * r["prompts"]                   # exactly max_new, EOS ignored
    assert res["greedy_equal_all"] is True
    prof = res["step_profile"]
    assert len(prof["rows"]) == 2 * 3 * 3
    assert [(x["temperature"], x["batch"]) for x in prof["sampled_over_greedy"]] == [
        (t.label, b) for b in (1, 8) for t in bm.TEMPERATURES[1:]]
    assert all(x["ratio"] > 0 for x in prof["sampled_over_greedy"])
    from dflash2rt.bench.suite import profile_table, rows_table

    assert "T=0.7 top-p 0.95, batch 8" in rows_table(res) and "block-8" in rows_table(res)
    assert "sampled / greedy" in profile_table(prof)


def test_training_evaluation_measures_through_the_module(model_dir, monkeypatch):
    """train.evaluate.measure warms spec and target-only up before timing (via bench.measure)
    and keeps its old keys as aliases."""
    from dflash2rt.api import resolve_model
    from dflash2rt.train import evaluate

    seen = []
    real = bm.measure
    monkeypatch.setattr(evaluate, "measure_contenders",
                        lambda cs, repeats: seen.append([c.name for c in cs]) or real(cs, repeats))
    backend = _cpu()
    pair = resolve_model(model_dir, backend.device)
    prompts = [list(range(3, 9)), list(range(10, 15))]
    res = evaluate.measure(pair, backend, prompts, 6, 0.0)
    assert seen == [["spec", "target_only"]]
    assert res["target_tokens_per_s"] == res["target_only_tokens_per_s"] > 0
    assert res["speedup"] == res["speedup_vs_target_only"]
    assert res["tau"] >= 1 and sum(res["accept_hist"]) > 0 and "greedy_mismatches" in res
    # τ "at block b" is measured at block b: every spec step ran the fixed block, none adaptive
    assert list(res["steps_per_block"]) == [res["block_size"]] == [pair.draft.cfg.block_size]
    assert res["steps_per_block"][res["block_size"]] == sum(res["accept_hist"])
    assert list(evaluate.measure(pair, backend, prompts, 6, 0.0, block_size=2, baseline=False,
                                 mass=False)["steps_per_block"]) == [2]
    sampled = evaluate.measure(pair, backend, prompts, 6, 1.0, baseline=False)
    assert "target_only_tokens_per_s" not in sampled and sampled["spec_tokens_per_s"] > 0


class FakeHF:
    """HFGreedy stand-in: records each generate()'s prompts, temperature, top_p and seed."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def generate(self, prompts, max_new, temperature=0.0, top_p=1.0, seed=0):
        self.calls.append((tuple(map(tuple, prompts)), temperature, top_p, seed))
        return [list(range(max_new)) for _ in prompts], 1.0


def test_measure_rows_contenders_share_seeds_and_stop_rule():
    """Every contender of a temperature gets the same seeded requests (prompt i: seed
    SEED + i, whatever its batch), exactly max_new tokens with EOS ignored; transformers is
    seeded from the same numbers; every contender is warmed up before any is timed."""
    eng, hf = FakeEngine(), FakeHF()
    prompts = [(1, 2), (3, 4), (5, 6), (7, 8)]
    res = bench_rows.measure_rows(eng, {1: prompts, 2: prompts}, 8, 4, 1, hf, profile=(),
                          log=lambda m: None)
    assert [(r["temperature"], r["batch"]) for r in res["rows"]] == [
        (t.label, b) for b in (1, 2) for t in bm.TEMPERATURES]
    for t in bm.TEMPERATURES:
        seen: dict[str, set] = {}
        for (spec, block, ids), params in eng.params:
            for p_ids, p in zip(ids, params):
                if p.temperature == t.temperature:
                    mode = "target_only" if not spec else "fixed" if block == 4 else "adaptive"
                    seen.setdefault(mode, set()).add((p_ids, p.seed, p.top_p, p.ignore_eos,
                                                      p.max_new_tokens))
        want = {(q, bm.SEED + i, t.top_p, True, 8) for i, q in enumerate(prompts)}
        assert seen == {"target_only": want, "fixed": want, "adaptive": want}
        hf_seeds = {(c[0], c[3]) for c in hf.calls if c[1] == t.temperature}
        if t.temperature:                          # batch: seeded with its first prompt's seed
            assert hf_seeds == {((q,), bm.SEED + i) for i, q in enumerate(prompts)} | {
                (tuple(prompts[i:i + 2]), bm.SEED + i) for i in (0, 2)}
    for r in res["rows"]:
        assert r["seeds"] == [bm.SEED + i for i in range(4)]
        assert set(r["contenders"]) == {"target_only", "fixed", "adaptive", "hf"}
        assert r["contenders"]["adaptive"]["block_sizes"] == {"3": 4 * 4 // r["batch"]}
    # measure(): per batch size, every (contender, temperature) warmed up before any timing
    n_warm = 3 * 3 * 4                                  # batch 1: 3 temperatures x 3 modes x 4
    runs = [(key, params[0].temperature) for key, params in eng.params]
    assert len(set(runs[:n_warm])) == n_warm and set(runs[n_warm:2 * n_warm]) == set(
        runs[:n_warm])
    assert res["rows"][0]["greedy_equal"] is True and res["rows"][0]["hf_equal"] is True


def _profile_engine(model_dir):
    from dflash2rt.api import resolve_model
    from dflash2rt.engine.engine import Engine

    backend = _cpu()
    return Engine(resolve_model(model_dir, backend.device), backend)


def test_profile_pass_syncs_between_phases(model_dir, monkeypatch):
    """Every step body of the profiling pass runs between two device syncs (a fake sync
    counter: on CPU the real one is a no-op), and the hooks are gone afterwards (a body timer
    already set on the Runner runs inside the synced one, and is set again after)."""
    events: list[str] = []
    monkeypatch.setattr(bm, "sync", lambda device: events.append("sync"))

    def logged(kind, block, clock, run):
        events.append(kind)
        return run()
    with _profile_engine(model_dir) as engine:
        engine.runner.timer = logged
        reqs = bm.seeded_requests([(3, 4, 5), (6, 7)], 6, bm.TEMPERATURES[2])
        for spec, block, kinds in ((True, 4, ["draft", "verify"]), (False, None, ["target-only"])):
            events.clear()
            prof = profile.profile_steps(engine, [reqs], spec, block)
            assert prof["steps"] > 0 and set(bm.STEP_PHASES) <= set(prof)
            assert events == ["sync", kinds[0], "sync", *(["sync", kinds[1], "sync"]
                                                          if spec else [])] * prof["steps"]
            assert prof["step"] == pytest.approx(prof["draft"] + prof["verify"] + prof["host"])
            assert (prof["draft"] > 0) == spec and prof["verify"] > 0
        assert engine.runner.timer is logged                     # restored after the pass
        events.clear()
        engine.generate(reqs, spec=True, block_size=4)            # an ordinary run: no syncs
        assert "sync" not in events


def test_profile_pass_is_never_inside_a_timed_window(model_dir, monkeypatch):
    """measure_rows runs the profiling pass after the timed rounds: no profiling sync and no
    profiling hook while measure() (warm-up and timed rounds) runs."""
    syncs, hooks = [0], []
    monkeypatch.setattr(bm, "sync", lambda device: syncs.__setitem__(0, syncs[0] + 1))
    real_measure, windows = bm.measure, []

    def measured(contenders, repeats):
        before = syncs[0]
        hooked = []
        wrapped = [bm.Contender(c.name, lambda c=c: hooked.append(hooks[0].timer is not None)
                                or c.run()) for c in contenders]
        out = real_measure(wrapped, repeats)
        windows.append((before, syncs[0], any(hooked)))
        return out
    monkeypatch.setattr(bm, "measure", measured)
    with _profile_engine(model_dir) as engine:
        hooks.append(engine.runner)
        prompts = [(3, 4, 5), (6, 7)]
        res = bench_rows.measure_rows(engine, {1: prompts, 2: prompts}, 4, 4, 1, log=lambda m: None)
    assert len(windows) == 2
    assert all(before == after and not hooked for before, after, hooked in windows)
    assert syncs[0] > 0 and len(res["step_profile"]["rows"]) == 2 * 3 * 3


def test_transformers_and_ours_stop_by_the_same_rule(model_dir, tmp_path, monkeypatch):
    """Both sides generate exactly max_new tokens with EOS ignored: transformers through
    eos_token_id=None (no min_new_tokens, no extra logits processor in the timed path), ours
    through ignore_eos, even when the model's EOS token is generated early."""
    pytest.importorskip("transformers")
    import shutil

    from dflash2rt.api import resolve_model
    from dflash2rt.bench.hf_baseline import HFGreedy
    from dflash2rt.engine.engine import Engine

    root = tmp_path / "model"
    shutil.copytree(model_dir, root)
    prompt, new = (3, 4, 5, 6), 8
    probe, _ = HFGreedy(root / "target").generate([prompt], new)
    eos = probe[0][1]                                  # greedy decoding emits it at step 2
    cfg = json.loads((root / "target" / "config.json").read_text())
    (root / "target" / "config.json").write_text(json.dumps({**cfg, "eos_token_id": eos}))
    hf = HFGreedy(root / "target")
    assert hf.model.generation_config.eos_token_id == eos
    seen: dict[str, list] = {"kwargs": [], "processors": []}
    gen, procs = hf.model.generate, getattr(hf.model, "_get_logits_processor", None)
    monkeypatch.setattr(hf.model, "generate",
                        lambda **kw: seen["kwargs"].append(kw) or gen(**kw))
    if procs is not None:
        monkeypatch.setattr(hf.model, "_get_logits_processor",
                            lambda *a, **kw: seen["processors"].append(procs(*a, **kw))
                            or seen["processors"][-1])
    backend = _cpu()
    pair = resolve_model(root, backend.device)
    assert eos in pair.eos_token_ids
    with Engine(pair, backend) as engine:
        for t in bm.TEMPERATURES:
            reqs = bm.seeded_requests([prompt, prompt[:2]], new, t)
            for spec in (False, True):
                outs, _ = engine.generate(reqs, spec=spec, block_size=4 if spec else None)
                assert [len(o.token_ids) for o in outs] == [new, new]
            hf_outs, _ = hf.generate([prompt, prompt[:2]], new, t.temperature, t.top_p, 1)
            assert [len(o) for o in hf_outs] == [new, new]
            if t.temperature == 0:
                assert eos in hf_outs[0][:-1]              # EOS generated, and ignored
                assert eos in outs[0].token_ids[:-1]
    for kw in seen["kwargs"]:
        assert "min_new_tokens" not in kw and kw["eos_token_id"] is None
        assert kw["max_new_tokens"] == new
    if procs is not None:                  # greedy: no processor; sampled: the warpers only
        names = [sorted(type(p).__name__ for p in ps) for ps in seen["processors"]]
        assert names[0] == [] and all(n in ([], ["TemperatureLogitsWarper", "TopPLogitsWarper"],
                                            ["TemperatureLogitsWarper"]) for n in names)


def test_bench_temperatures_flag():
    from dflash2rt.bench.suite import parse_temperatures

    assert parse_temperatures("0,0.7,1") == bm.TEMPERATURES
    assert [t.label for t in parse_temperatures("1")] == ["T=0", "T=1"]
    assert parse_temperatures("0.5:0.9")[1] == bm.Temperature("T=0.5 top-p 0.9", 0.5, 0.9)


def test_profiling_rounds_median_and_paired_ratio():
    """The profiling pass keeps its median round per configuration and every round's step; the
    sampled / greedy ratio pairs the rounds (drift between rounds cancels) and takes the
    median, not a ratio of medians."""
    from dflash2rt.bench.rows import median_pass, step_ratio

    runs = [{"step": s, "tau": t} for s, t in ((3.0, 1.0), (1.0, 2.0), (2.0, 3.0))]
    assert median_pass(runs) == {"step": 2.0, "tau": 3.0, "rounds_step_s": [3.0, 1.0, 2.0]}
    assert median_pass(runs[:2])["step"] == 1.0                     # even: the lower one
    greedy = [{"step": 1.0}, {"step": 2.0}, {"step": 4.0}]          # the machine slows down
    sampled = [{"step": 1.1}, {"step": 2.4}, {"step": 4.4}]
    r = step_ratio(sampled, greedy, 1, "T=1", 8)
    assert r["rounds_ratio"] == pytest.approx([1.1, 1.2, 1.1])
    assert r["ratio"] == pytest.approx(1.1)
    assert r["greedy_step_s"] == 2.0 and r["sampled_step_s"] == 2.4


def test_speedup_pairs_the_interleaved_rounds():
    """× target-only is the median of each round's ratio: a round that runs slow for every
    contender leaves it alone, where the ratio of the medians pairs one contender's slow
    round with another's fast one; unequal round counts pair the first rounds."""
    tonly, adaptive = [1513.0, 1373.0, 1486.0], [1490.0, 1384.0, 1334.0]
    got = bench_rows.paired_ratio(adaptive, tonly)
    assert got == pytest.approx(1490.0 / 1513.0)
    assert statistics.median(adaptive) / statistics.median(tonly) < 0.94 < got
    assert bench_rows.paired_ratio([2.0, 4.0], [1.0, 2.0, 3.0]) == 2.0
    assert bench_rows.paired_ratio([], []) is None
    assert bench_rows.paired_ratio([1.0], [0.0]) is None
