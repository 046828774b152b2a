"""Distil the DFlash2 draft from the frozen target: per-slot loss plus the selector's K-way lattice loss.

A training example is an anchor position ``a`` inside a target continuation: the draft sees the
target taps of rows [0, a) as context and the block [tok[a], MASK × γ] at positions a .. a+γ, and
learns the target's tokens tok[a+1 .. a+γ]. Many blocks of one sequence share one context in a
single forward (block j's rows see context rows < a_j and the rows of block j only), which is the
runtime's mask for each block; the conv runs per block exactly as in the runtime.

Targets for sampling (the data holds the target's top-M law of every row, at temperature 1):

* per slot e, the draft's logits learn KL(p_target ‖ softmax(draft logits)) against the target's
  law of token a+e+1 given the continuation's true prefix. On continuations the target *sampled*,
  the expected soft target is the target's marginal at that slot, so the forward KL (mass
  covering) puts the draft's top-K where the target's mass is: a slot's acceptance at any
  temperature is at most the target's mass on the K candidates offered.
* the selector's lattice row read after the true previous token, q_e = softmax(S[e, prev, :]),
  learns KL(p̃ ‖ q_e) where p̃ is the target's law restricted to the K candidates (renormalised),
  weighted by the target's mass on them: Σ_k min(p_k, q_k) (the acceptance of chain speculative
  sampling at T = 1) is largest, equal to that mass, at q = p̃; and argmax q = argmax p, the
  greedy pick, whenever the target's argmax is a candidate. softmax(S / T) then follows
  softmax(target logits / T) at every temperature.
* ``hard_weight`` adds the old hard CE on the continuation's own token (slot CE and K-way
  selector CE) — on greedy continuations the target's argmax.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..backend import TorchOpsBackend
from ..engine.request import check_count
from ..errors import InvalidInputError
from ..models.draft import DraftModel
from ..models.target import TargetModel
from .generate import DistillData


@dataclass(frozen=True)
class Batch:
    feats: torch.Tensor      # [R, L, n_taps, H] context taps (padded)
    ctx_len: torch.Tensor    # [R] valid context rows
    anchors: torch.Tensor    # [R, N] anchor positions
    block_ids: torch.Tensor  # [R, N, B] the block's tokens: anchor then MASK
    labels: torch.Tensor     # [R, N, γ] the target's tokens after the anchor
    soft_ids: torch.Tensor | None = None   # [R, N, γ, M] the target's top-M ids for each label
    soft_p: torch.Tensor | None = None     # [R, N, γ, M] their probabilities (temperature 1)


def sample_batch(data: DistillData, seqs: list[int], anchors: int, block: int, mask_id: int,
                 gen: torch.Generator) -> Batch:
    """``anchors`` anchors (with replacement) per sequence, in the generated part, full blocks only."""
    gamma = block - 1
    r = len(seqs)
    lmax = max(int(data.lengths[s]) for s in seqs)
    feats = data.feats.new_zeros(r, lmax, *data.feats.shape[1:])
    toks = torch.zeros(r, lmax + 1, dtype=torch.int64)
    lo = torch.zeros(r, dtype=torch.int64)
    hi = torch.zeros(r, dtype=torch.int64)
    for i, s in enumerate(seqs):
        st, n = int(data.starts[s]), int(data.lengths[s])
        feats[i, :n] = data.feats[st:st + n]
        toks[i, :n] = data.tokens[st:st + n]
        lo[i] = data.prompt_lens[s]
        hi[i] = max(n - gamma, int(lo[i]) + 1)                    # anchors a in [lo, hi)
    u = torch.rand(r, anchors, generator=gen)
    a = lo.view(r, 1) + (u * (hi - lo).view(r, 1)).long()          # [R, N]
    offs = torch.arange(block).view(1, 1, block)
    pos = (a.unsqueeze(-1) + offs).clamp(max=lmax)                  # [R, N, B]
    seq_toks = toks.gather(1, pos.flatten(1)).view(r, anchors, block)
    ids = torch.full_like(seq_toks, mask_id)
    ids[..., 0] = seq_toks[..., 0]
    soft_ids = soft_p = None
    if data.soft_ids is not None:
        # label e (token a+e+1) has the law of row a+e; rows are clamped inside the sequence
        # (anchors leave a full block, so only padding rows of short sequences are clamped)
        n = lo.new_tensor([int(data.lengths[s]) for s in seqs]).view(r, 1, 1)
        st = lo.new_tensor([int(data.starts[s]) for s in seqs]).view(r, 1, 1)
        rows = st + torch.minimum(a.unsqueeze(-1) + torch.arange(gamma), n - 1)   # [R, N, γ]
        soft_ids = data.soft_ids[rows]                                           # [R, N, γ, M]
        soft_p = data.soft_p[rows]
    return Batch(feats, lo.new_tensor([int(data.lengths[s]) for s in seqs]), a, ids,
                 seq_toks[..., 1:], soft_ids, soft_p)


def block_mask(anchors: torch.Tensor, ctx_rows: int, block: int) -> torch.Tensor:
    """Bool [R, N*B, L + N*B]: row (j, i) sees context rows < a_j and every row of block j."""
    r, n = anchors.shape
    ctx = torch.arange(ctx_rows).view(1, 1, ctx_rows) < anchors.unsqueeze(-1)   # [R, N, L]
    ctx = ctx.unsqueeze(2).expand(r, n, block, ctx_rows).reshape(r, n * block, ctx_rows)
    blk = torch.arange(n).repeat_interleave(block)
    own = (blk.view(-1, 1) == blk.view(1, -1)).expand(r, n * block, n * block)
    return torch.cat([ctx, own], dim=-1)


def draft_hidden(draft: DraftModel, target: TargetModel, batch: Batch, backend: TorchOpsBackend
                 ) -> torch.Tensor:
    """The runtime's draft forward for many blocks at once → normed hidden [R, N, B, H]."""
    r, n, b = batch.block_ids.shape
    lctx = batch.feats.shape[1]
    ctx_pos = torch.arange(lctx).expand(r, lctx)
    ctx_kv = draft.context_kv(batch.feats, ctx_pos)                          # per layer [R, L, kv, hd]
    h = target.embed(batch.block_ids.view(r, n * b)) * draft.cfg.input_embedding_scale
    pos = (batch.anchors.unsqueeze(-1) + torch.arange(b)).view(r, n * b)    # [R, N*B]
    cos, sin = draft.rope(pos, h.dtype)
    mask = block_mask(batch.anchors, lctx, b)
    for layer, (k, v) in zip(draft.layers, ctx_kv):
        h = layer(h, lambda a, x, k=k, v=v: a(x, cos, sin, k, v, mask)[0], backend, b)
    return draft.norm(h).view(r, n, b, -1)


