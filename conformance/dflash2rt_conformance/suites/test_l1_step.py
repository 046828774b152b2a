"""L1 step: one full speculative step (prefill token, draft forward with context KV, rope,
RMSNorm, GQA attention and conv-wrapped sublayers, selector, target verify, acceptance) on a
small model, backend vs the float64 reference from the model's NumPy weights.

Floats compare within ``tolerances`` (spec_step.*); token ids exactly — unless the reference's
own margin at the deciding point is within the dtype's decision noise, in which case the
near-tie is listed as an exemption and the step stops there (its inputs then differ)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch

from dflash2rt.models.config import TargetConfig
from dflash2rt.models.rope import inv_freq, rope_cos_sin
from dflash2rt_conformance import models
from dflash2rt_conformance.compare import ConformanceFailure, Context, check
from dflash2rt_conformance.harness import DTYPES
from dflash2rt_conformance.reference import rope as r_rope
from dflash2rt_conformance.reference.step import spec_step
from dflash2rt_conformance.stepper import run_step
from dflash2rt_conformance.tolerances import decision_noise

pytestmark = pytest.mark.dflash2rt_level("L1")


@dataclass(frozen=True, kw_only=True)
class StepCase:
    """One speculative step: a tiny ``model`` pair ("qwen3" / "llama") made from ``seed`` with
    the draft's ``block`` size, ``taps`` conv taps and ``vocab``; the request's prompt and
    temperature / top_k / top_p."""

    name: str
    model: str
    seed: int
    prompt: tuple[int, ...]
    temperature: float
    top_k: int = 0
    top_p: float = 1.0
    block: int
    taps: int
    vocab: int
    tier: str = "small"


CASES = [
    StepCase(name="qwen3_greedy", model="qwen3", seed=0, prompt=(3, 14, 15, 9, 26, 5, 35),
             temperature=0.0, block=8, taps=2, vocab=61),
    StepCase(name="qwen3_sampled_v11", model="qwen3", seed=3, prompt=(2, 7, 8, 10),
             temperature=1.0, block=8, taps=3, vocab=11),
    StepCase(name="llama_filtered_v13", model="llama", seed=2,
             prompt=(11, 5, 8, 12, 1, 2, 3, 4, 5, 6, 7), temperature=0.8, top_k=6, top_p=0.9,
             block=5, taps=2, vocab=13),
    StepCase(name="qwen3_prompt1_b3", model="qwen3", seed=3, prompt=(42,), temperature=1.3,
             top_p=0.95, block=3, taps=3, vocab=61, tier="exhaustive"),
    StepCase(name="llama_greedy_b16", model="llama", seed=4, prompt=(1, 1, 2, 3, 5, 8, 13),
             temperature=0.0, block=16, taps=2, vocab=61, tier="exhaustive"),
    StepCase(name="qwen3_sampled_v7_b16", model="qwen3", seed=4, prompt=(1, 2, 3),
             temperature=2.0, block=16, taps=2, vocab=7),
]


def _params():
    for c in CASES:
        for dtype in ("float64", "float32"):
            marks = [pytest.mark.dflash2rt_exhaustive] if c.tier == "exhaustive" else []
            yield pytest.param(c, dtype, id=f"{c.name}-{dtype}", marks=marks)


@pytest.mark.parametrize("case,dtype", list(_params()))
def test_spec_step(case, dtype, backend, results):
    name, seed, prompt, block = case.name, case.seed, case.prompt, case.block
    temp, top_k, top_p = case.temperature, case.top_k, case.top_p
    if DTYPES[dtype] not in backend.dtypes:
        pytest.skip(f"backend {backend.name} does not declare {dtype}")
    pair = models.tiny_pair(seed, DTYPES[dtype], case.model, block, case.taps,
                            vocab=case.vocab)
    pair = models.pair_on(pair, backend.device)
    got = run_step(pair, backend, prompt, seed, 7, temp, top_k, top_p)
    tw, tcfg = models.target_reference(pair.target)
    dw, dcfg = models.draft_reference(pair.draft)
    want = spec_step(tw, tcfg, dw, dcfg, prompt, seed, 7, temp, top_k, top_p)
    ctx = Context("L1", "spec_step", dtype, name, seed,
                  {"prompt": f"[{len(prompt)}]", "block": str(block), "T": str(temp)})
    scale = float(np.abs(want["verify_logits"]).max())
    margins = want["margins"]

    def ints(what, g, w, deciding):
        if repr(np.asarray(g, dtype=object).tolist()) == repr(np.asarray(w, dtype=object)
                                                              .tolist()):
            return True
        m = min(margins.get(k, np.inf) for k in deciding)
        noise = decision_noise(dtype, scale)
        if m <= noise:
            results.exempt("L1", f"spec_step {name} {dtype}: {what} differs at a near-tie",
                           got=str(g), want=str(w), margin=m, noise=noise)
            return False
        raise ConformanceFailure(f"{ctx.head()}\n  {what}: got {g}, want {w}; the reference "
                                 f"margin {m:.3g} is above the {dtype} decision noise "
                                 f"{noise:.3g}, so this is not a near-tie")

    if not ints("anchor (prefill token)", got["anchor"], want["anchor"],
                ["prefill_argmax", "prefill_cdf"]):
        return
    for key, op in (("draft_hidden", "hidden"), ("draft_logits", "logits")):
        check(ctx, op, got[key], want[key], recorder=results)
    if not ints("candidates", got["candidates"].cpu().numpy(), want["candidates"],
                ["topk_boundary"]):
        return
    if not ints("draft", got["draft"].cpu().numpy(), want["draft"], ["walk"]):
        return
    check(ctx, "q", got["q"], want["q"], recorder=results)
    check(ctx, "logits", got["verify_logits"], want["verify_logits"], recorder=results)
    ints("accept_len / tokens", [got["accept_len"]] + got["tokens"].cpu().numpy().tolist(),
         [want["accept_len"]] + [int(x) for x in want["tokens"]],
         ["verify_argmax", "accept_threshold", "emit_cdf"])
    results.metric("L1", f"spec_step {name} {dtype} accept_len", got["accept_len"])


ROPE_CASES = [  # name, config.json rope keys, head_dim: every rope type the runtime supports
    ("default_1e4_hd8", {"rope_theta": 10000.0}, 8),
    ("default_1e6_hd128", {"rope_theta": 1e6}, 128),
    ("linear_x2.5_hd64", {"rope_theta": 5e5, "rope_scaling": {"type": "linear", "factor": 2.5}},
     64),
    ("llama3_x8_hd128", {"rope_theta": 5e5, "max_position_embeddings": 131072, "rope_scaling": {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192}}, 128),
    ("yarn_x4_hd96", {"rope_theta": 1e6, "max_position_embeddings": 131072, "rope_scaling": {
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}}, 96),
    ("yarn_mscale_beta_hd64", {"rope_theta": 1e4, "rope_scaling": {
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256,
        "beta_fast": 16, "mscale": 0.707, "mscale_all_dim": 1.0}}, 64),
    ("yarn_default_factor_untruncated_hd16", {"max_position_embeddings": 4096, "rope_scaling": {
        "rope_type": "yarn", "original_max_position_embeddings": 512, "truncate": False}}, 16),
    ("yarn_rope_parameters_attention_factor_hd32", {
        "original_max_position_embeddings": 128, "rope_parameters": {
            "rope_type": "yarn", "factor": 3.0, "attention_factor": 1.3, "rope_theta": 2e4}},
     32),
]


@pytest.mark.parametrize("name,rope,head_dim", [pytest.param(*c, id=c[0]) for c in ROPE_CASES])
def test_rope_from_config(name, rope, head_dim, backend, results):
    """The runtime's rope frequencies and attention scaling (parsed from a config.json) vs the
    reference's, computed from the same config in NumPy (``reference.rope``): a float32 ulp
    apart at most (a float32 ``pow`` that is not correctly rounded), within the float32 row."""
    config = {**models.target_dict("llama"), "head_dim": head_dim, **rope}
    cfg = TargetConfig.from_dict(config)
    inv, scaling = inv_freq(cfg.rope, head_dim)
    want, want_scaling = r_rope.inv_freq(config, head_dim)
    ctx = Context("L1", "rope", "float32", name, None, {"head_dim": str(head_dim)})
    check(ctx, "inv_freq", inv, want, dtype=DTYPES["float32"], recorder=results)
    check(ctx, "attention_scaling", np.float64(scaling), np.float64(want_scaling),
          recorder=results)
    pos = torch.tensor([0, 1, 7, 63], device=backend.device)
    cos, sin = rope_cos_sin(inv, scaling, pos, torch.float64)
    want_cos, want_sin = r_rope.cos_sin([0, 1, 7, 63], config, head_dim)
    check(ctx, "cos", cos, want_cos, recorder=results)
    check(ctx, "sin", sin, want_sin, recorder=results)
