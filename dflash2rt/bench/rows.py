"""Side-by-side comparisons built on :func:`~dflash2rt.bench.measure.measure`: target-only vs
speculative (:func:`compare`), the rows at T = 0, 0.7 / top-p 0.95 and 1 for every contender
and batch size, with the synced step-cost split after the timed rounds (:func:`measure_rows`),
and the block-size sweep with its fitted speedup model (:func:`block_sweep`)."""

from __future__ import annotations

import statistics
from typing import Any, Callable, Sequence

from ..engine.engine import Engine
from ..engine.request import Request
from ..errors import InvalidInputError
from . import measure
from .measure import (ADAPTIVE, ENGINE_CONTENDERS, FIXED, HF, SAMPLED_OVER_GREEDY_GOAL, SEED, SPEC,
                      STEP_PHASES, TARGET_ONLY, TEMPERATURES, Measurement, Temperature,
                      all_fallbacks, engine_contender, hf_contender, requests, seeded_requests,
                      with_deprecated_aliases)
from .profile import profile_steps

def _compare_dict(tonly: Measurement, spec: Measurement, hfr: Measurement | None,
                  prompts: int, all_m: dict[str, Measurement],
                  adaptive: Measurement | None = None) -> dict[str, Any]:
    """The compare() dict (target-only vs speculative at one block size [vs transformers])."""
    res: dict[str, Any] = {
        "prompts": prompts, "tokens": spec.tokens, "tau": spec.tau,
        "target_only_tokens_per_s": tonly.tokens_per_s, "spec_tokens_per_s": spec.tokens_per_s,
        "hf_tokens_per_s": hfr.tokens_per_s if hfr else None,
        "greedy_equal": spec.outputs == tonly.outputs,
        "hf_equal": hfr.outputs == tonly.outputs if hfr else None,
        # the engine's own clocks inside the timed runs (no device sync between phases: on a
        # GPU this is launch time); the synced split is measure_rows' step_profile
        "time_split_per_step_s": spec.time_split_per_step_s,
        "steps": spec.steps,
    }
    res["speedup_vs_target_only"] = res["spec_tokens_per_s"] / res["target_only_tokens_per_s"]
    res["speedup_vs_hf"] = res["spec_tokens_per_s"] / res["hf_tokens_per_s"] if hfr else None
    res["efficiency"] = res["speedup_vs_target_only"] / res["tau"] if res["tau"] else None
    res["mismatched_prompts"] = [i for i, (a, b) in enumerate(zip(spec.outputs, tonly.outputs))
                                 if a != b]
    if adaptive is not None:
        res["adaptive_tokens_per_s"] = adaptive.tokens_per_s
        res["adaptive_tau"] = adaptive.tau
        res["adaptive_greedy_equal"] = adaptive.outputs == tonly.outputs
    res["capture_s"] = {k: v.capture_s for k, v in all_m.items()}
    res["warmup_s"] = {k: v.warmup_s for k, v in all_m.items()}
    res["fallbacks"] = all_fallbacks(all_m)
    return res


