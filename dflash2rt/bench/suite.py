"""``dflash2rt bench``: batch 1 and 8, target-only vs speculative vs transformers, block sweep."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any, Callable, Sequence

from ..engine.engine import Engine
from ..models.pair import ModelPair
from .hf_baseline import HFGreedy, hf_available
from .measure import Timing, engine_run, interleave, requests


def heldout_prompts(model_dir: Path, pair: ModelPair) -> list[tuple[int, ...]]:
    """The model's held-out prompt set, tokenised."""
    file = model_dir / "heldout_prompts.json"
    items = json.loads(file.read_text(encoding="utf-8"))
    texts = [x if isinstance(x, str) else x["prompt"] for x in items]
    return [tuple(pair.tokenizer.encode(t)) for t in texts]


def _compare(batch: Sequence[Sequence[int]], engine: Engine, hf: HFGreedy | None, max_new: int,
             block: int, repeats: int, log: Callable[[str], None]) -> dict[str, Any]:
    """Target-only, speculative and HF greedy on ``batch`` (one request per prompt)."""
    ar, spec, hfr = Timing(), Timing(), Timing()
    reqs = requests(batch, max_new)
    runs = {"ar": lambda: engine_run(engine, reqs, False, None, ar),
            "spec": lambda: engine_run(engine, reqs, True, block, spec)}
    if hf is not None:
        def hf_run() -> None:
            outs, seconds = hf.generate(batch, max_new)
            hfr.tokens, hfr.outputs = sum(map(len, outs)), outs
            hfr.seconds.append(seconds)
        runs["hf"] = hf_run
    interleave(runs, repeats)
    res: dict[str, Any] = {
        "prompts": len(batch), "tokens": spec.tokens, "tau": spec.tau,
        "ar_tokens_per_s": ar.tokens_per_s, "spec_tokens_per_s": spec.tokens_per_s,
        "hf_tokens_per_s": hfr.tokens_per_s if hf is not None else None,
        "greedy_equal": spec.outputs == ar.outputs,
        "hf_equal": hfr.outputs == ar.outputs if hf is not None else None,
        "time_split_per_step_s": {k: spec.per_step(k) for k in ("draft", "select", "verify",
                                                                 "graphs", "host")},
    }
    res["speedup_vs_ar"] = res["spec_tokens_per_s"] / res["ar_tokens_per_s"]
    res["speedup_vs_hf"] = (res["spec_tokens_per_s"] / res["hf_tokens_per_s"]
                            if hf is not None else None)
    res["efficiency"] = res["speedup_vs_ar"] / res["tau"] if res["tau"] else None
    res["mismatched_prompts"] = [i for i, (a, b) in enumerate(zip(spec.outputs, ar.outputs))
                                 if a != b]
    log(f"batch {len(batch)}: ar {res['ar_tokens_per_s']:.1f} tok/s, spec "
        f"{res['spec_tokens_per_s']:.1f} tok/s (x{res['speedup_vs_ar']:.2f}, tau {res['tau']:.2f})"
        + (f", hf {res['hf_tokens_per_s']:.1f} tok/s" if hf is not None else ""))
    return res


def _sweep(prompts, engine: Engine, max_new: int, blocks: Sequence[int], repeats: int,
           log: Callable[[str], None]) -> list[dict[str, Any]]:
    """τ and speedup per block size (batch 1), with the fitted speedup model."""
    ar = Timing()
    spec = {b: Timing() for b in blocks}
    runs = {"ar": lambda: [engine_run(engine, requests([p], max_new), False, None, ar)
                           for p in prompts]}
    for b in blocks:
        runs[f"spec{b}"] = (lambda b=b: [engine_run(engine, requests([p], max_new), True, b,
                                                    spec[b]) for p in prompts])
    interleave(runs, repeats)
    t_target = statistics.median(s.wall_s - s.time["prefill"] for s in ar.stats) / max_new
    rows = []
    for b in blocks:
        st = spec[b].stats
        tau = sum(s.committed for s in st) / sum(s.request_steps for s in st)
        t_draft = statistics.median((s.time["draft"] + s.time["select"]) / s.steps for s in st)
        t_verify = statistics.median((s.time["verify"] + s.time["graphs"] + s.time["host"])
                                     / s.steps for s in st)        # graphs: draft + verify
        measured = statistics.median(s.tokens_per_s for s in st) / \
            statistics.median(s.tokens_per_s for s in ar.stats)
        rows.append({"block_size": b, "tau": tau, "speedup_vs_ar": measured,
                     "t_target_s": t_target, "t_draft_s": t_draft, "t_verify_s": t_verify,
                     "predicted_speedup": tau * t_target / (t_draft + t_verify)})
        log(f"block {b:2d}: tau {tau:.2f}, speedup x{measured:.2f} (model x"
            f"{rows[-1]['predicted_speedup']:.2f})")
    return rows