def selector_scores(draft: DraftModel, h_e: torch.Tensor, logits: torch.Tensor,
                    prev: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Lattice rows reached from ``prev`` (ops/selector.py's formula) → (scores, candidates) [..., K].

    h_e [..., H], logits [..., V], prev [...] the token before each slot.
    """
    cfg, sel = draft.cfg, draft.candidate_selector
    vals, cand = torch.topk(logits, k, dim=-1)                               # [..., K]
    unary = vals * cfg.output_multiplier
    if cfg.final_logit_softcapping is not None:
        cap = cfg.final_logit_softcapping
        unary = cap * torch.tanh(unary / cap)
    pair = sel.predecessor_codebook[prev] * sel.hidden_projection(h_e)      # [..., r]
    succ = sel.successor_codebook[cand]                                      # [..., K, r]
    return unary + torch.einsum("...r,...kr->...k", pair, succ), cand


def slot_weights(gamma: int, decay: float) -> torch.Tensor:
    """w_e = exp(-e / decay), normalised: earlier slots matter more for acceptance."""
    w = torch.exp(-torch.arange(gamma, dtype=torch.float32) / decay)
    return w / w.sum()


def candidate_mass(cand: torch.Tensor, soft_ids: torch.Tensor, soft_p: torch.Tensor) -> torch.Tensor:
    """The target's probability of each candidate: cand [..., K], its top-M law soft_ids / soft_p
    [..., M] → [..., K] (0 for a candidate outside the top M)."""
    hit = soft_ids.unsqueeze(-1) == cand.unsqueeze(-2)                       # [..., M, K]
    return (hit * soft_p.unsqueeze(-1)).sum(-2)


def distill_loss(draft: DraftModel, target: TargetModel, batch: Batch, backend: TorchOpsBackend,
                 decay: float, selector_weight: float, soft_weight: float = 1.0,
                 hard_weight: float = 1.0, hard_argmax: bool = False
                 ) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-slot loss + K-way selector loss, each slot weighted by ``slot_weights``.

    hard_weight × (per-slot CE on the continuation's token — with ``hard_argmax`` the top id of
    its row's law, the target's argmax — + selector_weight × K-way selector CE) + soft_weight ×
    (per-slot KL(p_target ‖ q_draft) over the target's top M + selector_weight
    × mass-weighted KL(p̃ ‖ softmax(lattice row))), the soft part only when the batch carries the
    target's law (see the module docstring). Metrics: ``tau`` the teacher-forced greedy accept
    length + 1 on the continuation's own tokens (= τ at T=0 on greedy continuations); with soft
    targets also ``mass`` (mean target mass on the K candidates: the per-slot acceptance bound),
    ``acc1`` (mean Σ_k min(p_k, q_k), the per-slot acceptance at T=1) and ``tau1``
    (1 + Σ_e Π_{j≤e} acc1_j, teacher-forced τ at T=1).
    """
    h = draft_hidden(draft, target, batch, backend)[:, :, 1:]                # [R, N, γ, H]
    logits = target.lm_head(h)                                               # [R, N, γ, V]
    labels = batch.labels                                                    # [R, N, γ]
    w = slot_weights(labels.shape[-1], decay)
    # the hard targets: the continuation's own tokens, or (hard_argmax) the target's argmax
    # after the continuation's prefix, the token a greedy verifier accepts, on every continuation
    if hard_argmax and batch.soft_ids is None:
        raise InvalidInputError("hard_argmax needs the target's law in the data (build it with "
                                "soft_top > 0)")
    hard = batch.soft_ids[..., 0] if hard_argmax else labels
    loss_ce = _slot_ce(logits, hard, w)
    prev = torch.cat([batch.block_ids[..., :1], labels[..., :-1]], dim=-1)   # [R, N, γ]
    scores, cand = selector_scores(draft, h, logits, prev, draft.cfg.selector_top_k)
    hit_h = cand == hard.unsqueeze(-1)                                       # [R, N, γ, K]
    loss_sel = _selector_ce(scores, hit_h, w)
    loss = hard_weight * (loss_ce + selector_weight * loss_sel)
    extra: dict[str, float] = {}
    if batch.soft_ids is not None and soft_weight > 0:
        loss_kl, loss_selkl, extra = _soft_losses(logits, scores, cand, batch, w)
        loss = loss + soft_weight * (loss_kl + selector_weight * loss_selkl)
    with torch.no_grad():
        hit = cand == labels.unsqueeze(-1) if hard_argmax else hit_h         # [R, N, γ, K]
        present = hit.any(-1)
        ok = scores.argmax(-1) == hit.float().argmax(-1)
        ok &= present
        accept = torch.cumprod(ok.long(), dim=-1).sum(-1).float().mean()
        top1 = (logits.argmax(-1) == labels).float().mean()
    return loss, {"ce": loss_ce.item(), "sel": loss_sel.item(), "tau": 1 + accept.item(),
                  "top1": top1.item(), **extra}


def _slot_ce(logits: torch.Tensor, hard: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Per-slot CE on the hard targets, a slot-weighted mean."""
    ce = F.cross_entropy(logits.flatten(0, 2), hard.flatten(), reduction="none").view(hard.shape)
    return (ce.mean(dim=(0, 1)) * w).sum()


def _selector_ce(scores: torch.Tensor, hit_h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """K-way selector CE on the rows whose hard target is a candidate (``hit_h``), a
    slot-weighted mean."""
    present_h = hit_h.any(-1)
    sel_ce = F.cross_entropy(scores.flatten(0, 2), hit_h.float().argmax(-1).flatten(),
                             reduction="none").view(present_h.shape)
    sel_ce = torch.where(present_h, sel_ce, torch.zeros_like(sel_ce))
    return (sel_ce.sum(dim=(0, 1)) / present_h.sum(dim=(0, 1)).clamp(min=1) * w).sum()


def slot_kl(logits: torch.Tensor, batch: Batch, w: torch.Tensor) -> torch.Tensor:
    """Per-slot KL(p_target ‖ q_draft) over the target's top M in ``batch``, a slot-weighted
    mean."""
    sp, si = batch.soft_p, batch.soft_ids                                    # [R, N, γ, M]
    logp = F.log_softmax(logits, dim=-1)
    kl = (sp * (torch.log(sp.clamp(min=1e-30)) - logp.gather(-1, si))).sum(-1)   # [R, N, γ]
    return (kl.mean(dim=(0, 1)) * w).sum()


def _soft_losses(logits: torch.Tensor, scores: torch.Tensor, cand: torch.Tensor, batch: Batch,
                 w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """(per-slot KL(p_target ‖ q_draft) over the target's top M, mass-weighted KL(p̃ ‖ q) of the
    selector, metrics ``kl``, ``selkl``, ``mass``, ``acc1``, ``tau1``) against the target's law
    in ``batch``."""
    sp, si = batch.soft_p, batch.soft_ids                                    # [R, N, γ, M]
    loss_kl = slot_kl(logits, batch, w)
    pc = candidate_mass(cand, si, sp)                                        # [R, N, γ, K]
    mass = pc.sum(-1)                                                        # [R, N, γ]
    pt = pc / mass.clamp(min=1e-12).unsqueeze(-1)                            # p̃ on the candidates
    q_log = F.log_softmax(scores, dim=-1)
    sel_kl = (pt * (torch.log(pt.clamp(min=1e-30)) - q_log)).sum(-1)        # KL(p̃ ‖ q)
    loss_selkl = ((sel_kl * mass).sum(dim=(0, 1)) / mass.sum(dim=(0, 1)).clamp(min=1e-12)
                  * w).sum()
    with torch.no_grad():
        acc = torch.minimum(pc, q_log.exp()).sum(-1)                         # [R, N, γ]
        extra = {"kl": loss_kl.item(), "selkl": loss_selkl.item(), "mass": mass.mean().item(),
                 "acc1": acc.mean().item(),
                 "tau1": 1 + torch.cumprod(acc, dim=-1).sum(-1).mean().item()}
    return loss_kl, loss_selkl, extra


def train_draft(draft: DraftModel, target: TargetModel, data: DistillData, steps: int,
                seqs_per_step: int, anchors: int, lr: float, seed: int, decay: float = 7.0,
                selector_weight: float = 1.0, every: int = 20,
                on_eval=None, soft_weight: float = 1.0, hard_weight: float = 1.0,
                hard_argmax: bool = False) -> list[dict[str, float]]:
    """AdamW on ``distill_loss`` with the target frozen; returns per-step metrics.

    Sequences are visited in seeded shuffled epochs; ``on_eval(step)`` runs every ``every`` steps.
    """
    from .progress import Progress
    from .target import cosine_lr, make_optimizer

    check_count("every", every, 1)                     # steps between progress lines

    gen = torch.Generator().manual_seed(seed)
    backend = TorchOpsBackend("cpu-train", "cpu", (torch.float32,))
    target.requires_grad_(False)
    draft.train().requires_grad_(True)
    opt = make_optimizer(draft, lr, 0.01, no_decay=("codebook",))
    prog = Progress("draft", steps, every)
    order: list[int] = []
    history: list[dict[str, float]] = []
    b = draft.cfg.block_size
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = cosine_lr(step, steps, lr, min(100, steps // 10 + 1))
        if len(order) < seqs_per_step:
            order += torch.randperm(data.num_sequences, generator=gen).tolist()
        seqs, order = order[:seqs_per_step], order[seqs_per_step:]
        batch = sample_batch(data, seqs, anchors, b, draft.cfg.mask_token_id, gen)
        loss, metrics = distill_loss(draft, target, batch, backend, decay, selector_weight,
                                     soft_weight, hard_weight, hard_argmax)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        opt.step()
        history.append(metrics)
        recent = history[-every:]
        prog.step(step + 1, len(seqs) * anchors * b,
                  **{k: sum(m[k] for m in recent) / len(recent)
                     for k in ("ce", "sel", "tau", "kl", "mass", "tau1") if k in metrics})
        if on_eval is not None and ((step + 1) % (every * 10) == 0 or step + 1 == steps):
            on_eval(step + 1)
    draft.eval().requires_grad_(False)
    return history