def compare(batch: Sequence[Sequence[int]], engine: Engine, hf: Any | None, max_new: int,
            block: int, repeats: int, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Target-only, speculative (``block``) and, with ``hf``, transformers greedy on ``batch``
    (one request per prompt, decoded as one batch), warmed up, then interleaved."""
    _need_prompts(batch, "compare()")
    reqs = requests(batch, max_new)
    contenders = [engine_contender(TARGET_ONLY, engine, [reqs], False),
                  engine_contender(SPEC, engine, [reqs], True, block)]
    if hf is not None:
        contenders.append(hf_contender(hf, batch, max_new))
    m = measure.measure(contenders, repeats)
    res = _compare_dict(m[TARGET_ONLY], m[SPEC], m.get(HF), len(batch), m)
    log(f"batch {len(batch)}: target-only {res['target_only_tokens_per_s']:.1f} tok/s, spec "
        f"{res['spec_tokens_per_s']:.1f} tok/s (x{res['speedup_vs_target_only']:.2f}, "
        f"tau {res['tau']:.2f})"
        + (f", hf {res['hf_tokens_per_s']:.1f} tok/s" if m.get(HF) else ""))
    return with_deprecated_aliases(res)


def _need_prompts(prompts: Sequence[Sequence[int]], where: str) -> None:
    """Every rate and ratio is per prompt: an empty list has none to give."""
    if len(prompts) == 0:
        raise InvalidInputError(f"{where} needs at least one prompt, got none")


def _key(t: Temperature, contender: str) -> str:
    return f"{t.label}|{contender}"


def _groups(n: int, batch: int) -> list[list[int]]:
    """Prompt indices 0..n-1 in consecutive batches of ``batch``."""
    return [list(range(i, min(i + batch, n))) for i in range(0, n, batch)]


def measure_rows(engine: Engine, prompts_by_batch: dict[int, Sequence[Sequence[int]]],
                 max_new: int, block: int, repeats: int, hf: Any | None = None,
                 temperatures: Sequence[Temperature] = TEMPERATURES,
                 profile: Sequence[str] = ENGINE_CONTENDERS,
                 log: Callable[[str], None] = print) -> dict[str, Any]:
    """Every contender side by side at every temperature, per batch size: for batch size
    ``b``, ``prompts_by_batch[b]`` decoded in batches of ``b`` (batch 1: each prompt alone) by
    target-only decoding, fixed-block speculation (``block``), adaptive speculation
    (``block_size=None``) and, with ``hf``, transformers ``generate()``. Requests are seeded
    (prompt i: seed ``SEED + i``, the same for every contender) and generate exactly
    ``max_new`` tokens, EOS ignored. All contenders of a batch size (every temperature) are
    warmed up before any is timed, then timed in ``repeats`` interleaved rounds; after the
    timed rounds, the profiling pass (:func:`profile_steps`, ``repeats`` interleaved rounds,
    the median round kept: ``median_pass``) splits the step cost of each engine contender
    named in ``profile`` (the sampled / greedy ratio needs ``FIXED``: ``step_ratio``).

    → ``{"rows": [...], "step_profile": {...}, "compare": {batch: compare()-style dict at the
    first temperature (T = 0)}, "capture_s": {batch: seconds}}``. A row (one per temperature
    × batch): ``temperature`` (label), ``temperature_value``, ``top_p``, ``batch``,
    ``prompts``, ``tokens``, ``seeds``, ``contenders`` (name → tokens_per_s: the median
    round; speedup_vs_target_only: ``paired_ratio``, the median of the rounds' ratios;
    speedup_of_medians; tau, steps, block_sizes, step_split_s, ...), and at T = 0 ``greedy_equal`` /
    ``mismatched_prompts`` (speculative == target-only, for every prompt)."""
    rows: list[dict[str, Any]] = []
    prof_rows: list[dict[str, Any]] = []
    ratios: list[dict[str, Any]] = []
    legacy: dict[int, dict[str, Any]] = {}
    capture: dict[int, float] = {}
    modes = ((TARGET_ONLY, False, None), (FIXED, True, block), (ADAPTIVE, True, None))
    for batch, prompts in prompts_by_batch.items():
        _need_prompts(prompts, f"measure_rows() at batch {batch}")
        batches, contenders = _contenders(engine, prompts, batch, max_new, temperatures, modes, hf)
        m = measure.measure(contenders, repeats)
        capture[batch] = sum(x.capture_s for x in m.values())
        prof: dict[tuple[str, str], dict[str, Any]] = {}
        if profile:                          # the profiling pass: after every timed round
            prof = _profile_pass(engine, batches, batch, temperatures, modes, profile, repeats,
                                 block, prof_rows, ratios)
        for t in temperatures:
            rows.append(_row(t, batch, prompts, m, prof, block, hf is not None))
            log(_row_line(rows[-1]))
        t0 = temperatures[0]
        if t0.temperature == 0:
            legacy[batch] = _greedy_compare(m, t0, len(prompts))
            legacy[batch]["tokens"] = rows[-len(temperatures)]["tokens"]
    return {"rows": rows, "compare": legacy, "capture_s": capture,
            "step_profile": {"rows": prof_rows, "sampled_over_greedy": ratios,
                             "goal_sampled_over_greedy": SAMPLED_OVER_GREEDY_GOAL,
                             "method": STEP_PROFILE_METHOD}}


# How measure_rows' step_profile is measured (reported with it).
STEP_PROFILE_METHOD = (
    "a separate untimed pass after the timed rounds, in as many interleaved rounds: one "
    "generate() per configuration a round, device synchronised before and after every step "
    "body (graph replay with graphs) and every step; seconds per decode step of the median "
    "round; sampled / greedy: the median of the rounds' ratios")

_Mode = tuple[str, bool, "int | None"]       # (contender name, speculative, block size)


def _contenders(engine: Engine, prompts: Sequence[Sequence[int]], batch: int, max_new: int,
                temperatures: Sequence[Temperature], modes: Sequence[_Mode], hf: Any | None
                ) -> tuple[dict[str, list[list[Request]]], list]:
    """One batch size's contenders: every mode (and transformers, with ``hf``) at every
    temperature, on seeded requests grouped in batches of ``batch``; with those request batches
    by temperature label."""
    groups = _groups(len(prompts), batch)
    batches: dict[str, list[list[Request]]] = {}
    contenders = []
    for t in temperatures:
        reqs = seeded_requests(prompts, max_new, t)
        batches[t.label] = [[reqs[i] for i in g] for g in groups]
        contenders += [engine_contender(_key(t, name), engine, batches[t.label], spec, b)
                       for name, spec, b in modes]
        if hf is not None:
            contenders.append(hf_contender(hf, prompts, max_new, _key(t, HF), t, SEED, batch))
    return batches, contenders


def _profile_pass(engine: Engine, batches: dict[str, list[list[Request]]], batch: int,
                  temperatures: Sequence[Temperature], modes: Sequence[_Mode],
                  profile: Sequence[str], repeats: int, block: int,
                  prof_rows: list[dict[str, Any]], ratios: list[dict[str, Any]]
                  ) -> dict[tuple[str, str], dict[str, Any]]:
    """The synced step-cost split of the ``profile`` contenders of one batch size, in
    ``repeats`` interleaved rounds (as the timed ones); appends a row per (temperature,
    contender) to ``prof_rows`` and the sampled / greedy step ratios to ``ratios``; returns the
    median pass per (temperature label, contender)."""
    passes: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for _ in range(max(repeats, 1)):
        for t in temperatures:
            for name, spec, b in (x for x in modes if x[0] in profile):
                passes.setdefault((t.label, name), []).append(
                    profile_steps(engine, batches[t.label], spec, b))
    prof: dict[tuple[str, str], dict[str, Any]] = {}
    blocks = {name: b for name, _, b in modes}
    for (label, name), runs in passes.items():
        p = prof[(label, name)] = median_pass(runs)
        prof_rows.append({"temperature": label, "batch": batch, "contender": name,
                          "block_size": blocks[name],
                          **{k: p[k] for k in (*STEP_PHASES, "step", "steps", "tau",
                                               "block_sizes", "rounds_step_s")}})
    greedy = passes.get((temperatures[0].label, FIXED))
    for t in temperatures[1:]:
        if greedy and temperatures[0].temperature == 0 and (t.label, FIXED) in passes:
            ratios.append(step_ratio(passes[(t.label, FIXED)], greedy, batch, t.label, block))
    return prof


def _greedy_compare(m: dict[str, Measurement], t0: Temperature, prompts: int) -> dict[str, Any]:
    """The compare()-style dict of one batch size at ``t0`` (T = 0)."""
    return with_deprecated_aliases(_compare_dict(
        m[_key(t0, TARGET_ONLY)], m[_key(t0, FIXED)], m.get(_key(t0, HF)), prompts,
        {k.split("|", 1)[1]: v for k, v in m.items() if k.startswith(t0.label + "|")},
        m[_key(t0, ADAPTIVE)]))


def median_pass(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The profiling round whose step cost is the median (the lower one of an even count),
    with every round's step seconds (``rounds_step_s``)."""
    ranked = sorted(runs, key=lambda r: r["step"])
    return {**ranked[(len(ranked) - 1) // 2], "rounds_step_s": [r["step"] for r in runs]}


def step_ratio(sampled: Sequence[dict[str, Any]], greedy: Sequence[dict[str, Any]], batch: int,
               label: str, block: int) -> dict[str, Any]:
    """Sampled / greedy step cost at one block size: the median over rounds of each round's
    ratio (the two passes of a round run minutes apart at most, so a machine's drift between
    rounds cancels), with each round's ratio."""
    per = _round_ratios([s["step"] for s in sampled], [g["step"] for g in greedy])
    return {"batch": batch, "temperature": label, "block_size": block,
            "greedy_step_s": median_pass(greedy)["step"],
            "sampled_step_s": median_pass(sampled)["step"],
            "ratio": statistics.median(per) if per else float("nan"),
            "rounds_ratio": per}


def _row(t: Temperature, batch: int, prompts: Sequence[Sequence[int]],
         m: dict[str, Measurement], prof: dict[tuple[str, str], dict[str, Any]], block: int,
         with_hf: bool) -> dict[str, Any]:
    tonly = m[_key(t, TARGET_ONLY)]
    base = tonly.tokens_per_s
    contenders: dict[str, dict[str, Any]] = {}
    for name in (*ENGINE_CONTENDERS, *((HF,) if with_hf else ())):
        x = m[_key(t, name)]
        d: dict[str, Any] = {"tokens_per_s": x.tokens_per_s, "rounds_tokens_per_s": x.rates,
                             "speedup_vs_target_only": paired_ratio(x.rates, tonly.rates),
                             "speedup_of_medians": x.tokens_per_s / base if base else None}
        if name != HF:
            d.update(tau=x.tau, steps=x.steps,
                     block_sizes={str(k): v for k, v in x.block_sizes.items()},
                     step_split_s=prof.get((t.label, name)),
                     observed_step_s=x.observed_step_s)
            if name == ADAPTIVE and x.stats:    # what the schedule predicted per step
                d["cost_table_s"] = {str(b): {str(k): c for k, c in per.items()}
                                     for b, per in x.stats[-1].costs.items()}
                # generate() calls of the timed rounds the schedule ran target-only (plan)
                d["target_only_calls"] = sum(1 for st in x.stats if st.call_plan)
                d["calls"] = len(x.stats)
        if name == FIXED:
            d["block_size"] = block
        d.update(capture_s=x.capture_s, warmup_s=x.warmup_s, fallbacks=list(x.fallbacks))
        contenders[name] = d
    row: dict[str, Any] = {
        "temperature": t.label, "temperature_value": t.temperature, "top_p": t.top_p,
        "batch": batch, "prompts": len(prompts),
        "tokens": sum(s.tokens for s in tonly.runs[-1]) if tonly.samples else 0,
        "seeds": [SEED + i for i in range(len(prompts))], "contenders": contenders,
        "greedy_equal": None}
    if t.temperature == 0:
        mism = {name: [i for i, (a, b) in enumerate(zip(m[_key(t, name)].outputs,
                                                         tonly.outputs)) if a != b]
                for name in (FIXED, ADAPTIVE)}
        row["greedy_equal"] = not any(mism.values())
        row["mismatched_prompts"] = mism
        if with_hf:
            row["hf_equal"] = m[_key(t, HF)].outputs == tonly.outputs
    return row


def paired_ratio(rates: Sequence[float], base: Sequence[float]) -> float | None:
    """× target-only from interleaved rounds: the median over rounds of each round's rate over
    the target-only rate of the same round (the rounds pair the contenders under one state of
    the machine; a round that ran slow for everyone leaves the ratio alone, whereas the ratio
    of the medians can pair one contender's slow round with another's fast one). None without
    rounds."""
    per = _round_ratios(rates, base)
    return statistics.median(per) if per else None


def _round_ratios(values: Sequence[float], base: Sequence[float]) -> list[float]:
    """Each round's value over the same round's base (rounds whose base is 0 left out)."""
    return [v / b for v, b in zip(values, base) if b > 0]


def _row_line(row: dict[str, Any]) -> str:
    c = row["contenders"]
    spec = ", ".join(f"{name} {c[name]['tokens_per_s']:.1f} tok/s (x"
                     f"{c[name]['speedup_vs_target_only'] or 0:.2f}, tau {c[name]['tau']:.2f})"
                     for name in (FIXED, ADAPTIVE))
    return (f"{row['temperature']}, batch {row['batch']}: target-only "
            f"{c[TARGET_ONLY]['tokens_per_s']:.1f} tok/s, {spec}"
            + (f", hf {c[HF]['tokens_per_s']:.1f} tok/s" if HF in c else "")
            + ("" if row["greedy_equal"] is None else
               f"; greedy spec == target-only: {row['greedy_equal']}"))


def block_sweep(prompts: Sequence[Sequence[int]], engine: Engine, max_new: int,
                blocks: Sequence[int], repeats: int,
                log: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """τ and speedup per block size (batch 1, each prompt alone), with the fitted speedup model.
    Every block size (and target-only) is warmed up before any of them is timed."""
    batches = [requests([p], max_new) for p in prompts]
    contenders = [engine_contender(TARGET_ONLY, engine, batches, False)] + \
        [engine_contender(f"spec{b}", engine, batches, True, b) for b in blocks]
    m = measure.measure(contenders, repeats)
    tonly = m[TARGET_ONLY]
    t_target = statistics.median(s.stats.wall_s - s.stats.capture_s - s.stats.time["prefill"]
                                 for s in tonly.samples) / max_new
    rows = []
    for b in blocks:
        spec = m[f"spec{b}"]
        st = spec.stats
        t_draft = statistics.median((s.time["draft"] + s.time["select"]) / s.steps for s in st)
        t_verify = statistics.median((s.time["verify"] + s.time["graphs"] + s.time["host"])
                                     / s.steps for s in st)        # graphs: draft + verify
        measured = spec.tokens_per_s / tonly.tokens_per_s
        rows.append(with_deprecated_aliases({
            "block_size": b, "tau": spec.tau, "speedup_vs_target_only": measured,
            "t_target_s": t_target, "t_draft_s": t_draft, "t_verify_s": t_verify,
            "predicted_speedup": spec.tau * t_target / (t_draft + t_verify),
            "capture_s": spec.capture_s, "fallbacks": spec.fallbacks}))
        log(f"block {b:2d}: tau {spec.tau:.2f}, speedup x{measured:.2f} (model x"
            f"{rows[-1]['predicted_speedup']:.2f})")
    return rows