def _warm_up(engine: Engine, prompts: Sequence[Sequence[int]], max_new: int, block: int,
             blocks: Sequence[int]) -> None:
    """Untimed runs first. With graphs: every mode, block size and batch bucket the timed runs
    use, batch 8 before batch 1 so one set of caches holds both buckets' graphs (captured once,
    as an engine does at start-up; the timed runs replay them)."""
    if engine.backend.graph_adapter is None:
        engine_run(engine, requests(prompts[:1], 8), True, None, Timing())
        return
    for spec, b, sizes in [(False, None, (8, 1)), (True, block, (8, 1))] + \
            [(True, b, (1,)) for b in blocks if b != block]:
        for n in sizes:
            engine_run(engine, requests(prompts[:n], max_new), spec, b, Timing())


def run_bench(pair: ModelPair, model_dir: Path, backend: str | None = None, max_new: int = 64,
              repeats: int = 3, blocks: Sequence[int] = (2, 4, 8, 16), n_prompts: int = 8,
              with_hf: bool = True, log: Callable[[str], None] = print) -> dict[str, Any]:
    with Engine(pair, backend) as engine:   # graphs captured once, replayed by every run
        return _bench(pair, model_dir, engine, max_new, repeats, blocks, n_prompts, with_hf, log)


def _bench(pair: ModelPair, model_dir: Path, engine: Engine, max_new: int, repeats: int,
           blocks: Sequence[int], n_prompts: int, with_hf: bool,
           log: Callable[[str], None]) -> dict[str, Any]:
    prompts = heldout_prompts(model_dir, pair)[:max(n_prompts, 8)]
    block = pair.draft.cfg.block_size
    hf_reason = hf_available() if with_hf else "disabled (--no-hf)"
    dtype = next(pair.target.parameters()).dtype
    hf = (HFGreedy(model_dir / "target", dtype, engine.backend.device)
          if hf_reason is None else None)
    _warm_up(engine, prompts[:8], max_new, block, blocks)
    b1 = [_compare([p], engine, hf, max_new, block, repeats, log) for p in prompts[:n_prompts]]
    batch1 = _merge(b1)
    log(f"batch 1 over {len(b1)} prompts: spec x{batch1['speedup_vs_ar']:.2f} vs target-only"
        + (f", x{batch1['speedup_vs_hf']:.2f} vs transformers" if hf else ""))
    batch8 = _compare(prompts[:8], engine, hf, max_new, block, repeats, log)
    sampled = Timing()
    for p in prompts[:n_prompts]:
        engine_run(engine, requests([p], max_new, temperature=1.0, seed=1), True, None, sampled)
    tau_t1 = sum(s.committed for s in sampled.stats) / sum(s.request_steps for s in sampled.stats)
    sweep = _sweep(prompts[:min(4, n_prompts)], engine, max_new, blocks, max(1, repeats - 1), log)
    return {"model": pair.name, "backend": engine.backend.name,
            "device": str(engine.backend.device), "block_size": block, "max_new_tokens": max_new,
            "tau": batch1["tau"], "tau_t1": tau_t1,
            **{k: batch1[k] for k in ("ar_tokens_per_s", "spec_tokens_per_s", "hf_tokens_per_s",
                                      "speedup_vs_ar", "speedup_vs_hf", "efficiency",
                                      "time_split_per_step_s", "greedy_equal")},
            "batch1": batch1, "batch8": batch8, "sweep": sweep,
            "hf_baseline": hf_reason or f"transformers generate(), greedy, same weights "
                                        f"({str(dtype).replace('torch.', '')}, "
                                        f"{engine.backend.device})",
            "assisted_generation": "not measured: transformers' assisted generation needs an "
                                   "autoregressive draft LM; the bundled draft is a DFlash2 "
                                   "block draft, which transformers cannot run"}


def _merge(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Batch-1 runs over several prompts: total tokens over total time, τ over all steps."""
    out: dict[str, Any] = {"prompts": len(rows)}
    for key in ("ar", "spec", "hf"):
        rates = [r[f"{key}_tokens_per_s"] for r in rows]
        if None in rates:
            out[f"{key}_tokens_per_s"] = None
            continue
        tokens = sum(r["tokens"] for r in rows)
        out[f"{key}_tokens_per_s"] = tokens / sum(r["tokens"] / x for r, x in zip(rows, rates))
    out["tau"] = statistics.fmean(r["tau"] for r in rows)
    out["speedup_vs_ar"] = out["spec_tokens_per_s"] / out["ar_tokens_per_s"]
    out["speedup_vs_hf"] = (out["spec_tokens_per_s"] / out["hf_tokens_per_s"]
                            if out["hf_tokens_per_s"] else None)
    out["efficiency"] = out["speedup_vs_ar"] / out["tau"]
    out["greedy_equal"] = all(r["greedy_equal"] for r in rows)
    out["mismatched_prompts"] = [i for i, r in enumerate(rows) if not r["greedy_equal"]]
    out["time_split_per_step_s"] = {k: statistics.fmean(r["time_split_per_step_s"][k]
                                                        for r in rows)
                                    for k in rows[0]["time_split_per_step_s"]}
    return out
