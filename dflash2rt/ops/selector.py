"""DFlash2 candidate selector: top-K per slot, the low-rank candidate lattice, and the walk.

    unary[e, c]   = softcap(val[e, c] · output_multiplier)
    S[e, p, c]    = unary[e, c] + Σ_r A[pred(e, p), r] · P_e[r] · Bc[cand[e, c], r]
    pred(0, ·)    = anchor,  pred(e, p) = cand[e-1, p]

The walk starts at the anchor and at slot e reads the lattice row of the candidate it took at
slot e-1: greedy takes the argmax (lowest index on ties, q one-hot); sampling draws from
q_e = softmax(row / T) (computed as softmax((row - max row) / T), which cannot overflow) by
inverse CDF with the slot's walk uniform — over float64 cumulative sums, or with ``has_fp64``
False over double-float float32 sums (``exact32.inverse_cdf32``: the same index except within
(2^-40 + K·2^-53)·total of a CDF breakpoint; no float64 tensor). A lattice row the walk reads that holds NaN /
+inf or no finite entry flags the request (``bad_lattice``): its draft is not drawn from a law.

From ``ROW_WALK_MIN_K`` candidates on, the unmasked walk scores only the lattice row it reads
at each slot (K·r work per slot, not the whole [K, K] slot lattice's K²·r, nor a law drawn for
each of its K rows): the same rows, up to float32 rounding of the sum over r.

The walk's draws are an argument (``ops.draws``): the walk uniforms [R, γ], or a
``DrawSource`` whose ``WalkDraw`` replaces the sampled rows' draw at each slot once the walk
knows the lattice row it reads — the watermark (``dflash2rt.watermark.generate.KeyedDraws``)
draws there by Gumbel-max keyed by the path so far. q stays the law the draw is from.

``mask`` (optional, a ``WalkMask``): a constraint on the path (``dflash2rt.constraints``): at
slot e the walk reads its lattice row with the candidates the constraint forbids after the path
so far at −inf, and draws (argmax, inverse CDF or ``walk``) from that masked row; q is the
masked row's law, the law the draft token is drawn from, so verification stays lossless. A row
in which every candidate is forbidden or scores −inf (a reduced draft vocabulary, candidates
past a request's own count) is read unmasked (its draft is rejected by the masked verify
rows).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from ..errors import InvalidInputError
from . import exact32
from .batch import SamplingBatch
from .draws import WalkDraw, WalkDraws, walk_draws
from .sampling import bad_rows, inverse_cdf, scale


ROW_WALK_MIN_K = 128     # from this K on, the unmasked walk scores only the rows it reads


@dataclass(frozen=True)
class SelectorParams:
    """Static selector hyper-parameters from the draft's ``dflash_config``."""

    top_k: int
    output_multiplier: float = 1.0
    softcap: float | None = None


class WalkMask(Protocol):
    """A constraint followed along the walk's path (the per-slot state lives in the object)."""

    def allowed(self, slot: int, cand: torch.Tensor) -> torch.Tensor:
        """cand [R, K] (slot ``slot``'s candidates) → bool [R, K]: allowed after the path so
        far."""

    def advance(self, token: torch.Tensor) -> None:
        """The walk took token [R] at the current slot."""


@dataclass(frozen=True)
class SelectorOut:
    draft: torch.Tensor       # [R, γ] int64, the proposed tokens
    candidates: torch.Tensor  # [R, γ, K] int64, top-K ids per slot (descending logit)
    q: torch.Tensor           # [R, γ, K] float32, the law each draft token was drawn from
    bad: torch.Tensor         # [R] bool, draft logits with NaN / +inf / no finite entry
    bad_lattice: torch.Tensor  # [R] bool, a lattice row the walk read is not a finite law


