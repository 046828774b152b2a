"""The adversarial corpus of the verifier (docs/verification.md, "Edge cases"): u exactly at p/q
and ±1 ulp, p = 0 (u → 0), p = q, the empty residual, ties, NaN / +inf / all −inf rows,
duplicated candidates, T = 1e-3, the mask id as a token, V not a multiple of 16/32/64, batch 1.

Each case returns numpy inputs; thresholds use probabilities every softmax computes exactly
(equal logits over 2 or 4 tokens, −inf elsewhere), so the decision is defined bit for bit.
Part 2 (``corpus_edges``): exact top-p boundaries, γ = 15 blocks, vocabularies above every
tuned verify chunk, float32-vs-float64 acceptance thresholds. The sample list (names, seeds,
tiers) is ``verify_corpus``.
"""

from __future__ import annotations

import numpy as np

from .samples import gen_uniforms, probs64, random_logits, sampled_draft

NEG = -np.inf
F32_1_3 = float(np.float32(1 / 3))
ULP = 2.0 ** -24


def verify_inputs(logits, draft, cand, q, temps, top_k=None, top_p=None, accept=None,
                  residual=None, bonus=None, g=None):
    """One verify case as NumPy inputs; the uniforms not given are drawn from ``g``."""
    r, rows, _ = logits.shape
    gamma = rows - 1
    g = g or np.random.default_rng(0)
    return dict(logits=logits, draft=np.asarray(draft), cand=np.asarray(cand), q=np.asarray(q),
                temps=list(temps), top_k=list(top_k or [0] * r), top_p=list(top_p or [1.0] * r),
                walk=gen_uniforms(g, (r, gamma)),
                accept=gen_uniforms(g, (r, gamma)) if accept is None else np.asarray(accept),
                residual=gen_uniforms(g, (r, gamma)) if residual is None else np.asarray(residual),
                bonus=gen_uniforms(g, (r,)) if bonus is None else np.asarray(bonus))


def random_case(g, r, gamma, v, k, temps, top_k=None, top_p=None, dup=False):
    """Random logits; greedy rows draft mostly the argmax, sampled rows draw from q, where q is
    either a random law or the target's own top-k law (long accepts)."""
    logits = random_logits(g, (r, gamma + 1, v))
    top_k, top_p = top_k or [0] * r, top_p or [1.0] * r
    p = probs64(logits, temps, top_k, top_p)
    draft = np.zeros((r, gamma), np.int64)
    cand = np.zeros((r, gamma, k), np.int64)
    q = np.zeros((r, gamma, k))
    for i in range(r):
        for j in range(gamma):
            if temps[i] == 0:
                cand[i, j] = g.choice(v, k, replace=False)
                q[i, j, 0] = 1.0
                draft[i, j] = np.argmax(logits[i, j]) if g.random() < 0.7 else cand[i, j, 0]
                cand[i, j, 0] = draft[i, j]
            elif g.random() < 0.5:
                cand[i, j], q[i, j], draft[i, j] = sampled_draft(g, k, v, dup)
            else:
                top = np.argsort(-p[i, j], kind="stable")[:k]
                w = np.maximum(p[i, j, top], 1e-3)
                cand[i, j], q[i, j] = top, (w / w.sum()).astype(np.float32)
                draft[i, j] = top[min(int(np.searchsorted(np.cumsum(q[i, j]), g.random(),
                                                          side="right")), k - 1)]
    return verify_inputs(logits, draft, cand, q, temps, top_k, top_p, g=g)


def _two_equal(v, rows):
    x = np.full((rows, v), NEG)
    x[:, :2] = 0.0
    return x


def u_at_threshold(g):
    """p = 1/2 (two equal logits) with q = 1, and p = fl32(1/3) with q = 1/2: u·q == p rejects
    (strict <), one float32 ulp below accepts, one above rejects."""
    half_lo = float(np.nextafter(np.float32(0.5), np.float32(0)))
    half_hi = float(np.nextafter(np.float32(0.5), np.float32(1)))
    u3 = 2 * F32_1_3
    us = [0.5, half_lo, half_hi, u3, u3 - ULP, u3 + ULP]
    logits = np.zeros((6, 2, 6))
    logits[:3, 0] = _two_equal(6, 1)
    logits[3:, 0, 3:] = NEG
    cand = np.array([[[0, 1]]] * 3 + [[[0, 1]]] * 3)
    q = np.array([[[1.0, 0.0]]] * 3 + [[[0.5, 0.5]]] * 3)
    return verify_inputs(logits, [[0]] * 6, cand, q, [1.0] * 6, accept=np.array(us)[:, None], g=g)


