"""The recipe's knobs: ``RecipeConfig`` (every count and weight of a run, from one seed) and the
mix of sampling settings its distillation data is generated with."""

from __future__ import annotations

import dataclasses
import math
import random
from dataclasses import dataclass, field

from ..engine.request import check_count, is_int
from ..errors import InvalidInputError
from ..ops.sampling import check_sampling_params
from .draft_init import DraftShape
from .target import TargetShape

# What a whole run of the default counts takes on 2 cores, in minutes (the shipped pair's runs:
# docs/benchmarks/bundled-pair.md).
DEFAULT_MINUTES = 35.0

# Distillation continuations: (temperature, top_p, share of the prompts). Greedy continuations keep
# τ at T=0; sampled ones show the draft the paths (and the target laws) it meets when sampling.
GEN_MIX = ((0.0, 1.0, 0.4), (1.0, 1.0, 0.3), (0.7, 0.95, 0.3))
# The evaluation's settings: (report key, temperature, top_p).
EVAL_SETTINGS = (("eval_greedy", 0.0, 1.0), ("eval_t07_p095", 0.7, 0.95), ("eval_t1", 1.0, 1.0))


@dataclass(frozen=True)
class RecipeConfig:
    """Every knob of the recipe; step counts are fixed numbers, so a run never depends on the clock."""

    seed: int = 0
    threads: int = 2                 # results depend on it (the shipped pair used 2)
    vocab_size: int = 2048
    target: TargetShape = field(default_factory=TargetShape)
    target_steps: int = 1200
    target_batch: int = 8
    seq_len: int = 256
    target_lr: float = 3e-3
    # The shipped target's logits are the trained model's × this factor (baked into lm_head): a
    # small model trained on a CPU is far less certain than a real LLM, which caps any draft's
    # acceptance when sampling; sampling the shipped target at T samples the trained model at
    # T / scale. The report gives the held-out loss and entropy of both (the shipped pair's:
    # its model card, dflash2rt/bundled/stdlib-code/README.md).
    target_logit_scale: float = 2.75
    gen_prompts: int = 5760
    gen_prompt_tokens: tuple[int, int] = (16, 128)
    gen_new_tokens: int = 128
    gen_mix: tuple[tuple[float, float, float], ...] = GEN_MIX   # (temperature, top_p, share)
    gen_batch: int = 128             # target-only decoding in large batches (faster than 32)
    # gen_prompts and the draft's steps grow together: validation tau at T = 0 kept rising with
    # more steps, and more steps want more data (fewer continuations overfit). The held-out tau
    # of each setting: docs/benchmarks/bundled-pair.md.
    soft_top: int = 32               # the target's top-M law kept per row for the soft targets
    draft: DraftShape = field(default_factory=DraftShape)
    draft_steps: int = 4000
    draft_seqs_per_step: int = 16
    draft_anchors: int = 24
    draft_lr: float = 1.5e-3
    slot_decay: float = 7.0
    selector_weight: float = 1.0
    soft_weight: float = 1.0         # KL(p_target ‖ q_draft) per slot + the selector's soft K-way KL
    hard_weight: float = 0.5         # CE on the hard targets (+ hard K-way selector CE)
    # The hard targets: the target's argmax after each prefix (what a greedy verifier accepts),
    # on every continuation; False: the continuation's own tokens (sampled ones on sampled
    # continuations, which teach T = 0 nothing the soft targets do not). The shipped draft: on,
    # weight 0.5.
    hard_argmax: bool = True
    heldout_prompts: int = 24
    heldout_tokens: tuple[int, int] = (64, 192)
    eval_new_tokens: int = 128
    max_files: int | None = None     # only for tiny test runs
    # Distil a draft for this existing target (a HF directory, or a bundled pair's name: its
    # target/) instead of training one: the target stage loads it; its tokenizer must be the
    # recipe's.
    target_dir: str | None = None

    def scaled(self, minutes: float) -> "RecipeConfig":
        """The same recipe with step and data counts scaled by ``minutes / DEFAULT_MINUTES``."""
        if isinstance(minutes, bool) or not isinstance(minutes, (int, float)) \
                or not math.isfinite(minutes) or minutes <= 0:
            raise InvalidInputError(f"minutes must be a number > 0, got {minutes!r}")
        s = minutes / DEFAULT_MINUTES
        return dataclasses.replace(
            self, target_steps=max(1, round(self.target_steps * s)),
            gen_prompts=max(self.gen_batch, round(self.gen_prompts * s)),
            draft_steps=max(1, round(self.draft_steps * s)))

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    def check(self) -> None:
        """Raise ``InvalidInputError`` naming the first knob a run cannot start from (a count
        below 1, a block below 2, K outside the vocabulary, a scale, rate, weight or generation
        mix out of its domain), before any work."""
        if not is_int(self.seed) or not 0 <= self.seed < 2 ** 63:
            raise InvalidInputError(f"seed must be an integer in [0, 2**63), got {self.seed!r}")
        for name in _COUNTS:
            check_count(name, getattr(self, name), 1)
        for name in ("gen_prompt_tokens", "heldout_tokens"):
            lo_hi = getattr(self, name)
            if not (isinstance(lo_hi, tuple) and len(lo_hi) == 2 and all(map(is_int, lo_hi))
                    and 1 <= lo_hi[0] <= lo_hi[1]):
                raise InvalidInputError(f"{name} must be (low, high) with 1 <= low <= high, "
                                        f"got {lo_hi!r}")
        for name in ("target_logit_scale", "target_lr", "draft_lr"):
            _positive(name, getattr(self, name))
        for name in ("slot_decay", "selector_weight", "soft_weight", "hard_weight"):
            v = getattr(self, name)
            if not _is_number(v) or v < 0:
                raise InvalidInputError(f"{name} must be a finite number >= 0, got {v!r}")
        if self.max_files is not None:
            check_count("max_files", self.max_files, 1)
        d = self.draft
        check_count("draft layers", d.layers, 1)
        check_count("draft block_size", d.block_size, 2)
        check_count("draft selector_top_k", d.selector_top_k, 1)
        if d.selector_top_k > self.vocab_size:
            raise InvalidInputError(f"draft selector_top_k must be at most the vocabulary "
                                    f"({self.vocab_size}), got {d.selector_top_k}")
        _check_mix(self.gen_mix)


