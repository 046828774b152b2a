"""Measure a pair on held-out prompts with the engine: τ, spec vs target-only tokens/s, lossless
check. The timing is :func:`dflash2rt.bench.measure.measure` (every mode warmed up on the same
requests before it is timed)."""

from __future__ import annotations

from ..backend import Backend
from ..bench.measure import SPEC, TARGET_ONLY, engine_contender, measure as measure_contenders, \
    resolve_backend
from ..engine.engine import Engine
from ..engine.request import Request, SamplingParams
from ..models.pair import ModelPair


def measure(pair: ModelPair, backend: Backend | str, prompts: list[list[int]], new_tokens: int,
            temperature: float = 0.0, block_size: int | None = None, seed: int = 0,
            baseline: bool = True) -> dict:
    """Batch-1 runs of every prompt, spec and (if ``baseline``) target-only, each warmed up once
    untimed, then timed in one interleaved round.

    Returns τ over all steps, the summed accept histogram, tokens/s of both modes (generated
    tokens / wall time, summed over prompts; graph capture excluded), and for greedy runs the
    prompts whose spec output differs from the target-only output. ``target_tokens_per_s`` and
    ``speedup`` are deprecated aliases of ``target_only_tokens_per_s`` and
    ``speedup_vs_target_only`` (kept one release).
    """
    engine = Engine(pair, resolve_backend(backend))
    batches = [[Request(tuple(ids), SamplingParams(max_new_tokens=new_tokens,
                                                   temperature=temperature, seed=seed,
                                                   ignore_eos=True), key=i)]
               for i, ids in enumerate(prompts)]
    contenders = [engine_contender(SPEC, engine, batches, True, block_size)]
    if baseline:
        contenders.append(engine_contender(TARGET_ONLY, engine, batches, False))
    m = measure_contenders(contenders, 1)
    spec = m[SPEC]
    hist: list[int] = []
    for st in spec.stats:
        for a, c in enumerate(st.accept_hist):
            hist += [0] * (a + 1 - len(hist))
            hist[a] += c

    def rate(samples) -> float:
        seconds = sum(s.seconds for s in samples)
        return sum(s.tokens for s in samples) / seconds if seconds else 0.0

    result = {
        "prompts": len(prompts), "new_tokens": new_tokens, "temperature": temperature,
        "block_size": block_size or pair.draft.cfg.block_size,
        "tau": spec.tau, "accept_hist": hist,
        "spec_tokens_per_s": rate(spec.samples),
        "capture_s": sum(x.capture_s for x in m.values()),
    }
    if baseline:
        tonly = m[TARGET_ONLY]
        result["target_only_tokens_per_s"] = rate(tonly.samples)
        result["speedup_vs_target_only"] = result["spec_tokens_per_s"] / max(
            result["target_only_tokens_per_s"], 1e-9)
        # deprecated aliases (one release): read the target_only keys
        result["target_tokens_per_s"] = result["target_only_tokens_per_s"]
        result["speedup"] = result["speedup_vs_target_only"]
        if temperature == 0:
            result["greedy_mismatches"] = [i for i, (a, b) in enumerate(zip(spec.samples,
                                                                            tonly.samples))
                                           if a.outputs != b.outputs]
    return result
