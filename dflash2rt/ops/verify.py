"""Lossless verification of a drafted block against the target's logits.

Greedy rows (T = 0): accept the longest prefix with d_j == argmax(logits_j) (lowest index on
ties); emit the target argmax at the first mismatch, or the bonus after the last slot.

Sampled rows: chain speculative sampling with the sparse draft law q (q(x) = Σ_k q_k [cand_k = x]).
Accept d_j iff u_j · q_j(d_j) < p_j(d_j). Two formulations (``has_fp64``): in float64, where
the product of float32 u and q is exact; or, on devices without float64, in float32 and int64
only (``exact32``), where the decision is exact by integer mantissa/exponent arithmetic — the
same decision bit for bit. On the first rejection draw from norm((p_j - q_j)_+) — from p_j when
that mass is 0 — and after a fully accepted block draw the bonus from p_γ: by inverse CDF over
float64 sums, or over exact double-float (p - q)+ and double-float prefix sums, which agree with
float64 except within (2^-40 + V·2^-53)·total of a CDF breakpoint (``exact32``). Tokens
with p = 0 are never emitted. Acceptance, residual and bonus uniforms are separate inputs
(separate RNG streams). Sampled rows flagged in ``block`` are verified as a whole block instead
(``ops.block_verify``: never fewer kept drafts in expectation, the same output law).
A sampled row whose q is not finite and non-negative, or gives its own draft token no mass (NaN
included), is flagged ``bad_q``; any other row with nothing to draw from is flagged ``bad``.

The draws are an argument (``ops.draws``): the block's ``BlockNoise``, or a ``DrawSource``
that gives the acceptance uniforms and an ``EmitDraw`` replacing the sampled rows' residual /
bonus draw by its own draw from the same law (the watermark's coins and Gumbel-max keyed by the
emitted position's context, ``dflash2rt.watermark.generate.KeyedDraws``); ``sample_next`` takes
an ``EmitDraw`` (``marks``). Float64 formulation only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import BackendError, InvalidInputError, NonFiniteLogitsError
from . import block_verify, exact32
from .batch import BlockNoise, SamplingBatch
from .draws import Draws, EmitDraw, verify_draws
from .sampling import bad_rows, inverse_cdf, target_probs


def _require_fp64(marks: EmitDraw | None, fp64: bool) -> None:
    if marks is not None and not fp64:
        raise BackendError("a keyed (watermarked) draw needs the float64 formulation; this "
                           "device has no float64")


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
           sampling: SamplingBatch, noise: Draws, check: bool = True,
           has_fp64: bool | None = None, block: torch.Tensor | bool | None = None) -> VerifyOut:
    """logits [R, γ+1, V] of the verify pass over [anchor, d_1..d_γ]; draft [R, γ];
    candidates, q [R, γ, K]; ``noise``: the draws (a ``BlockNoise``, or a ``DrawSource``).
    With ``check`` a NaN row raises at once; the engine passes False and checks ``bad`` at its
    one device→host synchronisation per step. ``has_fp64`` False takes the float32 formulation
    (None: ``exact32.fp64_enabled()``). ``block`` [R] bool: the sampled rows verified as a
    block (``ops.block_verify``; the float64 formulation, ordinary draws); True: every row (the
    token rule is not computed); None: none."""
    noise, marks = verify_draws(noise, draft, has_fp64)   # a source's draws: raises if it can't
    fp64 = exact32.fp64_enabled(has_fp64)
    _require_fp64(marks, fp64)
    if block is False:
        block = None
    if block is not None:
        _require_block(marks, fp64)
    r, rows, v = check_verify_args(logits, draft, candidates, q)
    gamma = rows - 1
    bad = bad_rows(logits).any(dim=1)
    top = torch.argmax(logits, dim=-1)                                    # [R, γ+1]
    acc = _prefix_len(draft == top[:, :gamma])
    emitted = top.gather(1, acc.view(r, 1)).view(r)
    bad_q = torch.zeros_like(bad)
    if sampling.any_sampled:
        q_d, q_lo = (draft_mass(draft, candidates, q), None) if fp64 else \
            exact32.draft_mass32(draft, candidates, q)                              # [R, γ]
        p = target_probs(logits, sampling.temperature, sampling.top_k, sampling.top_p,
                         top_k_max=sampling.top_k_max, top_p_rows=sampling.top_p_rows,
                         min_p=sampling.min_p)                                     # [R, γ+1, V]
        if block is not True:
            acc_s, emitted_s = _verify_sampled(p, draft, candidates, q, (q_d, q_lo), noise,
                                               marks)
        if block is not None:
            acc_b, _, emitted_b = block_verify.verify_block_sampled(
                p, draft, candidates, q, q_d, noise.accept, noise.residual, noise.bonus)
            acc_s = acc_b if block is True else torch.where(block, acc_b, acc_s)
            emitted_s = emitted_b if block is True else torch.where(block, emitted_b, emitted_s)
        acc = torch.where(sampling.greedy, acc, acc_s)
        emitted = torch.where(sampling.greedy, emitted, emitted_s)
        bad_q = ~sampling.greedy & law_broken(q, q_d)
        bad = with_empty_draws(bad, sampling.greedy, bad_q, emitted_s)
    out = VerifyOut(acc, assemble_tokens(draft, acc, emitted), bad, bad_q)
    if check:
        out.raise_if_bad()
    return out


def _require_block(marks: EmitDraw | None, fp64: bool) -> None:
    if not fp64:
        raise BackendError("block verification needs the float64 formulation; this device has "
                           "no float64: verify these requests with verification='token'")
    if marks is not None:
        raise InvalidInputError("block verification does not take the watermark's keyed draws: "
                                "watermarked requests verify with verification='token'")


def _verify_sampled(p: torch.Tensor, draft: torch.Tensor, candidates: torch.Tensor,
                    q: torch.Tensor, q_d: tuple[torch.Tensor, torch.Tensor | None],
                    noise: BlockNoise, marks: EmitDraw | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Chain speculative sampling on the target's processed laws p [R, γ+1, V] → (accept_len
    [R], emitted token [R]). ``q_d``: (float64 q(d), None), or the float32 formulation's
    double-float (hi, lo)."""
    r, rows, v = p.shape
    gamma = rows - 1
    fp64 = q_d[1] is None
    p_d = p[:, :gamma].gather(-1, draft.unsqueeze(-1)).squeeze(-1)                 # [R, γ]
    ok = noise.accept.double() * q_d[0] < p_d.double() if fp64 else \
        exact32.accept(noise.accept, q_d[0], q_d[1], p_d)
    acc = _prefix_len(ok)                                                           # strict <
    # The row that emits: the first rejected slot, or row γ (bonus, where q is empty).
    row = acc.view(r, 1, 1)
    p_row = p.gather(1, row.expand(r, 1, v)).squeeze(1)                            # [R, V]
    rejected = acc < gamma
    slot = acc.clamp(max=gamma - 1).view(r, 1, 1)
    cand_s = candidates.gather(1, slot.expand(-1, 1, candidates.shape[2])).squeeze(1)
    q_s = torch.where(rejected.view(r, 1), q.gather(1, slot.expand(-1, 1, q.shape[2])).squeeze(1),
                      0.0)                                                          # [R, K]
    u = torch.where(rejected, noise.residual.gather(1, acc.clamp(max=gamma - 1).view(r, 1))
                    .view(r), noise.bonus)
    if not fp64:
        hi, lo = exact32.residual32(p_row, cand_s, q_s)
        empty = ~(hi > 0).any(dim=1, keepdim=True)
        return acc, exact32.inverse_cdf32(torch.where(empty, p_row, hi), u,
                                          torch.where(empty, 0.0, lo))
    p_row = p_row.double()
    q_dense = torch.zeros(r, v, dtype=torch.float64, device=p.device)
    q_dense.scatter_add_(1, cand_s, q_s.double())
    resid = (p_row - q_dense).clamp(min=0.0)
    empty = resid.sum(dim=1, keepdim=True) <= 0
    law = torch.where(empty, p_row, resid)
    drawn = inverse_cdf(law, u)
    return acc, drawn if marks is None else marks.emit(law, acc, drawn)