# The integer knobs that must be at least 1.
_COUNTS = ("threads", "vocab_size", "target_steps", "target_batch", "seq_len", "gen_prompts",
           "gen_new_tokens", "gen_batch", "soft_top", "draft_steps", "draft_seqs_per_step",
           "draft_anchors", "heldout_prompts", "eval_new_tokens")


def _is_number(v: object) -> bool:
    return is_int(v) or (isinstance(v, float) and math.isfinite(v))


def _positive(name: str, v: object) -> None:
    if not _is_number(v) or v <= 0:
        raise InvalidInputError(f"{name} must be a finite number > 0, got {v!r}")


def mix_settings(mix: tuple[tuple[float, float, float], ...], count: int, seed: int
                 ) -> tuple[list[float], list[float]]:
    """Per prompt (temperature, top_p) drawn from ``mix``'s shares with a seeded RNG."""
    rng = random.Random(seed)
    total = sum(w for _, _, w in mix)
    temps, top_ps = [], []
    for _ in range(count):
        u, acc = rng.random() * total, 0.0
        pick = mix[-1]
        for m in mix:
            acc += m[2]
            if u < acc:
                pick = m
                break
        temps.append(float(pick[0]))
        top_ps.append(float(pick[1]))
    return temps, top_ps


def _check_mix(mix: object) -> None:
    """``gen_mix``: (temperature, top_p) pairs a request may carry, each with a share >= 0, some
    share > 0 (else every prompt would fall back to the last setting)."""
    if not (isinstance(mix, tuple) and mix and all(
            isinstance(m, tuple) and len(m) == 3 and _is_number(m[2]) and m[2] >= 0 for m in mix)
            and sum(m[2] for m in mix) > 0):
        raise InvalidInputError(f"gen_mix must be (temperature, top_p, share >= 0) triples with "
                                f"a share > 0, got {mix!r}")
    for t, p, _ in mix:
        try:
            check_sampling_params(t, 0, p)
        except InvalidInputError as exc:
            raise InvalidInputError(f"gen_mix: {exc}") from None
