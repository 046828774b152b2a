"""``dflash2rt bench``: batch 1 and 8, target-only vs speculative vs transformers, block sweep."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any, Callable, Sequence

from ..backend import Backend
from ..engine.engine import Engine
from ..models.pair import ModelPair
from .hf_baseline import HFGreedy, hf_available
from .measure import (HF, SPEC, TARGET_ONLY, block_sweep, compare, engine_contender, measure,
                      requests, resolve_backend, warm_caches, with_deprecated_aliases)


def heldout_prompts(model_dir: Path, pair: ModelPair) -> list[tuple[int, ...]]:
    """The model's held-out prompt set, tokenised."""
    file = model_dir / "heldout_prompts.json"
    items = json.loads(file.read_text(encoding="utf-8"))
    texts = [x if isinstance(x, str) else x["prompt"] for x in items]
    return [tuple(pair.tokenizer.encode(t)) for t in texts]


def run_bench(pair: ModelPair, model_dir: Path, backend: Backend | str | None = None,
              max_new: int = 64, repeats: int = 3, blocks: Sequence[int] = (2, 4, 8, 16),
              n_prompts: int = 8, with_hf: bool = True,
              log: Callable[[str], None] = print) -> dict[str, Any]:
    """The bench's JSON: batch 1 (per prompt, merged) and batch 8 comparisons, τ at T=1, and
    the block-size sweep, every measurement warmed up before it is timed. ``ar_tokens_per_s``
    and ``speedup_vs_ar`` are deprecated aliases of the ``target_only`` keys (one release)."""
    with Engine(pair, resolve_backend(backend)) as engine:   # graphs captured once, replayed
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
    cache_capture_s = warm_caches(engine, prompts[:8], max_new, block)
    b1 = [compare([p], engine, hf, max_new, block, repeats, log) for p in prompts[:n_prompts]]
    batch1 = merge_batch1(b1)
    log(f"batch 1 over {len(b1)} prompts: spec x{batch1['speedup_vs_target_only']:.2f} vs "
        "target-only" + (f", x{batch1['speedup_vs_hf']:.2f} vs transformers" if hf else ""))
    batch8 = compare(prompts[:8], engine, hf, max_new, block, repeats, log)
    sampled = measure([engine_contender("spec_t1", engine, [
        requests([p], max_new, temperature=1.0, seed=1) for p in prompts[:n_prompts]], True)],
        1)["spec_t1"]
    sweep = block_sweep(prompts[:min(4, n_prompts)], engine, max_new, blocks,
                        max(1, repeats - 1), log)
    capture = {"cache_sizing": cache_capture_s,
               "batch1": sum(sum(r["capture_s"].values()) for r in b1),
               "batch8": sum(batch8["capture_s"].values()), "sampled": sampled.capture_s,
               "sweep": sum(r["capture_s"] for r in sweep)}
    return with_deprecated_aliases({
        "model": pair.name, "backend": engine.backend.name,
        "device": str(engine.backend.device), "block_size": block, "max_new_tokens": max_new,
        "tau": batch1["tau"], "tau_t1": sampled.tau,
        **{k: batch1[k] for k in ("target_only_tokens_per_s", "spec_tokens_per_s",
                                  "hf_tokens_per_s", "speedup_vs_target_only", "speedup_vs_hf",
                                  "efficiency", "time_split_per_step_s", "greedy_equal")},
        "batch1": batch1, "batch8": batch8, "sweep": sweep,
        # graph capture / compile seconds, outside every timed window (warm-up runs)
        "capture_s": capture,
        "hf_baseline": hf_reason or f"transformers generate(), greedy, same weights "
                                    f"({str(dtype).replace('torch.', '')}, "
                                    f"{engine.backend.device})",
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
