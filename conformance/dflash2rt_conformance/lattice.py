"""Exact induced laws of a backend's select + verify over uniform lattices (levels L2 and L3).

A lattice coordinate with m points takes the midpoints (2k+1)/(2m), each with weight 1/m; the
backend runs once per lattice point (all points batched as rows), so its law is exact for the
lattice. With quarter tables every breakpoint (walk CDF, acceptance ratio min(1, p/q)) is a
multiple of 1/4 (the tables keep the residual mass in {0, 1/4, 1/2, 1}), at least 1/8 away
from a midpoint: float32 rounding of p and q cannot move a decision, and the lattice law is the
continuous law. Residual and bonus share one coordinate (a correct verifier reads
exactly one of them per round).
"""

from __future__ import annotations

import itertools

import numpy as np
import torch

from dflash2rt.ops.batch import BlockNoise, SamplingBatch
from dflash2rt.ops.selector import SelectorParams

NEG = -1.0e4            # log 0 for lattice scores: exp underflows to exactly 0 in float32
M_WALK = M_ACCEPT = 4
M_RESIDUAL = 4


def midpoints(m: int) -> np.ndarray:
    return (2 * np.arange(m) + 1) / (2 * m)


def grid(*sizes: int) -> np.ndarray:
    """All index combinations [Π sizes, len(sizes)]."""
    return np.array(list(itertools.product(*[range(s) for s in sizes])), dtype=np.int64)