def sample_next(logits: torch.Tensor, sampling: SamplingBatch, u: torch.Tensor | None,
                has_fp64: bool | None = None, marks: EmitDraw | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per request from target logits [R, V] (greedy rows: argmax) with uniforms u [R]
    (None: an all-greedy batch, which draws nothing).

    Used after prefill and by target-only decoding (the engine calls it directly: inside
    ``Backend.run_context()`` of a backend without float64 it takes the float32 formulation).
    ``marks``: a keyed draw for the sampled rows (slot 0). Returns (token [R], bad [R]).
    """
    _require_fp64(marks, exact32.fp64_enabled(has_fp64))
    bad = bad_rows(logits)
    token = torch.argmax(logits, dim=-1)
    if sampling.any_sampled:
        if u is None:
            raise InvalidInputError("sample_next: a batch with sampled rows needs uniforms")
        p = target_probs(logits.unsqueeze(1), sampling.temperature, sampling.top_k,
                         sampling.top_p, top_k_max=sampling.top_k_max,
                         top_p_rows=sampling.top_p_rows, min_p=sampling.min_p)[:, 0]
        drawn = inverse_cdf(p.double(), u) if exact32.fp64_enabled(has_fp64) else \
            exact32.inverse_cdf32(p, u)                                   # -1: not a law
        if marks is not None:
            drawn = marks.emit(p.double(), torch.zeros_like(drawn), drawn)
        token = torch.where(sampling.greedy, token, drawn)
        bad = bad | (~sampling.greedy & (drawn < 0))
    return token, bad
