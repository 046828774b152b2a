"""``dflash2rt bench ablation``: what each mechanism of adaptive speculation is worth, measured
side by side in one run. The contenders: target-only decoding, adaptive speculation with every
mechanism on, adaptive speculation without each mechanism in turn (the names
``AdaptivePolicy(without=...)`` accepts, docs/adaptive.md), and fixed blocks; at every
temperature × batch size.

Every engine contender of a row (one temperature × batch size) decodes on its own ``Engine``
with its own fresh ``MeasuredTable``: what one contender calibrates, times or pools never
steers another (nor another row). All contenders of a batch size, every temperature, are warmed
up before any is timed, then timed in interleaved rounds (:func:`~dflash2rt.bench.measure.measure`);
× target-only is the median of the rounds' paired ratios against target-only at the same
temperature and batch size (:func:`~dflash2rt.bench.rows.paired_ratio`)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

from ..backend import Backend
from ..engine.engine import Engine
from ..engine.policy.adaptive import AdaptivePolicy
from ..engine.policy.table import MeasuredTable
from ..models.pair import ModelPair
from .measure import (SEED, TARGET_ONLY, TEMPERATURES, Contender, Measurement, Temperature,
                      engine_contender, measure, resolve_backend, seeded_requests)
from .rows import paired_ratio

ADAPTIVE = "adaptive"
# The mechanisms in the order docs/adaptive.md lists them.
MECHANISMS = ("row_alpha", "row_scale", "pooled_prior", "cost_table", "drift", "finish_rule",
              "call_plan", "probes", "calibration")
FIXED_BLOCKS = (4, 8)
BATCHES = (1, 8)
# --quick: a smoke run of every contender and row (figures meaningless)
QUICK = {"max_new_tokens": 8, "repeats": 1, "prompts": 1}


def without_name(mechanism: str) -> str:
    return f"without_{mechanism}"


def block_name(block: int) -> str:
    return f"block_{block}"


@dataclass(frozen=True)
class Spec:
    """One contender: ``spec`` False is target-only; ``block`` a fixed block; ``without`` the
    mechanisms switched off of an adaptive contender (None: not adaptive)."""

    name: str
    spec: bool
    block: int | None = None
    without: frozenset[str] | None = None

    @property
    def title(self) -> str:
        if not self.spec:
            return "target-only"
        if self.without is None:
            return f"block {self.block}"
        return " ".join(["adaptive", *(f"without {m}" for m in sorted(self.without))])


def contender_specs(fixed_blocks: Sequence[int] = FIXED_BLOCKS) -> list[Spec]:
    """Target-only, adaptive, adaptive without each mechanism, then each fixed block."""
    return ([Spec(TARGET_ONLY, False), Spec(ADAPTIVE, True, None, frozenset())]
            + [Spec(without_name(m), True, None, frozenset({m})) for m in MECHANISMS]
            + [Spec(block_name(b), True, b) for b in fixed_blocks])


def make_engine(pair: ModelPair, backend: Backend, spec: Spec) -> Engine:
    """A new engine for one contender of one row, with a fresh measured table; an adaptive
    contender's policy is built here, with its ``without``."""
    engine = Engine(pair, backend, table=MeasuredTable())
    if spec.without is not None:
        engine.policy = AdaptivePolicy.measured(pair.draft.cfg.block_size, engine.table,
                                                without=spec.without)
    return engine


def batch_prompts(prompts: Sequence[Sequence[int]], batch: int,
                  n_prompts: int) -> list[tuple[int, ...]]:
    """The prompts of one batch size: batch 1, the first ``n_prompts`` (each decoded alone);
    a batch of ``batch`` > 1, one batch of the first ``batch`` prompts (cycled when there are
    fewer, each copy with its own seed)."""
    count = n_prompts if batch == 1 else batch
    return [tuple(prompts[i % len(prompts)]) for i in range(count)]