def p_zero(g):
    """Drafts with p = 0 (outside top-k = 2, or a −inf logit) and the smallest uniforms, 2^-24
    and the limit u = 0: never accepted, and the emitted token has p > 0."""
    logits = random_logits(g, (4, 3, 11))
    logits[:2, :, 9:] = -20.0                      # far outside the top-2
    logits[2:, :, 7] = NEG
    draft = [[9, 9], [10, 9], [7, 7], [7, 1]]
    cand = np.array([[[d, (d + 1) % 11] for d in row] for row in draft])
    q = np.tile([1.0, 0.0], (4, 2, 1))
    accept = np.array([[ULP, ULP], [0.0, 0.0], [ULP, 0.0], [0.0, ULP]])
    return verify_inputs(logits, draft, cand, q, [1.0] * 4, top_k=[2, 2, 0, 0], accept=accept, g=g)


def p_equals_q(g):
    """p = q = 1/4 on four tokens: always accepted; the bonus comes from p."""
    logits = np.full((3, 3, 9), NEG)
    logits[:, :, 2:6] = 0.0
    cand = np.tile(np.arange(2, 6), (3, 2, 1))
    q = np.full((3, 2, 4), 0.25)
    accept = np.array([[ULP, ULP], [0.5, 0.5], [1 - ULP, 1 - ULP]])
    return verify_inputs(logits, [[3, 5], [2, 2], [5, 4]], cand, q, [1.0] * 3, accept=accept, g=g)


def empty_residual(g):
    """q(d) just above p(d) = 1/4 and u near 1 rejects, leaving (p − q)+ = 0: sample from p."""
    logits = np.full((2, 2, 4), 0.0)
    cand = np.tile(np.arange(4), (2, 1, 1))
    q = np.full((2, 1, 4), 0.25)
    q[:, 0, 1] = 0.25 * (1 + 2.0 ** -20)
    return verify_inputs(logits, [[1], [1]], cand, q, [1.0, 1.0], accept=[[1 - ULP]] * 2,
                         residual=[[0.1], [0.8]], g=g)


def greedy_ties(g):
    """Exact ties in the target's argmax: the lowest index is the target's token."""
    logits = random_logits(g, (3, 3, 13))
    for i in range(3):
        logits[i, :, [4, 9]] = 9.0
    draft = [[9, 4], [4, 4], [4, 9]]
    cand = np.array([[[d] for d in row] for row in draft])
    return verify_inputs(logits, draft, cand, np.ones((3, 2, 1)), [0.0] * 3, g=g)


def nonfinite_rows(g):
    """NaN, +inf and all −inf rows are flagged (never an out-of-vocabulary id); row 0 is fine."""
    logits = random_logits(g, (4, 3, 7))
    logits[1, 1, 3] = np.nan
    logits[2, 0, 5] = np.inf
    logits[3, 2, :] = NEG
    draft = [[0, 1]] * 4
    cand = np.array([[[0, 1], [1, 2]]] * 4)
    q = np.array([[[0.5, 0.5], [0.5, 0.5]]] * 4)
    return verify_inputs(logits, draft, cand, q, [1.0, 0.0, 1.0, 1.0], g=g)


def duplicated_candidates(g):
    """cand [2, 2, 0] with q [1/4, 1/4, 1/2]: q(2) = 1/2 (summed), p(2) = 1/4 → accept iff u < 1/2."""
    logits = np.zeros((3, 2, 4))
    cand = np.tile([2, 2, 0], (3, 1, 1))
    q = np.tile([0.25, 0.25, 0.5], (3, 1, 1))
    return verify_inputs(logits, [[2]] * 3, cand, q, [1.0] * 3, accept=[[0.49], [0.5], [0.51]], g=g)


def mask_id_tokens(g):
    """The mask id (V − 1 = 18) as the target's argmax and as drafts: a normal token."""
    logits = random_logits(g, (2, 4, 19))
    logits[:, :, 18] = 12.0
    cand = np.tile([[18, 0, 1]], (2, 3, 1))
    q = np.tile([0.9, 0.05, 0.05], (2, 3, 1))
    return verify_inputs(logits, [[18, 18, 18]] * 2, cand, q, [0.0, 1.0], g=g)


def bad_q(g):
    """A sampled draft token with q(d) = 0 is not its own law: flagged (bad_q)."""
    logits = random_logits(g, (2, 2, 6))
    cand = np.array([[[0, 1]], [[0, 1]]])
    q = np.array([[[0.5, 0.5]], [[0.5, 0.5]]])
    return verify_inputs(logits, [[3], [1]], cand, q, [1.0, 1.0], g=g)


def nonfinite_q(g):
    """q with NaN at the draft token, NaN elsewhere, or a negative entry: flagged (bad_q), never
    a silent accept or a NaN residual; request 0 is a valid law."""
    logits = random_logits(g, (4, 2, 6))
    cand = np.array([[[0, 1]]] * 4)
    q = np.array([[[0.5, 0.5]], [[np.nan, 0.5]], [[0.5, np.nan]], [[1.5, -0.5]]])
    return verify_inputs(logits, [[0]] * 4, cand, q, [1.0] * 4, g=g)
