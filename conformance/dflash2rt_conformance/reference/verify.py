"""Lossless verification in float64 (docs/design.md §1 step 5, docs/verification.md).

Greedy rows: accept the longest prefix with d_j == argmax(logits_j) (lowest index on ties), emit
the argmax at the first mismatch or after the last slot. Sampled rows: accept d_j iff
u_j · q_j(d_j) < p_j(d_j) (strict), q_j(x) = Σ_k q_jk [cand_jk = x]; on the first rejection emit
inverse_cdf(norm((p_j − q_j)_+), residual_j) — from p_j when that mass is 0 — and after a fully
accepted block emit inverse_cdf(p_γ, bonus). ``tokens`` holds the accepted drafts, then the
emitted token, then −1.
"""

from __future__ import annotations

import numpy as np

from .sampling import argmax_lowest, bad_rows, inverse_cdf, target_probs


def draft_mass(draft: int, cand: np.ndarray, q: np.ndarray):
    """q(d) with duplicated candidates summed (float64, or Fraction for object arrays)."""
    return sum((q[k] for k in range(len(cand)) if cand[k] == draft), q[0] * 0)


def law_broken(draft, cand, q) -> bool:
    """A sampled row's q [γ, K] is not a law it could have drawn ``draft`` [γ] from: a NaN, inf
    or negative entry, or a draft token with no mass (q(d) not > 0)."""
    q = np.asarray(q, dtype=np.float64)
    return bool((~np.isfinite(q) | (q < 0)).any()) or \
        any(not draft_mass(draft[j], cand[j], q[j]) > 0 for j in range(len(draft)))


def dense_q(cand: np.ndarray, q: np.ndarray, v: int) -> np.ndarray:
    out = np.zeros(v, dtype=np.asarray(q).dtype)
    for k in range(len(cand)):
        out[cand[k]] = out[cand[k]] + q[k]
    return out


def verify_greedy_row(logits: np.ndarray, draft: np.ndarray) -> tuple[int, int]:
    """logits [γ+1, V], draft [γ] → (accept_len, emitted token)."""
    gamma = draft.shape[0]
    top = [argmax_lowest(logits[j]) for j in range(gamma + 1)]
    acc = 0
    while acc < gamma and draft[acc] == top[acc]:
        acc += 1
    return acc, top[acc]


def verify_sampled_row(p: np.ndarray, draft, cand, q, u_accept, u_residual, u_bonus
                       ) -> tuple[int, int]:
    """p [γ+1, V] probabilities → (accept_len, emitted token). Works in float64 and, with object
    arrays, in exact Fractions. Uniforms are read lazily (``u_bonus[0]`` only after a fully
    accepted block) so that the law enumerator branches only on uniforms actually used."""
    gamma, v = len(draft), p.shape[1]
    for j in range(gamma):
        if not u_accept[j] * draft_mass(draft[j], cand[j], q[j]) < p[j][draft[j]]:
            diff = p[j] - dense_q(cand[j], q[j], v)
            resid = np.array([max(x, 0 * x) for x in diff]) if diff.dtype == object else \
                np.maximum(diff, 0.0)                                  # (p − q)+
            weights = p[j] if resid.sum() <= 0 else resid
            return j, inverse_cdf(weights, u_residual[j])
    return gamma, inverse_cdf(p[gamma], u_bonus[0])


def verify(logits, draft, candidates, q, temperature, top_k, top_p, greedy, u_accept,
           u_residual, u_bonus) -> dict:
    """logits [R, γ+1, V] (rounded to the test dtype), draft [R, γ], candidates / q [R, γ, K],
    per-request sampling parameters [R], noise [R, γ] / bonus [R] → dict(accept_len [R],
    tokens [R, γ+1], bad [R], bad_q [R]). Rows flagged ``bad`` or ``bad_q`` carry no meaningful
    tokens."""
    logits = np.asarray(logits, dtype=np.float64)
    r, rows, _ = logits.shape
    gamma = rows - 1
    bad = bad_rows(logits).any(-1)
    acc = np.zeros(r, dtype=np.int64)
    tokens = np.full((r, gamma + 1), -1, dtype=np.int64)
    bad_q = np.zeros(r, dtype=bool)
    for i in range(r):
        bad_q[i] = not greedy[i] and law_broken(draft[i], candidates[i], q[i])
        if bad[i] or bad_q[i]:
            continue
        if greedy[i]:
            a, tok = verify_greedy_row(logits[i], draft[i])
        else:
            p = target_probs(logits[i:i + 1], temperature[i:i + 1], top_k[i:i + 1],
                             top_p[i:i + 1])[0]
            a, tok = verify_sampled_row(p, draft[i], candidates[i], np.asarray(q[i], np.float64),
                                        np.asarray(u_accept[i], np.float64),
                                        np.asarray(u_residual[i], np.float64),
                                        np.asarray(u_bonus[i:i + 1], np.float64))
        acc[i] = a
        tokens[i, :a] = draft[i, :a]
        tokens[i, a] = tok
    return {"accept_len": acc, "tokens": tokens, "bad": bad, "bad_q": bad_q}


def sample_next(logits, temperature, top_k, top_p, greedy, u) -> dict:
    """One token per request from logits [R, V] (greedy rows: argmax) → dict(token, bad)."""
    logits = np.asarray(logits, dtype=np.float64)
    bad = bad_rows(logits)
    out = np.zeros(logits.shape[0], dtype=np.int64)
    for i in range(logits.shape[0]):
        if bad[i]:
            continue
        if greedy[i]:
            out[i] = argmax_lowest(logits[i])
        else:
            p = target_probs(logits[i:i + 1, None], temperature[i:i + 1], top_k[i:i + 1],
                             top_p[i:i + 1])[0, 0]
            out[i] = inverse_cdf(p, float(u[i]))
    return {"token": out, "bad": bad}
