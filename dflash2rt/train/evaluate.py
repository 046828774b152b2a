"""Measure a pair on held-out prompts with the engine: τ, spec vs target-only tokens/s, lossless
check. The timing is :func:`dflash2rt.bench.measure.measure` (every mode warmed up on the same
requests before it is timed). Beside each τ, :func:`topk_mass`: the target's mean probability mass
on the selector's K candidates per slot, an upper bound on the per-slot acceptance."""

from __future__ import annotations

import torch

from ..backend import Backend, TorchOpsBackend
from ..bench.measure import SPEC, TARGET_ONLY, engine_contender, measure as measure_contenders, \
    resolve_backend
from ..engine.engine import Engine
from ..engine.request import Request, SamplingParams
from ..models.pair import ModelPair
from ..ops.sampling import target_probs
from ..ops.selector import topk_lowest_index


def measure(pair: ModelPair, backend: Backend | str, prompts: list[list[int]], new_tokens: int,
            temperature: float = 0.0, block_size: int | None = None, seed: int = 0,
            baseline: bool = True, top_p: float = 1.0, mass: bool = True) -> dict:
    """Batch-1 runs of every prompt, spec and (if ``baseline``) target-only, each warmed up once
    untimed, then timed in one interleaved round.

    Returns τ over all steps, the summed accept histogram, tokens/s of both modes (generated
    tokens / wall time, summed over prompts; graph capture excluded), and for greedy runs the
    prompts whose spec output differs from the target-only output. With ``mass``, also
    ``topk_mass`` / ``topk_mass_per_slot`` (:func:`topk_mass` on the spec run's own outputs,
    with the draft's block size). ``target_tokens_per_s`` and
    ``speedup`` are deprecated aliases of ``target_only_tokens_per_s`` and
    ``speedup_vs_target_only`` (kept one release).
    """
    engine = Engine(pair, resolve_backend(backend))
    block = block_size or pair.draft.cfg.block_size      # fixed: None would run adaptive blocks
    batches = [[Request(tuple(ids), SamplingParams(max_new_tokens=new_tokens,
                                                   temperature=temperature, top_p=top_p,
                                                   seed=seed, ignore_eos=True), key=i)]
               for i, ids in enumerate(prompts)]
    contenders = [engine_contender(SPEC, engine, batches, True, block)]
    if baseline:
        contenders.append(engine_contender(TARGET_ONLY, engine, batches, False))
    m = measure_contenders(contenders, 1)
    spec = m[SPEC]
    hist, steps_per_block = _step_counts(spec.stats)
    result = {
        "prompts": len(prompts), "new_tokens": new_tokens, "temperature": temperature,
        "top_p": top_p, "block_size": block,
        "tau": spec.tau, "accept_hist": hist, "steps_per_block": steps_per_block,
        "spec_tokens_per_s": _rate(spec.samples),
        "capture_s": sum(x.capture_s for x in m.values()),
    }
    if baseline:
        result.update(_against_target_only(spec, m[TARGET_ONLY], result["spec_tokens_per_s"],
                                           temperature))
    if mass:
        result.update(topk_mass(pair, prompts, spec.outputs, temperature, top_p))
    return result


def _step_counts(stats) -> tuple[list[int], dict[int, int]]:
    """The accept histogram and the steps per block size, summed over the runs' stats."""
    hist: list[int] = []
    steps_per_block: dict[int, int] = {}
    for st in stats:
        for b, n in st.block_sizes.items():
            steps_per_block[b] = steps_per_block.get(b, 0) + n
        for a, c in enumerate(st.accept_hist):
            hist += [0] * (a + 1 - len(hist))
            hist[a] += c
    return hist, steps_per_block


def _rate(samples) -> float:
    """Generated tokens per second, summed over the samples."""
    seconds = sum(s.seconds for s in samples)
    return sum(s.tokens for s in samples) / seconds if seconds else 0.0


def _against_target_only(spec, tonly, spec_rate: float, temperature: float) -> dict:
    """Target-only's tokens/s, the speedup over it (and their deprecated aliases), and for greedy
    runs the prompts whose spec output differs from target-only's."""
    out: dict = {"target_only_tokens_per_s": _rate(tonly.samples)}
    out["speedup_vs_target_only"] = spec_rate / max(out["target_only_tokens_per_s"], 1e-9)
    # deprecated aliases (one release): read the target_only keys
    out["target_tokens_per_s"] = out["target_only_tokens_per_s"]
    out["speedup"] = out["speedup_vs_target_only"]
    if temperature == 0:
        out["greedy_mismatches"] = [i for i, (a, b) in enumerate(zip(spec.samples, tonly.samples))
                                    if a.outputs != b.outputs]
    return out


