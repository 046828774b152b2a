"""``dflash2rt bench``: at T = 0, T = 0.7 / top-p 0.95 and T = 1, batch 1 and 8, target-only vs
fixed-block speculation vs adaptive speculation vs transformers side by side in one run
(:func:`~dflash2rt.bench.measure.measure_rows`), the synced per-step cost split, block sweep."""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any, Callable, Sequence

from ..backend import Backend
from ..engine.engine import Engine
from ..engine.request import check_count, is_int
from ..errors import InvalidInputError
from ..models.pair import ModelPair
from .hf_baseline import HFGreedy, hf_available
from .measure import (ADAPTIVE, FIXED, HF, SEED, SPEC, TARGET_ONLY, TEMPERATURES, Temperature,
                      resolve_backend, warm_caches, with_deprecated_aliases)
from .rows import block_sweep, measure_rows


def heldout_prompts(model_dir: Path, pair: ModelPair) -> list[tuple[int, ...]]:
    """The model's held-out prompt set, its texts tokenised."""
    from ..bundled import heldout

    return [tuple(pair.tokenizer.encode(h["prompt"])) for h in heldout(model_dir)]


def run_bench(pair: ModelPair, model_dir: Path, backend: Backend | str | None = None,
              max_new: int = 64, repeats: int = 3, blocks: Sequence[int] = (2, 4, 8, 16),
              n_prompts: int = 8, with_hf: bool = True,
              log: Callable[[str], None] = print,
              temperatures: Sequence[Temperature] = TEMPERATURES) -> dict[str, Any]:
    """The bench's JSON. ``rows``: one per temperature × batch (1: each of ``n_prompts``
    prompts alone; 8: eight prompts as one batch) with every contender (target-only, the
    draft's block size, adaptive, transformers); ``step_profile``: the synced per-step cost
    split (a separate pass, after the timed rounds) and the sampled / greedy step-cost ratio;
    ``batch1`` / ``batch8`` and the top-level keys: the T = 0 comparison (target-only vs the
    draft's block size), as before; ``sweep``: the block-size sweep. ``ar_tokens_per_s`` and
    ``speedup_vs_ar`` are deprecated aliases of the ``target_only`` keys (one release).
    ``temperatures``: the first must be T = 0 (the greedy checks and the T = 0 keys)."""
    if not temperatures or temperatures[0].temperature != 0:
        raise ValueError("the bench's first temperature must be T = 0 (greedy)")
    for name, value in (("max_new", max_new), ("repeats", repeats), ("n_prompts", n_prompts)):
        check_count(name, value, 1)
    if not blocks or any(not is_int(b) or b < 2 for b in blocks):
        raise InvalidInputError(f"blocks must be block sizes >= 2, got {tuple(blocks)!r}")
    with Engine(pair, resolve_backend(backend)) as engine:   # graphs captured once, replayed
        return _bench(pair, model_dir, engine, max_new, repeats, blocks, n_prompts, with_hf, log,
                      tuple(temperatures))


def parse_temperatures(text: str) -> tuple[Temperature, ...]:
    """"0,0.7,1" → the matching TEMPERATURES (0.7: top-p 0.95); another value ``v`` (or
    ``v:p``, top-p ``p``) → ``Temperature("T=v", v, p)``; T = 0 first, always included."""
    out = [TEMPERATURES[0]]
    for item in filter(None, (x.strip() for x in text.split(","))):
        v, _, top_p = item.partition(":")
        try:
            temp, p = float(v), float(top_p or 1.0)
        except ValueError:
            raise InvalidInputError(f"temperatures take T or T:TOP_P, comma-separated, got "
                                    f"{item!r}") from None
        if not (math.isfinite(temp) and temp >= 0 and 0 < p <= 1):
            raise InvalidInputError(f"temperature {item!r}: T must be a finite number >= 0 "
                                    f"and top-p in (0, 1]")
        t = next((x for x in TEMPERATURES if x.temperature == temp and not top_p), None) \
            or Temperature(f"T={v}" + (f" top-p {top_p}" if top_p else ""), temp, p)
        if t not in out:
            out.append(t)
    return tuple(out)


