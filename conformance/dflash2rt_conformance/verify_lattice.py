"""Exact law of a backend's verify over a uniform lattice for one block (level L2): every
draft over each slot's candidates (weighted by q) × accept / residual coins on midpoint lattices
(``lattice.midpoints``), one row each, against the float64 reference on the same lattice."""

from __future__ import annotations

import itertools

import numpy as np
import torch

from dflash2rt.ops.batch import BlockNoise, SamplingBatch

from .lattice import grid, law_of, midpoints
from .reference.sampling import target_probs
from .reference.verify import verify_sampled_row


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


def verify_law_backend(backend, logits, cand, q, temperature, top_k, top_p, dtype,
                       m_acc: int, m_res: int) -> dict:
    """The backend verifier's exact law of emitted tokens on the lattice (one request)."""
    draft, uw, ua, ur, w = verify_rows(cand, q, m_acc, m_res)
    r, gamma = draft.shape
    dev = backend.device

    def f32(x):
        return torch.tensor(np.asarray(x), dtype=torch.float32, device=dev)

    def rep(x):                                # the same block on every lattice row
        return np.broadcast_to(x, (r, *np.shape(x))).copy()

    sampling = SamplingBatch.build([temperature] * r, [top_k] * r, [top_p] * r, dev)
    noise = BlockNoise(f32(uw), f32(ua), f32(np.repeat(ur[:, None], gamma, 1)), f32(ur))
    out = backend.verify(torch.tensor(rep(logits), dtype=torch.float64).to(dtype).to(dev),
                         torch.tensor(draft, device=dev), torch.tensor(rep(cand), device=dev),
                         f32(rep(q)), sampling, noise, check=True)
    return law_of(out.tokens.cpu().numpy(), w)


def verify_law_reference(logits, cand, q, temperature, top_k, top_p, m_acc: int,
                         m_res: int) -> dict:
    """The float64 reference verifier's law on the same lattice."""
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