def log_or_neg(p: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.where(p > 0, np.log(np.where(p > 0, p, 1.0)), -np.inf)


class SelectorTables:
    """Encodes draft laws q(· | ctx, slot e, prev) exactly in the selector's low-rank lattice:
    rank V², A[x] = one-hot block of x, Bc[c] = e_{i·V+c} for every i, P_e[prev·V + c] =
    log q(c | ctx, e, prev); the draft logits make the candidate set C(ctx, e) (equal logits,
    so unary scores cancel in the softmax)."""

    def __init__(self, v: int, k: int, q_fn, cand_fn) -> None:
        self.v, self.k, self.q_fn, self.cand_fn = v, k, q_fn, cand_fn
        self.a = np.zeros((v, v * v))
        self.b = np.zeros((v, v * v))
        for x in range(v):
            self.a[x, x * v:(x + 1) * v] = 1.0
            self.b[x, x::v] = 1.0

    def inputs(self, ctx: tuple, gamma: int) -> tuple[np.ndarray, np.ndarray]:
        """→ draft logits [γ, V], proj [γ, V²] for a round starting at ``ctx``."""
        v = self.v
        logits = np.full((gamma, v), -2.0)
        proj = np.full((gamma, v * v), NEG)
        for e in range(gamma):
            cset = self.cand_fn(ctx, e)
            logits[e, cset] = 2.0
            for prev in range(v):
                q = np.asarray(self.q_fn(ctx, e, prev), float)
                assert set(np.flatnonzero(q > 0)) <= set(cset), "q outside its candidates"
                proj[e, prev * v:(prev + 1) * v] = np.maximum(log_or_neg(q), NEG)
        return logits, proj


def target_logits(p_fn, ctx: tuple, draft: np.ndarray, v: int) -> np.ndarray:
    """Verify logits [R, γ+1, V]: row j = log p(· | ctx + d_1..d_j), per lattice row."""
    r, gamma = draft.shape
    out = np.zeros((r, gamma + 1, v))
    for j in range(gamma + 1):
        prefixes, inv = np.unique(draft[:, :j], axis=0, return_inverse=True)
        rows = np.stack([log_or_neg(np.asarray(p_fn(ctx + tuple(int(x) for x in pre)), float))
                         for pre in prefixes])
        out[:, j] = rows[inv.reshape(-1)]
    return out


def round_law_backend(backend, ctx: tuple, p_fn, sel: SelectorTables, gamma: int,
                      dtype: torch.dtype, temperature: float = 1.0, dedup: bool = False) -> dict:
    """The backend's exact law of one round's emitted tokens from ``ctx`` (select + verify).

    ``dedup`` (``--dflash2rt-small``): select runs on the walk lattice alone and verify once per
    distinct select output × (accept, residual) lattice, weighted by how many walk points gave
    it. Verify gets the walk noise of the first of those points, so a verifier that reads the
    walk stream still sees it vary across drafts (and fails); for any other verifier the law is
    the full lattice's, on far fewer rows."""
    dev, v = backend.device, sel.v
    m_walk, m_acc, m_res = (1, 1, 1) if temperature == 0 else (M_WALK, M_ACCEPT, M_RESIDUAL)
    walks, coins = grid(*(m_walk,) * gamma), grid(*(m_acc,) * gamma, m_res)
    if not dedup:                              # every (walk, accept, residual) point, one row each
        walks, coins = np.repeat(walks, len(coins), 0), np.tile(coins, (len(walks), 1))
    r = len(walks)
    u_walk = midpoints(m_walk)[walks]
    logits, proj = sel.inputs(ctx, gamma)
    t = lambda x, dt=dtype: torch.tensor(np.asarray(x), dtype=torch.float64).to(dt).to(dev)  # noqa: E731
    out = backend.select(t(np.broadcast_to(logits, (r, gamma, v))),
                         t(np.broadcast_to(proj, (r, gamma, v * v))),
                         torch.full((r,), ctx[-1], dtype=torch.int64, device=dev),
                         t(sel.a), t(sel.b), SelectorParams(sel.k),
                         SamplingBatch.build([temperature] * r, [0] * r, [1.0] * r, dev),
                         t(u_walk, torch.float32))
    rows, count, total = np.arange(r), np.ones(r, np.int64), r    # row weight = count / total
    if dedup:                                  # one coin block per distinct select output
        key = np.concatenate([x.cpu().numpy().reshape(r, -1) for x in
                              (out.draft, out.candidates, out.q.view(torch.int32))], 1)
        _, first, counts = np.unique(key, axis=0, return_index=True, return_counts=True)
        n = len(coins)
        rows, count, total = np.repeat(first, n), np.repeat(counts, n), r * n
        coins = np.tile(coins, (len(first), 1))
    sel_rows = torch.tensor(rows, device=dev)
    draft, cand, q = out.draft[sel_rows], out.candidates[sel_rows], out.q[sel_rows]
    u_acc = midpoints(m_acc)[coins[:, :gamma]]
    u_res = midpoints(m_res)[coins[:, gamma]]
    vlog = t(target_logits(p_fn, ctx, draft.cpu().numpy(), v))
    res = t(np.repeat(u_res[:, None], gamma, 1), torch.float32)
    noise = BlockNoise(t(u_walk[rows], torch.float32), t(u_acc, torch.float32), res,
                       t(u_res, torch.float32))
    n = len(rows)
    sampling = SamplingBatch.build([temperature] * n, [0] * n, [1.0] * n, dev)
    ver = backend.verify(vlog, draft, cand, q, sampling, noise, check=True)
    law = law_of(ver.tokens.cpu().numpy(), count)         # tokens are −1 after the emitted one
    return {k: c / total for k, c in law.items()}


def worst(law: dict, target: dict, n: int = 5) -> str:
    keys = sorted(set(law) | set(target), key=lambda k: -abs(law.get(k, 0) - target.get(k, 0)))
    return "; ".join(f"{k}: backend {law.get(k, 0):.6g} vs expected "
                     f"{float(target.get(k, 0)):.6g}" for k in keys[:n])


def walk_point(cand: np.ndarray, q: np.ndarray, token: int) -> float:
    """A walk uniform that draws ``token`` from (cand, q) by inverse CDF: the float32 midpoint
    of its first interval (the draft's own randomness, unlike any acceptance coin)."""
    k = int(np.flatnonzero((cand == token) & (q > 0))[0])
    return float(np.float32((q[:k].sum() + q[k] / 2) / q.sum()))


def verify_rows(cand: np.ndarray, q: np.ndarray, m_acc: int, m_res: int):
    """Every (draft, accept coins, residual coin) of one block: drafts over each slot's
    candidates weighted by q (duplicates summed), coins on midpoint lattices →
    (draft [R, γ], u_walk [R, γ], u_accept [R, γ], u_residual [R], weight [R]). ``u_walk`` is
    the uniform that drew each draft token (``walk_point``): never an acceptance coin, so a
    verifier that reads the walk stream for its coins gets coins tied to the draft and fails."""
    gamma = cand.shape[0]
    choices = []
    for j in range(gamma):
        toks = sorted({int(c) for c, w in zip(cand[j], q[j]) if w > 0})
        choices.append([(t, float(q[j][cand[j] == t].sum())) for t in toks])
    drafts = list(itertools.product(*choices))
    coins = grid(*(m_acc,) * gamma, m_res)
    rows_d, rows_w, rows_a, rows_r, weight = [], [], [], [], []
    for d in drafts:
        w = float(np.prod([x[1] for x in d])) / len(coins)
        rows_d.append(np.tile([x[0] for x in d], (len(coins), 1)))
        rows_w.append(np.tile([walk_point(cand[j], q[j], x[0]) for j, x in enumerate(d)],
                              (len(coins), 1)))
        rows_a.append(midpoints(m_acc)[coins[:, :gamma]])
        rows_r.append(midpoints(m_res)[coins[:, gamma]])
        weight.append(np.full(len(coins), w))
    return (np.concatenate(rows_d), np.concatenate(rows_w), np.concatenate(rows_a),
            np.concatenate(rows_r), np.concatenate(weight))


def law_of(tokens: np.ndarray, weight: np.ndarray) -> dict:
    law: dict = {}
    for row, w in zip(tokens, weight):
        key = tuple(int(x) for x in row if x >= 0)
        law[key] = law.get(key, 0.0) + w
    return law


def verify_law_backend(backend, logits, cand, q, temperature, top_k, top_p, dtype,
                       m_acc: int, m_res: int) -> dict:
    """The backend verifier's exact law of emitted tokens on the lattice (one request)."""
    draft, uw, ua, ur, w = verify_rows(cand, q, m_acc, m_res)
    r, gamma = draft.shape
    dev = backend.device
    f32 = lambda x: torch.tensor(np.asarray(x), dtype=torch.float32, device=dev)  # noqa: E731
    rep = lambda x: np.broadcast_to(x, (r, *np.shape(x))).copy()  # noqa: E731
    sampling = SamplingBatch.build([temperature] * r, [top_k] * r, [top_p] * r, dev)
    noise = BlockNoise(f32(uw), f32(ua), f32(np.repeat(ur[:, None], gamma, 1)), f32(ur))
    out = backend.verify(torch.tensor(rep(logits), dtype=torch.float64).to(dtype).to(dev),
                         torch.tensor(draft, device=dev), torch.tensor(rep(cand), device=dev),
                         f32(rep(q)), sampling, noise, check=True)
    return law_of(out.tokens.cpu().numpy(), w)


def verify_law_reference(logits, cand, q, temperature, top_k, top_p, m_acc: int,
                         m_res: int) -> dict:
    """The float64 reference verifier's law on the same lattice."""
    from .reference.sampling import target_probs
    from .reference.verify import verify_sampled_row

    draft, _, ua, ur, w = verify_rows(cand, q, m_acc, m_res)
    p = target_probs(logits[None], np.array([temperature]), np.array([top_k]),
                     np.array([top_p]))[0]
    toks = np.full((len(draft), draft.shape[1] + 1), -1)
    for i in range(len(draft)):
        acc, tok = verify_sampled_row(p, draft[i], cand, q, ua[i], [ur[i]] * draft.shape[1],
                                      [ur[i]])
        toks[i, :acc] = draft[i, :acc]
        toks[i, acc] = tok
    return law_of(toks, w)
