"""Verify corpus, part 2: cases that pin down one bug class each without relying on chance.

- exact top-p boundaries on tied logits (the kept mass lands exactly on top_p);
- γ = 15 blocks (block size 16) accepted through every depth and rejected at every slot;
- vocabularies larger than every tuned verify chunk (``block_v`` ≤ 2048 in every tuning table):
  greedy ties split across chunks, residual / bonus draws whose inverse-CDF target lies in a
  later chunk, and the real 151,936-token vocabulary;
- acceptance thresholds where q is not a power of two, so that ``u·q`` rounded to float32 decides
  differently from the exact (float64) product.

Probabilities are exact in every dtype and on both sides (equal logits, −inf elsewhere: 1/2,
1/4), so every decision is defined bit for bit; each case's docstring names its expected tokens.
"""

from __future__ import annotations

import numpy as np

from .corpus import NEG, ULP, verify_inputs
from .samples import HALF_UP

F32 = np.float32


def _tied(shape, ids) -> np.ndarray:
    """Logits [..., V]: 0 at ``ids`` (an exact uniform law over them), −inf elsewhere."""
    x = np.full(shape, NEG)
    x[..., list(ids)] = 0.0
    return x


def topp_boundary_ties(g):
    """Four tied tokens [3, 11, 20, 30] (p = 1/4 each): top_p = 1/2 keeps exactly the two
    lowest ids (the mass ahead of token 20 is 1/2, not < 1/2). r0: d = 20 has p = 0 →
    rejected, residual = p → 11. r1: d = 3, 11 accepted at u = 0.4 (< 1/2, > 1/3), bonus u → 1
    → 11. r2: top_p one ulp above 1/2 keeps three (u far from 1/3, 2/3). r3: top_k = 3 keeps
    all four ties, then top_p = 1/2; T = 0.7."""
    ids = [3, 11, 20, 30]
    logits = _tied((4, 3, 37), ids)
    draft = [[20, 3], [3, 11], [20, 3], [3, 30]]
    cand = np.array([[[d, 3 if d != 3 else 11] for d in row] for row in draft])
    q = np.tile([1.0, 0.0], (4, 2, 1))
    accept = [[0.25, 0.5], [0.4, 0.4], [0.125, 0.125], [0.3, 0.25]]
    return verify_inputs(logits, draft, cand, q, [1.0, 1.0, 1.0, 0.7], top_k=[0, 0, 0, 3],
                         top_p=[0.5, 0.5, HALF_UP, 0.5], accept=accept,
                         residual=[[0.75, 0.5]] * 4, bonus=[0.5, 1 - ULP, 0.5, 0.5], g=g)


def deep_accept_greedy(g):
    """γ = 15, greedy: row r accepts slots 0..r-1 and rejects slot r (r = 0..14, emitting the
    target's argmax there); row 15 accepts all 15 and emits the bonus argmax of row 15."""
    r, gamma, v = 16, 15, 29
    logits = np.clip(g.normal(0, 1, (r, gamma + 1, v)), -4, 4)
    top = g.integers(0, v, (r, gamma + 1))
    np.put_along_axis(logits, top[..., None], 6.0, -1)
    draft = top[:, :gamma].copy()
    for i in range(gamma):
        draft[i, i] = (top[i, i] + 1 + g.integers(0, v - 1)) % v        # ≠ the argmax
        draft[i, i + 1:] = g.integers(0, v, gamma - i - 1)
    cand = draft[..., None]
    return verify_inputs(logits, draft, cand, np.ones((r, gamma, 1)), [0.0] * r, g=g)


def deep_accept_sampled(g):
    """γ = 15, sampled: every row's p = 1/2 on two tied tokens (a, b); slot j drafts a with
    candidates [a, c] (p(c) = 0), q = [3/4, 1/4] → accept iff u < 2/3. Row r accepts slots
    0..r-1 (u = 1/2), rejects slot r (u = 7/8) and emits b (the whole residual); row 15 accepts
    all 15 and draws the bonus from p_15."""
    r, gamma, v = 16, 15, 29
    logits = np.full((r, gamma + 1, v), NEG)
    abc = np.stack([[g.choice(v, 3, replace=False) for _ in range(gamma + 1)] for _ in range(r)])
    np.put_along_axis(logits, abc[..., :2], 0.0, -1)                 # p(a) = p(b) = 1/2
    draft = abc[:, :gamma, 0]
    cand = abc[:, :gamma][..., [0, 2]]
    q = np.tile([0.75, 0.25], (r, gamma, 1))
    accept = np.full((r, gamma), 0.5)
    accept[np.arange(gamma), np.arange(gamma)] = 0.875
    return verify_inputs(logits, draft, cand, q, [1.0] * r, accept=accept, g=g)


