"""Measure a pair on held-out prompts with the engine: τ, spec vs target-only tokens/s, lossless check."""

from __future__ import annotations

from ..backend import Backend
from ..engine.engine import Engine
from ..engine.request import Request, SamplingParams
from ..models.pair import ModelPair


def measure(pair: ModelPair, backend: Backend | str, prompts: list[list[int]], new_tokens: int,
            temperature: float = 0.0, block_size: int | None = None, seed: int = 0,
            baseline: bool = True) -> dict:
    """Batch-1 runs of every prompt, spec and (if ``baseline``) target-only interleaved.

    Returns τ over all steps, the summed accept histogram, tokens/s of both modes (generated
    tokens / wall time, summed over prompts), and for greedy runs the prompts whose spec output
    differs from the target-only output.
    """
    engine = Engine(pair, backend)
    warm = Request(tuple(prompts[0][:8]), SamplingParams(max_new_tokens=4))
    engine.generate([warm], spec=True, block_size=block_size)             # allocator / lazy init
    engine.generate([warm], spec=False)
    committed = steps = 0
    hist: list[int] = []
    wall = {"spec": 0.0, "target": 0.0}
    gen = {"spec": 0, "target": 0}
    mismatches: list[int] = []
    for i, ids in enumerate(prompts):
        req = Request(tuple(ids), SamplingParams(max_new_tokens=new_tokens, temperature=temperature,
                                                 seed=seed, ignore_eos=True), key=i)
        (out,), st = engine.generate([req], spec=True, block_size=block_size)
        committed += st.committed
        steps += st.request_steps
        for a, c in enumerate(st.accept_hist):
            hist += [0] * (a + 1 - len(hist))
            hist[a] += c
        wall["spec"] += st.wall_s
        gen["spec"] += st.generated
        if baseline:
            (ref,), rt = engine.generate([req], spec=False)
            wall["target"] += rt.wall_s
            gen["target"] += rt.generated
            if temperature == 0 and ref.token_ids != out.token_ids:
                mismatches.append(i)
    result = {
        "prompts": len(prompts), "new_tokens": new_tokens, "temperature": temperature,
        "block_size": block_size or pair.draft.cfg.block_size,
        "tau": committed / steps if steps else 0.0, "accept_hist": hist,
        "spec_tokens_per_s": gen["spec"] / wall["spec"] if wall["spec"] else 0.0,
    }
    if baseline:
        result["target_tokens_per_s"] = gen["target"] / wall["target"] if wall["target"] else 0.0
        result["speedup"] = result["spec_tokens_per_s"] / max(result["target_tokens_per_s"], 1e-9)
        if temperature == 0:
            result["greedy_mismatches"] = mismatches
    return result
