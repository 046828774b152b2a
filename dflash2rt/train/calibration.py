"""Is the draft's sampled law shaped right? Teacher-forced, the expected acceptance of chain
speculative sampling, Σ_k min(p_k, q_k), of the selector's law over its K candidates as the
engine draws it, q = softmax(row / T), against re-shaped laws drawn from the same lattice row:

* ``("scale", β)``: q = softmax(β · row / T), a temperature factor on the draft's scores;
* ``("nucleus", P)``: q = softmax(row / T) cut to its top-P prefix (candidates by descending
  q, lower index first on ties, kept while the mass ahead of them is below P), renormalised.

Any such q keeps verification lossless (the verifier reads the law the draft was drawn from), so
a shape whose acceptance beats the engine's would be free τ. The row of slot e is the lattice row
after the true previous token (``distill.selector_scores``), p the target's law after
temperature and top-p (``evaluate.processed_law``), on each prompt + its continuation
(``evaluate.forced_blocks``)."""

from __future__ import annotations

from typing import Sequence

import torch

from ..models.pair import ModelPair
from ..ops.sampling import scale
from . import distill
from .evaluate import forced_blocks, processed_law

Shape = tuple[str, float]
SHAPES = ("scale", "nucleus")


def shaped_law(rows: torch.Tensor, temperature: float, shape: Shape) -> torch.Tensor:
    """Lattice rows [..., K] → the re-shaped law (see the module docstring), float32; at
    ``("scale", 1.0)`` the engine's own, ``softmax(ops.sampling.scale(row, T))``."""
    kind, value = shape
    if kind not in SHAPES:
        raise ValueError(f"shape {kind!r}: choose from {', '.join(SHAPES)}")
    if not value > 0:
        raise ValueError(f"shape {kind!r} needs a value > 0, got {value}")
    temp = torch.tensor(float(temperature))
    if kind == "scale":
        return torch.softmax(scale(rows.float() * value, temp), dim=-1)
    q = torch.softmax(scale(rows, temp), dim=-1)                           # the engine's law
    # stable descending sort: equal laws keep the lower index first
    order = torch.sort(-q, dim=-1, stable=True).indices
    sq = q.gather(-1, order)
    keep = (sq.cumsum(-1) - sq) < value
    cut = torch.zeros_like(q).scatter(-1, order, torch.where(keep, sq, torch.zeros_like(sq)))
    return cut / cut.sum(-1, keepdim=True)


def law_acceptance(pair: ModelPair, prompts: Sequence[Sequence[int]],
                   outputs: Sequence[Sequence[int]], temperature: float, top_p: float,
                   shapes: Sequence[Shape]) -> dict:
    """Per shape, the mean teacher-forced acceptance Σ_k min(p_k, q_k) of each slot over the
    anchors, and τ from it (1 + Σ_e Π_{j≤e} acc_j); ``("scale", 1.0)`` is the engine's own law.
    → {"anchors", "mass" [γ] (the target's mass on the candidates, every shape's bound),
    "mass_tau" (τ if every slot accepted its mass: the target's own law over the candidates),
    "shapes": [{"shape", "per_slot" [γ], "mean", "tau"}]}."""
    if not temperature > 0:
        raise ValueError("law_acceptance compares sampled laws: temperature must be > 0")
    draft = pair.draft
    gamma, k = draft.cfg.block_size - 1, draft.cfg.selector_top_k
    acc = torch.zeros(len(shapes), gamma, dtype=torch.float64)
    mass = torch.zeros(gamma, dtype=torch.float64)
    count = 0
    with torch.no_grad():
        for fwd, rows, block, h in forced_blocks(pair, list(prompts), list(outputs)):
            logits = pair.target.lm_head(h)                                 # [N, γ, V]
            prev = block[:, :-1]                                            # token before slot e
            scores, cand = distill.selector_scores(draft, h, logits, prev, k)
            p = processed_law(fwd.logits[0], temperature, top_p)[rows].gather(-1, cand)
            mass += p.sum(-1).double().sum(0).cpu()
            for i, shape in enumerate(shapes):
                q = shaped_law(scores, temperature, shape)
                acc[i] += torch.minimum(p.float(), q).sum(-1).double().sum(0).cpu()
            count += p.shape[0]
    n = max(count, 1)
    out = []
    for i, shape in enumerate(shapes):
        per = acc[i] / n
        out.append({"shape": list(shape), "per_slot": per.tolist(), "mean": per.mean().item(),
                    "tau": _tau(per)})
    return {"anchors": count, "mass": (mass / n).tolist(), "mass_tau": _tau(mass / n),
            "shapes": out}


def _tau(per_slot: torch.Tensor) -> float:
    """1 + Σ_e Π_{j≤e} acc_j: τ of independent slots accepting acc_j."""
    return 1.0 + torch.cumprod(per_slot, 0).sum().item()