def _bench(pair: ModelPair, model_dir: Path, engine: Engine, max_new: int, repeats: int,
           blocks: Sequence[int], n_prompts: int, with_hf: bool,
           log: Callable[[str], None],
           temperatures: tuple[Temperature, ...] = TEMPERATURES) -> dict[str, Any]:
    prompts = heldout_prompts(model_dir, pair)[:max(n_prompts, 8)]
    block = pair.draft.cfg.block_size
    hf_reason = hf_available() if with_hf else "disabled (--no-hf)"
    dtype = next(pair.target.parameters()).dtype
    hf = (HFGreedy(model_dir / "target", dtype, engine.backend.device)
          if hf_reason is None else None)
    cache_capture_s = warm_caches(engine, prompts[:8], max_new, block)
    res = measure_rows(engine, {1: prompts[:n_prompts], 8: prompts[:8]}, max_new, block,
                       repeats, hf, temperatures, log=log)
    batch1, batch8 = res["compare"][1], res["compare"][8]
    log(f"batch 1 over {batch1['prompts']} prompts: spec x{batch1['speedup_vs_target_only']:.2f}"
        " vs target-only" + (f", x{batch1['speedup_vs_hf']:.2f} vs transformers" if hf else ""))
    t1 = next((r for r in res["rows"] if r["batch"] == 1 and r["temperature_value"] == 1
               and r["top_p"] == 1), None)
    sweep = block_sweep(prompts[:min(4, n_prompts)], engine, max_new, blocks,
                        max(1, repeats - 1), log)
    capture = {"cache_sizing": cache_capture_s, "batch1": res["capture_s"][1],
               "batch8": res["capture_s"][8], "sweep": sum(r["capture_s"] for r in sweep)}
    return with_deprecated_aliases({
        "model": pair.name, "backend": engine.backend.name,
        "device": str(engine.backend.device), "block_size": block, "max_new_tokens": max_new,
        "tau": batch1["tau"], "tau_t1": t1["contenders"][FIXED]["tau"] if t1 else None,
        **{k: batch1[k] for k in ("target_only_tokens_per_s", "spec_tokens_per_s",
                                  "hf_tokens_per_s", "speedup_vs_target_only", "speedup_vs_hf",
                                  "efficiency", "time_split_per_step_s", "greedy_equal")},
        # every prompt at T = 0, every batch: fixed-block and adaptive spec == target-only
        "greedy_equal_all": all(r["greedy_equal"] for r in res["rows"]
                                if r["greedy_equal"] is not None),
        "rows": res["rows"], "step_profile": res["step_profile"],
        "batch1": batch1, "batch8": batch8, "sweep": sweep,
        # graph capture / compile seconds, outside every timed window (warm-up runs)
        "capture_s": capture,
        "requests": f"seeded SamplingParams(temperature, top_p, seed={SEED} + prompt index, "
                    "ignore_eos=True): the same seeds for every contender; exactly "
                    f"{max_new} new tokens per prompt on every side",
        "hf_baseline": hf_reason or f"transformers generate(), same weights "
                                    f"({str(dtype).replace('torch.', '')}, "
                                    f"{engine.backend.device}), eos_token_id=None (exactly "
                                    f"{max_new} tokens), greedy at T=0, sampled (torch RNG "
                                    f"seeded) otherwise",
        "assisted_generation": "not measured: transformers' assisted generation needs an "
                               "autoregressive draft LM; the bundled draft is a DFlash2 "
                               "block draft, which transformers cannot run"})