def chunk_greedy_ties(g, v: int = 3001, ties=((100, 2100), (2047, 2048), (1023, 1024, 3000))):
    """Greedy, V = 3001 > every tuned chunk (1024, 2048): row j's maximum is tied at ids in
    different chunks of either size. Drafts [2100, ·] → reject, emit 100; [100, 2047] → accept
    both, bonus 1023; [100, 2048] → accept 100, reject, emit 2047 (lowest index wins)."""
    logits = np.clip(g.normal(0, 1, (3, 3, v)), -4, 4)
    for j, ids in enumerate(ties):
        logits[:, j, list(ids)] = 9.0
    draft = [[ties[0][1], ties[1][0]], [ties[0][0], ties[1][0]], [ties[0][0], ties[1][1]]]
    cand = np.array(draft)[..., None]
    return verify_inputs(logits, draft, cand, np.ones((3, 2, 1)), [0.0] * 3, g=g)


def chunk_residual_bonus(g, v: int = 3001, ids=(10, 1500, 2100, 2900)):
    """Sampled, V = 3001: p = 1/4 on four ids spread over the chunks. r0: d = 10 (q = 1) is
    rejected at u = 1/2; residual {1500, 2100, 2900} at u = 1/2 → 2100 (target 3/8 lies in a
    later chunk). r1: both accepted, bonus u = 0.6 → 2100. r2: d = 2900 accepted, 2100 (q = 1/2
    with 10) rejected at u = 3/4, residual {1500, 2900} → 2900."""
    logits = _tied((3, 3, v), ids)
    draft = [[ids[0], ids[1]], [ids[0], ids[1]], [ids[3], ids[2]]]
    cand = np.array([[[d, ids[0] if d != ids[0] else 7] for d in row] for row in draft])
    q = np.array([[[1.0, 0.0]] * 2, [[1.0, 0.0]] * 2, [[0.5, 0.5]] * 2])
    accept = [[0.5, 0.5], [0.125, 0.125], [0.25, 0.75]]
    return verify_inputs(logits, draft, cand, q, [1.0] * 3, accept=accept,
                         residual=[[0.5, 0.5], [0.5, 0.5], [0.75, 0.75]],
                         bonus=[0.5, 0.6, 0.5], g=g)


def real_vocab(g, v: int = 151_936):
    """The real Qwen vocabulary (148 chunks of 1024): r0 greedy, ties {7, 151935} then
    {70000, 151000}: d = [7, 151000] → accept 7, emit 70000. r1 / r2 sampled, p = 1/4 on
    {3, 70000, 100000, 151935}: r1 rejects d = 3 and draws the residual at u = 1/2 → 100000;
    r2 accepts both and draws the bonus at u = 0.9 → 151935 (the last id)."""
    logits = _tied((3, 3, v), (3, 70000, 100000, v - 1))
    logits[0] = np.clip(g.normal(0, 1, (3, v)), -4, 4)
    logits[0, 0, [7, v - 1]] = logits[0, 1, [70000, 151000]] = logits[0, 2, 5] = 9.0
    draft = [[7, 151000], [3, 70000], [3, 70000]]
    cand = np.array([[[d, 1] for d in row] for row in draft])
    q = np.tile([1.0, 0.0], (3, 2, 1))
    return verify_inputs(logits, draft, cand, q, [0.0, 1.0, 1.0],
                         accept=[[0.5, 0.5], [0.5, 0.5], [0.125, 0.125]],
                         residual=[[0.5, 0.5]] * 3, bonus=[0.5, 0.5, 0.9], g=g)


def f32_flips(p: float, want: int, above: bool = False) -> list[tuple[float, float]]:
    """(q, u) pairs, q a float32 in (p, 1) that is not a power of two, u = (2k+1)·2^-24 on the
    lattice next to the exact threshold p/q, with float32(u·q) == p: below (the largest u with
    u·q < p, exact accept) a float32 product test rejects; above (the next u, exact reject) a
    float32 ``<=`` accepts. (The other way round cannot happen: p and u are float32 numbers
    and rounding is monotone, so a float32 product or quotient never accepts wrongly under
    the strict test.)"""
    out, q32 = [], F32(0.6 if p >= 0.5 else 0.3)
    while len(out) < want:
        q = float(q32)
        k = int(np.floor((p / q * 2 ** 24 - 1) / 2))
        while (2 * k + 1) * 2.0 ** -24 * q >= p:
            k -= 1
        u = (2 * k + 1 + 2 * above) * 2.0 ** -24
        if u < 1 and float(F32(u) * q32) == p:
            out.append((q, u))
        q32 = np.nextafter(q32, F32(1))
    return out