def mixed_length(max_new: int, i: int) -> int:
    """Request i's new tokens under ``--mixed-lengths``: a quarter, a half, three quarters or
    all of ``max_new`` (at least 1), in turn."""
    return max(1, max_new * (i % 4 + 1) // 4)


def _key(t: Temperature, name: str) -> str:
    return f"{t.label}|{name}"


def measure_ablation(pair: ModelPair, prompts: Sequence[Sequence[int]],
                     backend: Backend | str | None = None, max_new: int = 128,
                     repeats: int = 3, n_prompts: int = 8,
                     temperatures: Sequence[Temperature] = TEMPERATURES,
                     batches: Sequence[int] = BATCHES,
                     fixed_blocks: Sequence[int] = FIXED_BLOCKS,
                     log: Callable[[str], None] = print,
                     mixed_lengths: bool = False) -> dict[str, Any]:
    """Every contender (:func:`contender_specs`) at every temperature × batch size, in one run
    (module docstring). → ``{"rows": [...], "contenders": [...], ...}``; a row: ``temperature``,
    ``temperature_value``, ``top_p``, ``batch``, ``prompts``, ``tokens``, ``greedy_equal`` (T = 0:
    every speculative contender's output equals target-only's, every prompt; else None) and
    ``contenders``: name → ``tokens_per_s`` (the median round), ``rounds_tokens_per_s``,
    ``speedup_vs_target_only`` (the paired ratio), ``tau``, ``block_sizes``, and for adaptive
    ones ``without`` (read back from the engine's policy) and the calls planned target-only.
    ``mixed_lengths``: request i generates ``lengths(max_new, i)`` tokens instead of
    ``max_new``, so a batch's rows end at different steps."""
    if not prompts:
        raise ValueError("the ablation needs at least one prompt")
    backend = resolve_backend(backend)
    specs = contender_specs(fixed_blocks)
    rows: list[dict[str, Any]] = []
    for batch in batches:
        chosen = batch_prompts(prompts, batch, n_prompts)
        groups = [list(range(i, min(i + batch, len(chosen))))
                  for i in range(0, len(chosen), batch)]
        engines: dict[str, Engine] = {}
        contenders: list[Contender] = []
        try:
            for t in temperatures:
                reqs = seeded_requests(chosen, max_new, t)
                if mixed_lengths:
                    reqs = [replace(r, params=replace(r.params,
                                                      max_new_tokens=mixed_length(max_new, i)))
                            for i, r in enumerate(reqs)]
                reqs_batches = [[reqs[i] for i in g] for g in groups]
                for s in specs:
                    eng = engines[_key(t, s.name)] = make_engine(pair, backend, s)
                    contenders.append(engine_contender(_key(t, s.name), eng, reqs_batches,
                                                       s.spec, s.block))
            log(f"batch {batch}: {len(contenders)} contenders ({len(specs)} × "
                f"{len(temperatures)} temperatures), each on its own engine and table; "
                f"warm-up, then {repeats} interleaved round(s)")
            m = measure(contenders, repeats)
            for t in temperatures:
                rows.append(_row(t, batch, chosen, specs, m, engines))
                log(_row_line(rows[-1], specs))
        finally:
            for eng in engines.values():
                eng.close()
    return {"model": pair.name, "backend": backend.name, "device": str(backend.device),
            "draft_block_size": pair.draft.cfg.block_size, "max_new_tokens": max_new,
            "repeats": repeats, "batches": list(batches), "mixed_lengths": mixed_lengths,
            "temperatures": [t.label for t in temperatures],
            "contenders": [{"name": s.name, "title": s.title, "speculative": s.spec,
                            "block_size": s.block,
                            "without": None if s.without is None else sorted(s.without)}
                           for s in specs],
            "rows": rows,
            "greedy_equal_all": all(r["greedy_equal"] for r in rows
                                    if r["greedy_equal"] is not None),
            "method": "one Engine and fresh MeasuredTable per contender × temperature × batch; "
                      "every contender of a batch size warmed up (untimed) before any is "
                      "timed, then interleaved timed rounds; tokens_per_s: the median round; "
                      "speedup_vs_target_only: the median over rounds of the round's rate "
                      "over target-only's rate in the same round, temperature and batch",
            "requests": f"seeded SamplingParams(temperature, top_p, seed={SEED} + prompt "
                        f"index, ignore_eos=True): the same seeds for every contender; "
                        + (f"request i: {max_new} x (i mod 4 + 1) / 4 new tokens"
                           if mixed_lengths else f"exactly {max_new} new tokens per prompt")}


def _row(t: Temperature, batch: int, prompts: Sequence[Sequence[int]], specs: Sequence[Spec],
         m: dict[str, Measurement], engines: dict[str, Engine]) -> dict[str, Any]:
    base = m[_key(t, TARGET_ONLY)]
    out: dict[str, dict[str, Any]] = {}
    for s in specs:
        x = m[_key(t, s.name)]
        d: dict[str, Any] = {
            "tokens_per_s": x.tokens_per_s, "rounds_tokens_per_s": x.rates,
            "speedup_vs_target_only": paired_ratio(x.rates, base.rates),
            "tau": x.tau, "block_sizes": {str(k): v for k, v in x.block_sizes.items()},
            "fallbacks": list(x.fallbacks)}
        if s.block is not None:
            d["block_size"] = s.block
        policy = engines[_key(t, s.name)].policy
        if s.without is not None and policy is not None:
            d["without"] = sorted(policy.without)
            d["target_only_calls"] = sum(1 for st in x.stats if st.call_plan)
            d["calls"] = len(x.stats)
            d["calibration_steps"] = sum(st.calibration_steps for st in x.stats)
        out[s.name] = d
    row: dict[str, Any] = {
        "temperature": t.label, "temperature_value": t.temperature, "top_p": t.top_p,
        "batch": batch, "prompts": len(prompts),
        "tokens": sum(smp.tokens for smp in base.runs[-1]) if base.samples else 0,
        "contenders": out, "greedy_equal": None}
    if t.temperature == 0:
        mism = {s.name: [i for i, (a, b) in enumerate(zip(m[_key(t, s.name)].outputs,
                                                           base.outputs)) if a != b]
                for s in specs if s.spec}
        row["greedy_equal"] = not any(mism.values())
        row["mismatched_prompts"] = {k: v for k, v in mism.items() if v}
    return row


def _row_line(row: dict[str, Any], specs: Sequence[Spec]) -> str:
    c = row["contenders"]
    return (f"{row['temperature']}, batch {row['batch']}: target-only "
            f"{c[TARGET_ONLY]['tokens_per_s']:.1f} tok/s; "
            + ", ".join(f"{s.name} x{c[s.name]['speedup_vs_target_only'] or 0:.2f}"
                        for s in specs if s.spec))


def ablation_table(res: dict[str, Any]) -> str:
    """One line per contender, one column per temperature × batch: tok/s and, for every
    contender but target-only, (× target-only)."""
    rows = res.get("rows") or []
    if not rows:
        return "no rows measured"
    width = 24
    head = f"{'contender':34}" + "".join(
        f"{r['temperature'] + ', b' + str(r['batch']):>{width}}" for r in rows)
    lines = [head]
    for c in res["contenders"]:
        cells = f"{c['title']:34}"
        for r in rows:
            x = r["contenders"][c["name"]]
            if c["name"] == TARGET_ONLY:
                cells += f"{x['tokens_per_s']:{width}.1f}"
            else:
                ratio = x["speedup_vs_target_only"] or 0
                cells += f"{x['tokens_per_s']:{width - 9}.1f} (x{ratio:.2f})".rjust(width)
        lines.append(cells)
    bad = [f"{r['temperature']}, b{r['batch']}: {r['mismatched_prompts']}" for r in rows
           if r["greedy_equal"] is False]
    lines.append("greedy speculative output == target-only (every contender, prompt, batch): "
                 + ("True" if not bad else "False: " + "; ".join(bad)))
    return "\n".join(lines)
