"""Logit processors under speculation, one process (``dflash2rt bench sampling``):

1. For each sampling parameter alone and all together, greedy speculative decoding (adaptive
   and block 8) equals greedy target-only decoding on the held-out prompts, token for token
   (:func:`greedy_checks`).
2. The cost: tokens/s at T = 0.7 / top-p 0.95 with penalties + logit bias + min-p on vs off,
   target-only and adaptive speculation, batch 1 and 8, in interleaved rounds after a warm-up
   (:func:`processor_cost`)."""

from __future__ import annotations

import statistics
from typing import Any, Callable, Sequence

from ..engine.engine import Engine
from ..engine.request import Request, SamplingParams

# Each parameter alone, then all together, for the greedy checks.
SETS: dict[str, dict[str, Any]] = {
    "repetition_penalty": dict(repetition_penalty=1.3),
    "frequency_penalty": dict(frequency_penalty=0.7),
    "presence_penalty": dict(presence_penalty=0.9),
    "min_p": dict(min_p=0.2),
    "logit_bias": dict(logit_bias={10: 4.0, 11: -8.0, 32: 2.5, 100: -100.0}),
    "logprobs": dict(logprobs=5),
}
SETS["all"] = {k: v for d in SETS.values() for k, v in d.items()}
# The processors switched on for the cost rows.
COST_ON: dict[str, Any] = dict(repetition_penalty=1.1, frequency_penalty=0.3,
                               presence_penalty=0.3, min_p=0.05, logit_bias={10: 2.0, 11: -2.0})
SAMPLED = dict(temperature=0.7, top_p=0.95)

Log = Callable[[str], None]


def _reqs(prompts: Sequence[Sequence[int]], max_new: int, **kw) -> list[Request]:
    return [Request(tuple(p), SamplingParams(max_new_tokens=max_new, ignore_eos=True,
                                             seed=1000 + i, **kw))
            for i, p in enumerate(prompts)]


def greedy_checks(eng: Engine, prompts: Sequence[Sequence[int]], max_new: int,
                  log: Log = print) -> dict[str, dict]:
    """Per entry of SETS: adaptive and block-8 speculation against target-only, greedy: equal
    tokens, τ, and with logprobs the largest log-probability difference."""
    out = {}
    for name, kw in SETS.items():
        reqs = _reqs(prompts, max_new, **kw)
        want, _ = eng.generate(reqs, spec=False)
        row = {}
        for label, block in (("adaptive", None), ("block8", 8)):
            got, st = eng.generate(reqs, spec=True, block_size=block)
            row[label] = {"equal": [g.token_ids for g in got] == [w.token_ids for w in want],
                          "tau": round(st.tau, 3)}
            if kw.get("logprobs") is not None:
                row[label]["max_logprob_diff"] = max(
                    abs(a - b) for g, w in zip(got, want)
                    for a, b in zip(g.logprobs, w.logprobs))
        out[name] = row
        log(f"greedy {name}: " + ", ".join(f"{k} equal={v['equal']} tau {v['tau']}"
                                           for k, v in row.items()))
    return out


def _cost_configs(prompts: Sequence[Sequence[int]], max_new: int) -> list[dict[str, Any]]:
    """Batch 1 and 8 × processors off and on × target-only and adaptive speculation."""
    configs = []
    for batch in (1, 8):
        groups = [prompts[i:i + batch] for i in range(0, len(prompts), batch)]
        for procs in (False, True):
            for spec in (False, True):
                kw = {**SAMPLED, **(COST_ON if procs else {})}
                configs.append(dict(batch=batch, procs=procs, spec=spec,
                                    batches=[_reqs(g, max_new, **kw) for g in groups]))
    return configs


def _once(eng: Engine, config: dict[str, Any]) -> tuple[float, float]:
    """One round of a configuration: (tokens/s without capture and calibration, τ)."""
    toks = secs = committed = steps = 0
    for reqs in config["batches"]:
        _, st = eng.generate(reqs, spec=config["spec"], block_size=None)
        toks += st.generated
        secs += st.wall_s - st.capture_s - st.calibration_s
        committed += st.committed
        steps += st.request_steps
    return toks / secs, committed / max(steps, 1)


def processor_cost(eng: Engine, prompts: Sequence[Sequence[int]], max_new: int, rounds: int,
                   log: Log = print) -> list[dict[str, Any]]:
    """Tokens/s with COST_ON's processors on vs off (every configuration warmed up, then
    ``rounds`` interleaved rounds; the median round), with on / off per batch and mode."""
    configs = _cost_configs(prompts, max_new)
    for c in configs:                                     # warm-up (and calibration) first
        _once(eng, c)
    rates: list[list[float]] = [[] for _ in configs]
    taus: list[list[float]] = [[] for _ in configs]
    for _ in range(rounds):
        for i, c in enumerate(configs):
            r, t = _once(eng, c)
            rates[i].append(r)
            taus[i].append(t)
    rows = [{"batch": c["batch"], "procs": c["procs"],
             "mode": "adaptive spec" if c["spec"] else "target-only",
             "tokens_per_s": statistics.median(rates[i]), "rounds": rates[i],
             "tau": statistics.mean(taus[i])} for i, c in enumerate(configs)]
    for r in rows:
        off = next(x for x in rows if x["batch"] == r["batch"] and x["mode"] == r["mode"]
                   and not x["procs"])
        r["on_over_off"] = r["tokens_per_s"] / off["tokens_per_s"]
        log(f"T=0.7 batch {r['batch']} {r['mode']:13s} procs {'on ' if r['procs'] else 'off'}"
            f" {r['tokens_per_s']:7.1f} tok/s  tau {r['tau']:.2f}  on/off x{r['on_over_off']:.2f}")
    return rows


def sampling_bench(eng: Engine, prompts: Sequence[Sequence[int]], max_new: int, rounds: int,
                   log: Log = print) -> dict[str, Any]:
    """The greedy checks and the processor cost, as one JSON-ready dict."""
    return {"backend": eng.backend.name, "prompts": len(prompts), "max_new": max_new,
            "greedy": greedy_checks(eng, prompts, max_new, log),
            "cost_params": {k: (dict(v) if isinstance(v, dict) else v)
                            for k, v in COST_ON.items()},
            "cost": processor_cost(eng, prompts, max_new, rounds, log)}
