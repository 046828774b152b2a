"""Lossless verification of a drafted block against the target's logits.

Greedy rows (T = 0): accept the longest prefix with d_j == argmax(logits_j) (lowest index on
ties); emit the target argmax at the first mismatch, or the bonus after the last slot.

Sampled rows: chain speculative sampling with the sparse draft law q (q(x) = Σ_k q_k [cand_k = x]).
Accept d_j iff u_j · q_j(d_j) < p_j(d_j), evaluated in float64 where it is exact for float32
p, q and 24-bit u. On the first rejection draw from norm((p_j - q_j)_+) — from p_j when that mass
is 0 — and after a fully accepted block draw the bonus from p_γ. Tokens with p = 0 are never
emitted. Acceptance, residual and bonus uniforms are separate inputs (separate RNG streams).
A sampled row whose q is not finite and non-negative, or gives its own draft token no mass (NaN
included), is flagged ``bad_q``; any other row with nothing to draw from is flagged ``bad``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import InvalidInputError, NonFiniteLogitsError
from .batch import BlockNoise, SamplingBatch
from .sampling import bad_rows, inverse_cdf, target_probs


@dataclass(frozen=True)
class VerifyOut:
    accept_len: torch.Tensor  # [R] int64, accepted draft tokens (0..γ)
    tokens: torch.Tensor      # [R, γ+1] int64: accepted drafts, then the emitted token; -1 after
    bad: torch.Tensor         # [R] bool, target logits with NaN / +inf / no finite entry
    bad_q: torch.Tensor       # [R] bool, sampled: q(d) not > 0 or q not finite / negative

    def raise_if_bad(self) -> None:
        """Raise a typed error naming the bad requests (this syncs with the device)."""
        rows = torch.nonzero(self.bad).flatten().tolist()
        if rows:
            raise NonFiniteLogitsError(
                f"target logits of request(s) {rows} are not a finite law (NaN/+inf, or no finite "
                "entry); "
                "check the model weights and dtype (no token was emitted for this step)")
        rows = torch.nonzero(self.bad_q).flatten().tolist()
        if rows:
            raise InvalidInputError(
                f"request(s) {rows}: a draft token has q = 0 (or q is not finite) under the law "
                "it was drawn from; "
                "q must be the exact proposal law of the draft (selector bug)")


def assemble_tokens(draft: torch.Tensor, accept_len: torch.Tensor, emitted: torch.Tensor) -> torch.Tensor:
    """[R, γ] drafts + [R] accept lengths + [R] emitted token → [R, γ+1], -1 past the end."""
    r, gamma = draft.shape
    col = torch.arange(gamma + 1, device=draft.device).view(1, -1)
    padded = torch.cat([draft, draft.new_full((r, 1), -1)], dim=1)
    out = torch.where(col < accept_len.view(-1, 1), padded, -1)
    return torch.where(col == accept_len.view(-1, 1), emitted.view(-1, 1), out)


def _prefix_len(ok: torch.Tensor) -> torch.Tensor:
    """bool [R, γ] → [R] length of the all-True prefix."""
    return torch.cumprod(ok.to(torch.int64), dim=1).sum(dim=1)


def draft_mass(draft: torch.Tensor, candidates: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """q_j(d_j) in float64, summing duplicated candidates: [R, γ]."""
    hit = candidates == draft.unsqueeze(-1)                               # [R, γ, K]
    return torch.where(hit, q.double(), 0.0).sum(dim=-1)


def law_broken(q: torch.Tensor, q_d: torch.Tensor) -> torch.Tensor:
    """[R]: q [R, γ, K] has a NaN / inf / negative entry, or a draft token has no mass under
    its own law (q_d [R, γ] not > 0, NaN included)."""
    return (~torch.isfinite(q) | (q < 0)).flatten(1).any(dim=1) | ~(q_d > 0).all(dim=1)


def with_empty_draws(bad: torch.Tensor, greedy: torch.Tensor, bad_q: torch.Tensor,
                     emitted: torch.Tensor) -> torch.Tensor:
    """``bad`` plus the sampled rows whose q is a law but that had nothing to draw from
    (emitted -1): such a row is never emitted from."""
    return bad | (~greedy & ~bad_q & (emitted < 0))


def check_verify_args(logits: torch.Tensor, draft: torch.Tensor, candidates: torch.Tensor,
                      q: torch.Tensor) -> tuple[int, int, int]:
    """Validate shapes; return (R, γ+1, V)."""
    r, rows, v = logits.shape
    gamma = rows - 1
    if gamma < 1:
        raise InvalidInputError(f"verify needs at least one draft slot, got {rows} logit rows")
    if draft.shape != (r, gamma) or candidates.shape[:2] != (r, gamma) \
            or q.shape != candidates.shape:
        raise InvalidInputError(
            f"verify shapes disagree: logits {tuple(logits.shape)} needs draft [R={r}, γ={gamma}]"
            f", got draft {tuple(draft.shape)}, candidates {tuple(candidates.shape)}, "
            f"q {tuple(q.shape)}")
    return r, rows, v


def verify(logits: torch.Tensor, draft: torch.Tensor, candidates: torch.Tensor, q: torch.Tensor,
           sampling: SamplingBatch, noise: BlockNoise, check: bool = True) -> VerifyOut:
    """logits [R, γ+1, V] of the verify pass over [anchor, d_1..d_γ]; draft [R, γ];
    candidates, q [R, γ, K]. With ``check`` a NaN row raises at once; the engine passes False
    and checks ``bad`` at its one device→host synchronisation per step."""
    r, rows, v = check_verify_args(logits, draft, candidates, q)
    gamma = rows - 1
    bad = bad_rows(logits).any(dim=1)
    top = torch.argmax(logits, dim=-1)                                    # [R, γ+1]
    acc = _prefix_len(draft == top[:, :gamma])
    emitted = top.gather(1, acc.view(r, 1)).view(r)
    bad_q = torch.zeros_like(bad)
    if sampling.any_sampled:
        q_d = draft_mass(draft, candidates, q)                                      # [R, γ]
        acc_s, emitted_s = _verify_sampled(logits, draft, candidates, q, q_d, sampling, noise)
        acc = torch.where(sampling.greedy, acc, acc_s)
        emitted = torch.where(sampling.greedy, emitted, emitted_s)
        bad_q = ~sampling.greedy & law_broken(q, q_d)
        bad = with_empty_draws(bad, sampling.greedy, bad_q, emitted_s)
    out = VerifyOut(acc, assemble_tokens(draft, acc, emitted), bad, bad_q)
    if check:
        out.raise_if_bad()
    return out


def _verify_sampled(logits: torch.Tensor, draft: torch.Tensor, candidates: torch.Tensor,
                    q: torch.Tensor, q_d: torch.Tensor, sampling: SamplingBatch,
                    noise: BlockNoise) -> tuple[torch.Tensor, torch.Tensor]:
    """Chain speculative sampling → (accept_len [R], emitted token [R])."""
    r, rows, v = logits.shape
    gamma = rows - 1
    p = target_probs(logits, sampling.temperature, sampling.top_k, sampling.top_p)  # [R, γ+1, V]
    p_d = p[:, :gamma].gather(-1, draft.unsqueeze(-1)).squeeze(-1).double()       # [R, γ]
    acc = _prefix_len(noise.accept.double() * q_d < p_d)                            # strict <
    # The row that emits: the first rejected slot, or row γ (bonus, where q is empty).
    row = acc.view(r, 1, 1)
    p_row = p.gather(1, row.expand(r, 1, v)).squeeze(1).double()                   # [R, V]
    rejected = acc < gamma
    slot = acc.clamp(max=gamma - 1).view(r, 1, 1)
    q_dense = torch.zeros(r, v, dtype=torch.float64, device=logits.device)
    q_dense.scatter_add_(1, candidates.gather(1, slot.expand(-1, 1, candidates.shape[2]))
                         .squeeze(1), q.gather(1, slot.expand(-1, 1, q.shape[2])).squeeze(1)
                         .double())
    q_dense = torch.where(rejected.view(r, 1), q_dense, 0.0)
    resid = (p_row - q_dense).clamp(min=0.0)
    empty = resid.sum(dim=1, keepdim=True) <= 0
    weights = torch.where(empty, p_row, resid)
    u = torch.where(rejected, noise.residual.gather(1, acc.clamp(max=gamma - 1).view(r, 1))
                    .view(r), noise.bonus)
    return acc, inverse_cdf(weights, u)


def sample_next(logits: torch.Tensor, sampling: SamplingBatch, u: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per request from target logits [R, V] (greedy rows: argmax) with uniforms u [R].

    Used after prefill and by target-only decoding. Returns (token [R], bad [R]).
    """
    bad = bad_rows(logits)
    token = torch.argmax(logits, dim=-1)
    if sampling.any_sampled:
        p = target_probs(logits.unsqueeze(1), sampling.temperature, sampling.top_k,
                         sampling.top_p)[:, 0]
        drawn = inverse_cdf(p.double(), u)                                # -1: not a law
        token = torch.where(sampling.greedy, token, drawn)
        bad = bad | (~sampling.greedy & (drawn < 0))
    return token, bad