def f32_product_flips(g):
    """p = 1/2 (two ties) and 1/4 (four ties), q(d) not a power of two, u one lattice step from
    the exact threshold p/q with float32(u·q) == p: rows 0-4 just below it (accept; a float32
    product test rejects), rows 5-7 just above it (reject; a float32 ``<=`` accepts). After a
    rejection the residual is one token (p = 1/2) or three equal ones (p = 1/4, drawn at
    u = 1/2 → the middle one)."""
    rows = [(0.5, f) for f in f32_flips(0.5, 3)] + [(0.25, f) for f in f32_flips(0.25, 2)] + \
        [(0.5, f) for f in f32_flips(0.5, 2, True)] + [(0.25, f) for f in f32_flips(0.25, 1, True)]
    v = 11
    logits = np.full((len(rows), 2, v), NEG)
    draft, cand, q, accept = [], [], [], []
    for i, (p, (qd, u)) in enumerate(rows):
        ids = g.choice(v - 1, int(round(1 / p)), replace=False)
        logits[i, :, ids] = 0.0
        draft.append([int(ids[0])])
        cand.append([[int(ids[0]), v - 1]])                   # token V-1 has p = 0
        q.append([[qd, float(F32(1) - F32(qd))]])
        accept.append([u])
    return verify_inputs(logits, draft, np.array(cand), np.array(q), [1.0] * len(rows),
                         accept=accept, residual=[[0.5]] * len(rows), g=g)


def large_vocab(g, v: int, kinds: tuple[str, ...]):
    """One γ = 1 request per kind at a real vocabulary size (V = 151,936 Qwen, 202,048 the
    published DFlash2 draft's target), each on exact laws (equal logits, −inf elsewhere) with
    ids spread over the first, middle and last verify chunks. b, c: ids near V/2 and V − 2000.

    - "greedy": ties {9, V−1} → d = 9 accepted (lowest id); bonus argmax V − 5 → [9, V−5].
    - "plain" (no filter: the softmax-only path): p = 1/4 on {2, b, c, V−1}; d = 2 (q = 1)
      rejected at u = 1/2; residual {b, c, V−1} at u = 1/2 → c.
    - "top_k" (top_k = 2, T = 0.8, the torch.topk path): 4 ties at 0 and one token at −1; the
      ties with the k-th value are kept, so p = 1/4 on {5, b+2, c+2, V−1} (dropping a tie or
      ignoring top_k changes p); d = 5 accepted at u = 1/8; bonus at u = 0.9 → V−1.
    - "top_p" (top_k = 3, top_p = 1/2, the sorted path): 4 ties at 0, one at −1/2; top-k keeps
      the 4 ties, top-p the two lowest ids {7, b+4}; d = c+4 (p = 0) rejected; residual = p at
      u = 3/4 → b+4."""
    b, c = v // 2 + 1, v - 2000
    rows = {"greedy": ([9], 0.0, 0, 1.0, 0.5, 0.5), "plain": ([2], 1.0, 0, 1.0, 0.5, 0.5),
            "top_k": ([5], 0.8, 2, 1.0, 0.125, 0.9), "top_p": ([c + 4], 1.0, 3, 0.5, 0.5, 0.5)}
    logits = np.full((len(kinds), 2, v), NEG)
    draft, cand, params = [], [], []
    for i, kind in enumerate(kinds):
        d, t, k, p, u, bonus = rows[kind]
        if kind == "greedy":
            logits[i] = np.clip(g.normal(0, 1, (2, v)), -4, 4)
            logits[i, 0, [9, v - 1]] = logits[i, 1, v - 5] = 9.0
        elif kind == "plain":
            logits[i, :, [2, b, c, v - 1]] = 0.0
        elif kind == "top_k":
            logits[i, :, [5, b + 2, c + 2, v - 1]] = 0.0
            logits[i, :, 11] = -1.0
        else:
            logits[i, :, [7, b + 4, c + 4, v - 1]] = 0.0
            logits[i, :, 13] = -0.5
        draft.append(d)
        cand.append([[d[0], 1]])
        params.append((t, k, p, u, bonus))
    t, k, p, u, bonus = (list(x) for x in zip(*params))
    return verify_inputs(logits, draft, np.array(cand), np.tile([1.0, 0.0], (len(kinds), 1, 1)),
                         t, top_k=k, top_p=p, accept=[[x] for x in u],
                         residual=[[0.75 if kk == "top_p" else 0.5] for kk in kinds],
                         bonus=bonus, g=g)