@torch.no_grad()
def forced_blocks(pair: ModelPair, prompts: list[list[int]], outputs: list[list[int]]):
    """Teacher-forced draft blocks over each prompt + its continuation: for every prompt with an
    anchor (a position of the generated part with a full block after it), yields
    (``fwd``, the target's forward of the whole sequence; ``rows`` [N, γ], the positions whose
    target law scores slot e of each of the N anchors; ``block`` [N, B], each anchor's true
    block; ``h`` [N, γ, H], the draft's normed hidden state of each slot)."""
    from . import distill
    from .target import lm_forward

    draft, target = pair.draft, pair.target
    b = draft.cfg.block_size
    gamma = b - 1
    dev = pair.device
    backend = TorchOpsBackend("torch", dev, (pair.dtype,))
    for prompt, out in zip(prompts, outputs):
        seq = list(prompt) + list(out)
        n, p = len(seq), len(prompt)
        if n - gamma <= p:
            continue
        fwd = lm_forward(target, [seq])                                     # logits [1, n, V]
        anchors = torch.arange(p, n - gamma, device=dev).view(1, -1)        # [1, N]
        toks = torch.tensor(seq, device=dev)
        block = toks[anchors.unsqueeze(-1) + torch.arange(b, device=dev)]   # [1, N, B]
        ids = torch.full_like(block, draft.cfg.mask_token_id)
        ids[..., 0] = block[..., 0]
        batch = distill.Batch(fwd.taps, torch.tensor([n], device=dev), anchors, ids,
                              block[..., 1:])
        h = distill.draft_hidden(draft, target, batch, backend)[:, :, 1:]   # [1, N, γ, H]
        rows = anchors[0].view(-1, 1) + torch.arange(gamma, device=dev)     # [N, γ]
        yield fwd, rows, block[0], h[0]


def processed_law(logits: torch.Tensor, temperature: float, top_p: float = 1.0) -> torch.Tensor:
    """The target's law of each row of logits [n, V] after temperature and top-p, float32;
    one-hot on the argmax at T = 0."""
    if temperature <= 0:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    dev = logits.device
    return target_probs(logits.float().unsqueeze(0), torch.tensor([float(temperature)], device=dev),
                        torch.tensor([0], device=dev), torch.tensor([float(top_p)], device=dev),
                        top_k_max=0, top_p_rows=() if top_p >= 1 else None)[0]


@torch.no_grad()
def topk_mass(pair: ModelPair, prompts: list[list[int]], outputs: list[list[int]],
              temperature: float, top_p: float = 1.0) -> dict:
    """The target's probability mass on the selector's K candidates, slot by slot.

    Teacher-forced on each prompt + its continuation (a spec run's outputs: the target's own law,
    as decoding is lossless; ``forced_blocks``): at every anchor a of the generated part with a
    full block after it, the draft's candidates of slot e (top-K of its logits; they do not
    depend on the walk) against the target's law of token a+e+1 after logit processing
    (temperature, top-p; at T=0 one-hot on its argmax). Chain speculative sampling accepts slot
    e with probability Σ_k min(p, q) ≤ Σ_k p(cand_k), so the mean is an upper bound on the
    per-slot acceptance. → ``topk_mass`` (mean over anchors and slots) and
    ``topk_mass_per_slot`` [γ].
    """
    gamma = pair.draft.cfg.block_size - 1
    total = torch.zeros(gamma, dtype=torch.float64)
    count = 0
    for fwd, rows, _, h in forced_blocks(pair, prompts, outputs):
        cand = topk_lowest_index(pair.target.lm_head(h), pair.draft.cfg.selector_top_k)[1]
        probs = processed_law(fwd.logits[0], temperature, top_p)           # [n, V]
        m = probs[rows].gather(-1, cand).sum(-1)                            # [N, γ]
        total += m.double().sum(0).cpu()
        count += m.shape[0]
    per_slot = (total / max(count, 1)).tolist()
    return {"topk_mass": sum(per_slot) / gamma, "topk_mass_per_slot": per_slot}
