"""The detector: per-token evidence under both keys, context deduplication, an exact-bound p-value.

A token at position i (with ``h`` tokens before it in the text) has context c_i = hash of those
tokens and values r_A = r(A, c_i, t_i), r_B = r(B, c_i, t_i): the token may have been drawn by the
draft (A) or the target (B), and a Gumbel-max draw makes its own value large. Statistic:

    m_i = max(lo(r_A), lo(r_B)),  s_i = -log(1 - m_i²),  S = Σ s_i over scored tokens,

with lo(r) = r - 2⁻²⁴ = k/2²³ the lower end of the value's grid cell. Under H0 (a text that does
not depend on the key) the values of distinct (context, token) pairs are independent uniforms on
the grid, so lo(r) ≤_st U(0, 1); the max of two independent U(0, 1) has P(M ≤ x) = x², so with U
in place of lo(r) s_i would be exactly Exp(1) and S exactly Gamma(n, 1). Since s is increasing in
m, every s_i ≤_st Exp(1) and S ≤_st Gamma(n, 1): the p-value Q(n, S) (regularized upper gamma)
satisfies P(p ≤ α) ≤ α for every α — an exact bound, tight to the 2⁻²³ grid. Deduplication keeps
the pairs distinct: a (context, token) pair already scored is skipped (its values would repeat).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np
import torch

from ..errors import InvalidInputError
from .keys import WatermarkKey
from .values import MAX_TOKEN_ID, context_hash, keyed_uniforms, windows

DEFAULT_CONTEXT_WIDTH = 4
MAX_CONTEXT_WIDTH = 64
_GRID = 2.0 ** -24


@dataclass(frozen=True)
class Detection:
    """One text's verdict. ``p_value`` bounds the chance that an unwatermarked text scores this
    high; ``watermarked`` = p_value ≤ fpr. No key material is held."""

    p_value: float
    log10_p_value: float
    score: float
    tokens_scored: int          # distinct (context, token) pairs with a full window in the text
    tokens_total: int
    repeated_skipped: int
    context_width: int
    fpr: float
    watermarked: bool

    def as_dict(self) -> dict:
        return asdict(self)


def check_context_width(width: object) -> int:
    if isinstance(width, bool) or not isinstance(width, numbers.Integral) \
            or not 1 <= width <= MAX_CONTEXT_WIDTH:
        raise InvalidInputError(f"watermark context width must be an integer in "
                                f"[1, {MAX_CONTEXT_WIDTH}], got {width!r}")
    return int(width)


def check_tokens(tokens: Sequence[int]) -> torch.Tensor:
    """A sequence of token ids (ints in [0, 2³² - 2]; a tensor or a NumPy array of them as
    well) → int64 [N]."""
    if isinstance(tokens, (torch.Tensor, np.ndarray)):
        tokens = tokens.tolist()
    if isinstance(tokens, (str, bytes)) or not isinstance(tokens, Sequence):
        raise InvalidInputError(f"tokens must be a list of integer token ids, got "
                                f"{type(tokens).__name__}")
    for i, t in enumerate(tokens):
        if isinstance(t, bool) or not isinstance(t, numbers.Integral) or not 0 <= t <= MAX_TOKEN_ID:
            raise InvalidInputError(f"token {i} is {t!r}; token ids are integers in "
                                    f"[0, {MAX_TOKEN_ID}]")
    return torch.tensor([int(t) for t in tokens], dtype=torch.int64)


def token_evidence(key: WatermarkKey, tokens: Sequence[int],
                   context_width: int = DEFAULT_CONTEXT_WIDTH) -> dict[str, np.ndarray]:
    """Per scored position (full window inside the text): ``position``, ``token``, ``context``
    (hash), ``r_draft`` / ``r_target`` (values under A / B), ``score`` s_i, ``repeated`` (the
    (context, token) pair occurred earlier: not counted)."""
    width = check_context_width(context_width)
    t = check_tokens(tokens)
    pos = torch.arange(min(width, t.shape[0]), t.shape[0])
    ctx = context_hash(windows(t, width)[pos]) if pos.numel() else torch.zeros(0, dtype=torch.int64)
    tok = t[pos]
    r_a = keyed_uniforms(key.draft, ctx, tok).double().numpy()
    r_b = keyed_uniforms(key.target, ctx, tok).double().numpy()
    m = np.maximum(r_a, r_b) - _GRID                 # k / 2²³: exact in float64, < 1
    score = -np.log1p(-(m * m))                      # m² exact (46 bits)
    pairs = np.stack([ctx.numpy(), tok.numpy()], axis=1) if pos.numel() else np.zeros((0, 2))
    repeated = np.ones(pos.numel(), bool)
    if pos.numel():
        repeated[np.unique(pairs, axis=0, return_index=True)[1]] = False
    return {"position": pos.numpy(), "token": tok.numpy(), "context": ctx.numpy(),
            "r_draft": r_a, "r_target": r_b, "score": score, "repeated": repeated}


def gamma_sf(n: int, x: float) -> tuple[float, float]:
    """(Q(n, x), log10 Q(n, x)) for integer n ≥ 0: P(Gamma(n, 1) ≥ x) = P(Poisson(x) ≤ n - 1),
    summed in log space (no underflow in the log10 value)."""
    if n == 0 or x <= 0:
        return 1.0, 0.0
    k = np.arange(n, dtype=np.float64)
    log_fact = np.concatenate([[0.0], np.cumsum(np.log(np.arange(1, n, dtype=np.float64)))])
    terms = -x + k * math.log(x) - log_fact
    top = terms.max()
    log_q = min(0.0, float(top + np.log(np.exp(terms - top).sum())))
    return math.exp(log_q), log_q / math.log(10)


def detect(key: WatermarkKey, tokens: Sequence[int], fpr: float = 0.01,
           context_width: int = DEFAULT_CONTEXT_WIDTH) -> Detection:
    """Score a token sequence under ``key`` (no model needed); verdict at false-positive rate
    ``fpr`` (the p-value bound makes the true rate ≤ fpr)."""
    if not isinstance(key, WatermarkKey):
        raise InvalidInputError(f"key must be a WatermarkKey, got {type(key).__name__}")
    if isinstance(fpr, bool) or not isinstance(fpr, numbers.Real) or not 0 < fpr < 1:
        raise InvalidInputError(f"fpr must be a number in (0, 1), got {fpr!r}")
    ev = token_evidence(key, tokens, context_width)
    kept = ~ev["repeated"]
    n, s = int(kept.sum()), float(ev["score"][kept].sum())
    p, log10_p = gamma_sf(n, s)
    return Detection(p_value=p, log10_p_value=log10_p, score=s, tokens_scored=n,
                     tokens_total=len(tokens),
                     repeated_skipped=int(ev["repeated"].sum()), context_width=int(context_width),
                     fpr=float(fpr), watermarked=bool(p <= fpr))