def topk_lowest_index(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k of [..., V] by value, descending, ties broken by the lower index (deterministic).

    Two ``torch.topk`` passes, no full-vocabulary sort or cumsum: the values above the k-th
    largest value are exactly ``topk``'s; the rest are the lowest ids holding the k-th value,
    found by a top-k of ``-id`` over the row's ties (int32 keys).
    """
    v = logits.shape[-1]
    vals, idx = torch.topk(logits, k, dim=-1)                             # [..., K] descending
    kth = vals[..., -1:]
    above = vals > kth                                                    # a prefix of each row
    ids = torch.arange(v, dtype=torch.int32, device=logits.device)
    key = torch.where(logits == kth, -ids, torch.iinfo(torch.int32).min)  # [..., V]
    tied = -torch.topk(key, k, dim=-1).values.to(torch.int64)             # lowest tied ids, asc
    col = torch.arange(k, device=logits.device)
    fill = (col - above.sum(dim=-1, keepdim=True)).clamp(min=0)
    picked = torch.where(above, idx, tied.gather(-1, fill)).clamp(0, v - 1)   # a NaN row: any
    picked = torch.sort(picked, dim=-1).values                            # ascending id order
    vals = logits.gather(-1, picked)
    order = torch.sort(vals, dim=-1, descending=True, stable=True).indices
    return vals.gather(-1, order), picked.gather(-1, order)


def unary_scores(vals: torch.Tensor, p: SelectorParams) -> torch.Tensor:
    """softcap(val · output_multiplier) in float32; -inf candidates stay -inf."""
    if p.output_multiplier == 1.0 and p.softcap is None:
        return vals.float()                        # the same values: ·1 and the -inf rule
    x = vals.float() * p.output_multiplier
    if p.softcap is not None:
        x = p.softcap * torch.tanh(x / p.softcap)
    return torch.where(torch.isneginf(vals), float("-inf"), x)


def check_select_args(logits: torch.Tensor, proj: torch.Tensor, pred_codebook: torch.Tensor,
                      succ_codebook: torch.Tensor, params: SelectorParams,
                      u_walk: torch.Tensor) -> None:
    """Validate shapes and K against the vocabulary."""
    r, gamma, v = logits.shape
    if not 1 <= params.top_k <= v:
        raise InvalidInputError(f"selector top_k={params.top_k} must be in [1, vocab={v}]")
    if proj.shape[:2] != (r, gamma) or pred_codebook.shape != succ_codebook.shape \
            or pred_codebook.shape[1] != proj.shape[2] or u_walk.shape != (r, gamma):
        raise InvalidInputError(
            f"selector shapes disagree: logits {tuple(logits.shape)}, proj {tuple(proj.shape)}, "
            f"codebooks {tuple(pred_codebook.shape)}/{tuple(succ_codebook.shape)}, "
            f"u_walk {tuple(u_walk.shape)}")


def select(logits: torch.Tensor, proj: torch.Tensor, anchor: torch.Tensor,
           pred_codebook: torch.Tensor, succ_codebook: torch.Tensor, params: SelectorParams,
           sampling: SamplingBatch, u_walk: WalkDraws, has_fp64: bool | None = None,
           mask: WalkMask | None = None) -> SelectorOut:
    """logits [R, γ, V], proj [R, γ, r], anchor [R], codebooks [V, r], u_walk: the walk's
    draws (uniforms [R, γ], or a ``DrawSource``) → SelectorOut. ``has_fp64`` False: the walk
    draw in float32 (None: ``exact32.fp64_enabled()``); ``mask``: a constraint on the path
    (module docstring)."""
    u_walk, walk = walk_draws(u_walk, has_fp64)          # a source's drawer: raises if it can't
    r, gamma, v = logits.shape
    k = params.top_k
    check_select_args(logits, proj, pred_codebook, succ_codebook, params, u_walk)
    bad = bad_rows(logits).any(dim=-1)                                    # [R]
    vals, cand = topk_lowest_index(logits, k)                             # [R, γ, K]
    unary = unary_scores(vals, params)
    if mask is None and k >= ROW_WALK_MIN_K:
        pick, q, bad_lattice = _row_walk(unary, cand, anchor, proj, pred_codebook,
                                         succ_codebook, sampling, u_walk, has_fp64, walk)
        return SelectorOut(cand.gather(-1, pick.unsqueeze(-1)).squeeze(-1), cand, q, bad,
                           bad_lattice)
    score = lattice(unary, cand, anchor, proj, pred_codebook, succ_codebook)  # [R, γ, K, K]
    if mask is not None:
        return _masked_walk(score, cand, sampling, u_walk, has_fp64, walk, mask, bad)
    choice = torch.argmax(score, dim=-1)                                  # greedy, lowest on ties
    row_bad = bad_rows(score)                                             # [R, γ, K]
    law = None
    if sampling.any_sampled:
        law, drawn = _draw(score, sampling, u_walk.view(r, gamma, 1).expand(r, gamma, k),
                           has_fp64)                                      # [R, γ, K, K] float32
        sampled = ~sampling.greedy.view(r, 1, 1)
        row_bad = row_bad | (sampled & (drawn < 0))
        choice = torch.where(sampled, drawn.clamp(min=0), choice)
    # The walk: slot 0 reads the anchor's row (every row of slot 0 is that row), slot e the row
    # of the candidate taken at slot e-1.
    prev = torch.zeros(r, dtype=torch.int64, device=logits.device)
    picks, rows_taken = [], []
    walk_bad = torch.zeros(r, dtype=torch.bool, device=logits.device)
    for e in range(gamma):
        rows_taken.append(prev)
        nxt = choice[:, e].gather(1, prev.view(r, 1)).view(r)
        if walk is not None and law is not None:
            law_row = law[:, e].gather(1, prev.view(r, 1, 1).expand(r, 1, k)).squeeze(1)
            nxt, bad_e = walk.pick(e, law_row, cand[:, e], nxt, sampling.greedy)
            walk_bad = walk_bad | bad_e
        prev = nxt
        picks.append(prev)
    pick = torch.stack(picks, 1)                                          # [R, γ]
    taken = torch.stack(rows_taken, 1)                                    # [R, γ] lattice rows read
    bad_lattice = row_bad.gather(2, taken.unsqueeze(-1)).squeeze(-1).any(dim=1) | walk_bad
    q = torch.nn.functional.one_hot(pick, k).float()
    if law is not None:
        row = taken.view(r, gamma, 1, 1).expand(r, gamma, 1, k)
        q_s = law.gather(2, row).squeeze(2)                               # [R, γ, K]
        q = torch.where(sampling.greedy.view(r, 1, 1), q, q_s)
    return SelectorOut(cand.gather(-1, pick.unsqueeze(-1)).squeeze(-1), cand, q, bad,
                       bad_lattice)


def _row_walk(unary: torch.Tensor, cand: torch.Tensor, anchor: torch.Tensor,
              proj: torch.Tensor, pred_codebook: torch.Tensor, succ_codebook: torch.Tensor,
              sampling: SamplingBatch, u_walk: torch.Tensor, has_fp64: bool | None,
              walk: WalkDraw | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The unmasked walk that scores, at each slot, only the lattice row of the candidate it
    took at the slot before (the anchor's at slot 0), and draws from that row's law alone; picks
    and flags as ``select``'s whole-lattice walk. → (pick [R, γ], q [R, γ, K], bad_lattice
    [R])."""
    r, gamma, k = cand.shape
    right = succ_codebook[cand].float()                                   # [R, γ, K, r]
    scale_e = proj.float()                                                # [R, γ, r]
    token = anchor.to(torch.int64)                                        # the predecessor
    greedy, sampled = sampling.greedy, ~sampling.greedy
    picks, qs = [], []
    bad_lattice = torch.zeros(r, dtype=torch.bool, device=cand.device)
    for e in range(gamma):
        row = lattice_rows(unary[:, e], token.view(r, 1), scale_e[:, e], pred_codebook,
                           right[:, e]).squeeze(1)                        # [R, K]
        nxt = torch.argmax(row, dim=-1)                                   # greedy, lowest on ties
        row_bad = bad_rows(row)
        q = torch.nn.functional.one_hot(nxt, k).float()
        if sampling.any_sampled:
            law, drawn = _draw(row, sampling, u_walk[:, e], has_fp64)    # [R, K], [R]
            row_bad = row_bad | (sampled & (drawn < 0))
            nxt = torch.where(sampled, drawn.clamp(min=0), nxt)
            if walk is not None:
                nxt, bad_e = walk.pick(e, law, cand[:, e], nxt, greedy)
                row_bad = row_bad | bad_e
            q = torch.where(greedy.view(r, 1), q, law)
        bad_lattice = bad_lattice | row_bad
        token = cand[:, e].gather(1, nxt.view(r, 1)).view(r)
        picks.append(nxt)
        qs.append(q)
    return torch.stack(picks, 1), torch.stack(qs, 1), bad_lattice


def _draw(rows: torch.Tensor, sampling: SamplingBatch, u: torch.Tensor, has_fp64: bool | None
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """Lattice rows [R, ..., K] → (their law at each request's temperature, float32, same
    shape; the inverse-CDF pick with uniforms u [R, ...]: -1 where a row is not a law)."""
    temp = torch.where(sampling.greedy, 1.0, sampling.temperature)
    law = torch.softmax(scale(rows, temp.view(-1, *[1] * (rows.dim() - 1))), dim=-1)
    drawn = inverse_cdf(law.double(), u) if exact32.fp64_enabled(has_fp64) else \
        exact32.inverse_cdf32(law, u)
    return law, drawn


def _masked_walk(score: torch.Tensor, cand: torch.Tensor, sampling: SamplingBatch,
                 u_walk: torch.Tensor, has_fp64: bool | None, walk: WalkDraw | None,
                 mask: WalkMask, bad: torch.Tensor) -> SelectorOut:
    """The walk under a constraint: slot by slot, the row read with the forbidden candidates
    at −inf (all allowed when no allowed candidate scores above −inf), drawn from that row's
    law."""
    r, gamma, k, _ = score.shape
    prev = torch.zeros(r, dtype=torch.int64, device=score.device)
    picks, qs = [], []
    bad_lattice = torch.zeros(r, dtype=torch.bool, device=score.device)
    greedy = sampling.greedy
    for e in range(gamma):
        row = score[:, e].gather(1, prev.view(r, 1, 1).expand(r, 1, k)).squeeze(1)  # [R, K]
        ok = mask.allowed(e, cand[:, e]) & ~torch.isneginf(row)         # allowed, with mass
        ok = ok | ~ok.any(-1, keepdim=True)
        masked = row.masked_fill(~ok, float("-inf"))
        row_bad = bad_rows(row) | bad_rows(masked)
        pick = torch.argmax(masked, dim=-1)                               # lowest on ties
        q = torch.nn.functional.one_hot(pick, k).float()
        if sampling.any_sampled:
            law, drawn = _draw(masked, sampling, u_walk[:, e], has_fp64)
            if walk is not None:
                drawn_w, bad_w = walk.pick(e, law, cand[:, e], drawn.clamp(min=0), greedy)
                row_bad = row_bad | bad_w
                drawn = torch.where(drawn < 0, drawn, drawn_w)
            row_bad = row_bad | (~greedy & (drawn < 0))
            pick = torch.where(greedy, pick, drawn.clamp(min=0))
            q = torch.where(greedy.view(r, 1), q, law)
        bad_lattice = bad_lattice | row_bad
        mask.advance(cand[:, e].gather(1, pick.view(r, 1))[:, 0])
        picks.append(pick)
        qs.append(q)
        prev = pick
    pick = torch.stack(picks, 1)                                          # [R, γ]
    return SelectorOut(cand.gather(-1, pick.unsqueeze(-1)).squeeze(-1), cand,
                       torch.stack(qs, 1), bad, bad_lattice)


def lattice(unary: torch.Tensor, cand: torch.Tensor, anchor: torch.Tensor, proj: torch.Tensor,
            pred_codebook: torch.Tensor, succ_codebook: torch.Tensor) -> torch.Tensor:
    """S[r, e, p, c] = unary[e, c] + Σ_d A[pred(e, p), d] · P_e[d] · Bc[cand[e, c], d], float32.

    pred(0, p) = anchor for every p; pred(e, p) = cand[e-1, p].
    """
    r, gamma, k = cand.shape
    pred = torch.cat([anchor.to(torch.int64).view(r, 1, 1).expand(r, 1, k), cand[:, :-1]], 1)
    return lattice_rows(unary, pred, proj.float(), pred_codebook,
                        succ_codebook[cand].float())                      # [R, γ, K, K]


def lattice_rows(unary: torch.Tensor, pred: torch.Tensor, proj: torch.Tensor,
                 pred_codebook: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
    """The lattice rows of predecessor tokens pred [..., P]: unary [..., K] + Σ_d A[pred, d] ·
    P[d] · right[c, d] with proj [..., r] (float32) and right [..., K, r] the successor codebook
    rows of the candidates (float32) → [..., P, K] float32."""
    left = pred_codebook[pred].float() * proj.unsqueeze(-2)              # [..., P, r]
    return unary.unsqueeze(-2) + left @ right.transpose(-1, -2)