def merge_batch1(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Batch-1 runs over several prompts: total tokens over total time, τ over all steps."""
    out: dict[str, Any] = {"prompts": len(rows)}
    for key in (TARGET_ONLY, SPEC, HF):
        rates = [r[f"{key}_tokens_per_s"] for r in rows]
        if None in rates:
            out[f"{key}_tokens_per_s"] = None
            continue
        tokens = sum(r["tokens"] for r in rows)
        out[f"{key}_tokens_per_s"] = tokens / sum(r["tokens"] / x for r, x in zip(rows, rates))
    out["tau"] = statistics.fmean(r["tau"] for r in rows)
    out["speedup_vs_target_only"] = out["spec_tokens_per_s"] / out["target_only_tokens_per_s"]
    out["speedup_vs_hf"] = (out["spec_tokens_per_s"] / out["hf_tokens_per_s"]
                            if out["hf_tokens_per_s"] else None)
    out["efficiency"] = out["speedup_vs_target_only"] / out["tau"]
    out["greedy_equal"] = all(r["greedy_equal"] for r in rows)
    out["mismatched_prompts"] = [i for i, r in enumerate(rows) if not r["greedy_equal"]]
    out["time_split_per_step_s"] = {k: statistics.fmean(r["time_split_per_step_s"][k]
                                                        for r in rows)
                                    for k in rows[0]["time_split_per_step_s"]}
    return with_deprecated_aliases(out)


CONTENDER_TITLES = {TARGET_ONLY: "target-only", FIXED: "block-{block}", ADAPTIVE: "adaptive",
                    HF: "transformers"}


def rows_table(res: dict[str, Any]) -> str:
    """The bench's rows side by side, one line per temperature × batch: target-only tok/s |
    block-N tok/s (× vs target-only) τ | adaptive tok/s (×) τ [| transformers tok/s (×)]."""
    rows = res.get("rows") or []
    if not rows:
        return "no rows measured"
    names = [n for n in (TARGET_ONLY, FIXED, ADAPTIVE, HF) if n in rows[0]["contenders"]]
    title = lambda n: CONTENDER_TITLES[n].format(block=res.get("block_size"))  # noqa: E731
    head = f"{'':28}" + "".join(
        f"{title(n) + ' tok/s':>17}" if n == TARGET_ONLY else
        f"{title(n) + (' tok/s (x)' if n == HF else ' tok/s (x) tau'):>29}" for n in names)
    lines = [head]
    for r in rows:
        cells = f"{r['temperature'] + ', batch ' + str(r['batch']):28}"
        for n in names:
            c = r["contenders"][n]
            if n == TARGET_ONLY:
                cells += f"{c['tokens_per_s']:17.1f}"
                continue
            tau = f" {c['tau']:5.2f}" if c.get("tau") is not None else f"{'':6}"
            cells += f"{c['tokens_per_s']:14.1f} (x{c['speedup_vs_target_only'] or 0:5.2f}){tau}"
        if r.get("greedy_equal") is False:
            cells += f"  greedy spec != target-only: {r.get('mismatched_prompts')}"
        lines.append(cells)
    blocks = [f"{r['temperature']}, b{r['batch']}: {a['block_sizes']}"
              + (f" ({a['target_only_calls']} of {a['calls']} calls planned target-only)"
                 if a.get("target_only_calls") else "")
              for r in rows if (a := r["contenders"].get(ADAPTIVE))]
    if blocks:
        lines.append("adaptive blocks chosen (block size: steps): " + "; ".join(blocks))
    return "\n".join(lines)


def profile_table(prof: dict[str, Any]) -> str:
    """The profiling pass's per-step split (ms) and the sampled / greedy step-cost ratio."""
    rows = prof.get("rows") or []
    if not rows:
        return "step profile: not measured"
    lines = ["per-step cost, ms (separate profiling pass, device synced between phases):",
             f"{'':28}{'contender':>12}{'draft':>9}{'verify':>9}{'host':>9}{'step':>9}"]
    for r in rows:
        lines.append(f"{r['temperature'] + ', batch ' + str(r['batch']):28}{r['contender']:>12}"
                     + "".join(f"{1e3 * r[k]:9.3f}" for k in ("draft", "verify", "host",
                                                              "step")))
    ratios = prof.get("sampled_over_greedy") or []
    if ratios:
        goal = prof.get("goal_sampled_over_greedy")
        lines.append(f"sampled / greedy spec step cost (block {ratios[0]['block_size']}, goal "
                     f"<= {goal}): " + ", ".join(f"{x['temperature']} b{x['batch']} "
                                                  f"x{x['ratio']:.2f}" for x in ratios))
    return "\n".join(lines)
