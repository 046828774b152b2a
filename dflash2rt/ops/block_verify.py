"""Block verification of sampled rows: the drafted block is judged as a whole, not token by
token (Sun et al., "Block Verification Accelerates Speculative Decoding", ICLR 2025).

Token verification accepts slot i with probability min(1, p_i(d_i) / q_i(d_i)) and stops at
the first rejection: each slot keeps 1 − TV(p_i, q_i), the best a verifier that decides slot
by slot can do. Block verification carries what a likely draft token leaves over into the
next slots. With p_i, q_i the target's and the draft's law at slot i given d_1..d_{i-1}:

    w_0 = 1,  w_i = min(1, w_{i-1} · p_i(d_i) / q_i(d_i))                    (i = 1..γ)
    r_i = Σ_x (w_i · p_{i+1}(x) − q_{i+1}(x))_+                               (i < γ)
    h_i = r_i / (r_i + 1 − w_i)   (1 where r_i + 1 − w_i = 0),   h_γ = w_γ

and with η_i the row's acceptance uniforms the row keeps τ = max{i : η_i < h_i} drafts (0 when
there is none), then emits from norm((w_τ · p_{τ+1} − q_{τ+1})_+) when τ < γ (w_0 = 1: the
token rule's residual at slot 1) — from p_{τ+1} where that mass is 0, which only rounding can
reach — and the bonus from p_{γ+1} when τ = γ. The output law is the target's exactly, and the
expected number of kept drafts is never below token verification's and is the most any
verifier of one drafted path can keep (the paper's Theorems 1-2; ``tests/test_block_verify.py``
checks both by exact enumeration).

A token with p = 0 is never kept: its w and every later w are 0, so every h from it on is 0
and the strict ``<`` refuses it. Float64 only: w, r and h are float64 (a decision can differ
from exact arithmetic only where η lies within float64 rounding of h); the residual and bonus
are drawn by inverse CDF over float64 sums, as the token rule's are.
"""

from __future__ import annotations

import torch

from .sampling import inverse_cdf


def keep_weights(p_d: torch.Tensor, q_d: torch.Tensor) -> torch.Tensor:
    """p_d, q_d [R, γ] float64 (the target's and the draft's probability of each draft token)
    → w [R, γ+1] float64, w_0 = 1."""
    w = [torch.ones_like(p_d[:, 0])]
    for i in range(p_d.shape[1]):
        w.append(torch.clamp(w[-1] * p_d[:, i] / q_d[:, i], max=1.0))
    return torch.stack(w, dim=1)


def distinct(candidates: torch.Tensor, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """candidates, q [..., K] → (the candidates sorted [..., K], each one's whole draft mass,
    float64, at its first place and 0 at the places that repeat it [..., K]): the sparse law
    with duplicates merged."""
    ids, order = torch.sort(candidates, dim=-1)
    mass = q.double().gather(-1, order)
    first = torch.ones_like(ids, dtype=torch.bool)
    first[..., 1:] = ids[..., 1:] != ids[..., :-1]
    run = torch.cumsum(first.to(torch.int64), dim=-1) - 1                 # each place's run
    total = torch.zeros_like(mass).scatter_add_(-1, run, mass)            # run r's mass at r
    return ids, torch.where(first, total.gather(-1, run), 0.0)


def keep_probs(w: torch.Tensor, p: torch.Tensor, ids: torch.Tensor, mass: torch.Tensor
               ) -> torch.Tensor:
    """w [R, γ+1] float64, p [R, γ+1, V], the draft's laws as ``distinct`` gives them (ids,
    mass [R, γ, K]) → h [R, γ] float64: h[:, i-1] = h_i. r_i = Σ_x (w_i p(x) − q(x))_+ =
    w_i · Σ_x p(x) − Σ_{x candidate} min(w_i p(x), q(x)), over the candidates alone."""
    gamma = ids.shape[1]
    w_mid = w[:, 1:gamma]                                                  # [R, γ-1]
    total = p[:, 1:gamma].sum(dim=-1, dtype=torch.float64)                # Σ_x p(x)
    p_c = p[:, 1:gamma].gather(-1, ids[:, 1:]).double()                   # [R, γ-1, K]
    kept = torch.minimum(w_mid.unsqueeze(-1) * p_c, mass[:, 1:]).sum(dim=-1)
    r = (w_mid * total - kept).clamp(min=0.0)
    den = r + (1.0 - w_mid)                            # >= r: h never exceeds 1
    h_mid = torch.where(den > 0, r / torch.where(den > 0, den, 1.0), 1.0)  # [R, γ-1]
    return torch.cat([h_mid, w[:, gamma:]], dim=1)


def verify_block_sampled(p: torch.Tensor, draft: torch.Tensor, candidates: torch.Tensor,
                         q: torch.Tensor, q_d: torch.Tensor, accept: torch.Tensor,
                         residual: torch.Tensor, bonus: torch.Tensor
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """p [R, γ+1, V] the target's processed laws; draft [R, γ]; candidates, q [R, γ, K]; q_d
    [R, γ] float64 q(d); the uniforms ``accept`` [R, γ], ``residual`` [R, γ], ``bonus`` [R]
    → (accept_len [R], the emitting law [R, V] float64, the inverse-CDF token [R], -1 where
    the law is not one). Only the emitting row is made dense (V-wide float64)."""
    r, rows, v = p.shape
    gamma = rows - 1
    p_d = p[:, :gamma].gather(-1, draft.unsqueeze(-1)).squeeze(-1).double()  # [R, γ]
    w = keep_weights(p_d, q_d)
    ids, mass = distinct(candidates, q)
    h = keep_probs(w, p, ids, mass)
    slots = torch.arange(1, gamma + 1, device=p.device).expand(r, gamma)
    tau = torch.where(accept.double() < h, slots, 0).max(dim=1).values     # [R]
    p_row = p.gather(1, tau.view(r, 1, 1).expand(r, 1, v)).squeeze(1).double()  # p_{τ+1}
    inner = tau < gamma
    slot = tau.clamp(max=gamma - 1).view(r, 1, 1)
    q_row = torch.zeros(r, v, dtype=torch.float64, device=p.device).scatter_add_(
        1, candidates.gather(1, slot.expand(r, 1, candidates.shape[2])).squeeze(1),
        q.gather(1, slot.expand(r, 1, q.shape[2])).squeeze(1).double())
    resid = (w.gather(1, tau.view(r, 1)) * p_row - q_row).clamp(min=0.0)
    empty = resid.sum(dim=1, keepdim=True) <= 0
    law = torch.where(inner.view(r, 1) & ~empty, resid, p_row)
    u = torch.where(inner, residual.gather(1, slot.view(r, 1)).view(r), bonus)
    return tau, law, inverse_cdf(law, u)
