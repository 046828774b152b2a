"""The candidate selector in float64: top-K (lowest index on ties), unary, lattice, walk.

    unary[e, c] = softcap(val[e, c] · output_multiplier)       softcap(l) = cap · tanh(l / cap)
    S[e, p, c]  = unary[e, c] + Σ_r A[pred(e, p), r] · P_e[r] · Bc[cand[e, c], r]
    pred(0, ·)  = anchor,  pred(e, p) = cand[e-1, p]

Walk: greedy → argmax (lowest index on ties), q one-hot; sampled → q = softmax(row / T), index
by inverse CDF with the slot's walk uniform. ``bad_lattice``: a row the walk read holds NaN /
+inf or no finite entry (that request's draft and q carry no meaning).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .constraints import mask_row, walk
from .sampling import argmax_lowest, bad_rows, inverse_cdf, softmax


def _masked(row: np.ndarray, cand: np.ndarray, table: np.ndarray, state: int) -> np.ndarray:
    """A lattice row [K] with the candidates ``state`` forbids at −inf (unmasked when it
    forbids every candidate that scores above −inf)."""
    full = np.zeros(table.shape[1])
    ok = np.isfinite(mask_row(full, table, state))[cand] & (row > -np.inf)
    return row if not ok.any() else np.where(ok, row, -np.inf)


def limit(logits: np.ndarray, counts: Sequence[int]) -> np.ndarray:
    """Draft logits [R, γ, V] with every entry outside row r's top ``counts[r]`` (lowest id on
    ties) at −inf: a request's own candidate count (``engine.candidates``); rows holding NaN or
    +inf are left as they are."""
    x = np.array(logits, dtype=np.float64)
    out = np.full_like(x, -np.inf)
    for i, k in enumerate(counts):
        _, cand = topk_lowest_index(x[i], int(k))
        np.put_along_axis(out[i], cand, np.take_along_axis(x[i], cand, -1), -1)
    bad = bad_rows(x)
    return np.where(bad[..., None], x, out)


def draft_logits(logits: np.ndarray, table: np.ndarray, state: Sequence[int]) -> np.ndarray:
    """Draft logits [R, γ, V] → the candidate sets' logits under a token automaton: slot 0
    masked with each request's committed state, later slots with the tokens the automaton
    allows at some state; a row left with nothing allowed stays unmasked."""
    x = np.array(logits, dtype=np.float64)
    ever = (table >= 0).any(0)
    for i, s in enumerate(state):
        x[i, 0] = mask_row(x[i, 0], table, int(s))
        if ever.any():
            x[i, 1:] = np.where(ever, x[i, 1:], -np.inf)
    return x


def topk_lowest_index(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """[..., V] → (values, ids) [..., k]: descending value, lower id first among equal values."""
    flat = logits.reshape(-1, logits.shape[-1])
    ids = np.stack([np.lexsort((np.arange(row.size), -row))[:k] for row in flat])
    vals = np.take_along_axis(flat, ids, -1)
    return vals.reshape(*logits.shape[:-1], k), ids.reshape(*logits.shape[:-1], k)


def unary(vals: np.ndarray, output_multiplier: float, softcap: float | None) -> np.ndarray:
    """softcap(val · multiplier); −inf candidates stay −inf."""
    x = np.asarray(vals, dtype=np.float64) * output_multiplier
    if softcap is not None:
        x = softcap * np.tanh(x / softcap)
    return np.where(np.isneginf(vals), -np.inf, x)


def lattice_row(unary_e: np.ndarray, pred_vec: np.ndarray, proj_e: np.ndarray,
                succ: np.ndarray) -> np.ndarray:
    """One row of S: unary_e [K] + Σ_r A[prev, r] · P_e[r] · Bc[cand_c, r] (succ = Bc[cand] [K, r])."""
    return unary_e + succ @ (pred_vec * proj_e)


def walk_step(row: np.ndarray, greedy: bool, temperature: float, u: float
              ) -> tuple[int, np.ndarray]:
    """(chosen candidate index, q [K]) for one slot (a bad row: index 0, q of no meaning)."""
    if bad_rows(row):
        return 0, np.zeros(row.shape[0])
    if greedy:
        idx = argmax_lowest(row)
        q = np.zeros(row.shape[0])
        q[idx] = 1.0
        return idx, q
    q = softmax(row / temperature)
    return inverse_cdf(q, u), q


def select(logits, proj, anchor, pred_codebook, succ_codebook, top_k: int,
           output_multiplier: float, softcap: float | None, temperature, greedy, u_walk,
           table: np.ndarray | None = None, state=None) -> dict:
    """logits [R, γ, V], proj [R, γ, r], anchor [R], codebooks [V, r], per-request temperature,
    greedy [R], u_walk [R, γ] → dict(draft [R, γ], candidates [R, γ, K], q [R, γ, K], bad [R]).

    ``table`` [S, V] / ``state`` [R] (a token automaton and each request's committed state):
    the walk under the constraint — slot e reads its lattice row with the candidates that the
    state after the path so far forbids at −inf (``reference.constraints.mask_row``: nothing
    masked at a dead end or after a forbidden token, nor where every candidate that scores above
    −inf is forbidden),
    and q is that masked row's law. (The candidate sets come from ``logits`` as given: the
    runtime masks the draft logits first, ``constraints.draft_logits``.)"""
    logits = np.asarray(logits, dtype=np.float64)
    r, gamma, _ = logits.shape
    vals, cand = topk_lowest_index(logits, top_k)
    un = unary(vals, output_multiplier, softcap)
    draft = np.zeros((r, gamma), dtype=np.int64)
    q_all = np.zeros((r, gamma, top_k))
    bad_lattice = np.zeros(r, dtype=bool)
    for i in range(r):
        prev = int(anchor[i])
        s = None if table is None else int(state[i])
        for e in range(gamma):
            row = lattice_row(un[i, e], pred_codebook[prev], proj[i, e], succ_codebook[cand[i, e]])
            bad_lattice[i] |= bool(bad_rows(row))
            if s is not None:
                row = _masked(row, cand[i, e], table, s)
                bad_lattice[i] |= bool(bad_rows(row))
            idx, q_all[i, e] = walk_step(row, bool(greedy[i]), float(temperature[i]),
                                         float(u_walk[i, e]))
            prev = int(cand[i, e, idx])
            draft[i, e] = prev
            if s is not None:
                s = walk(table, s, (prev,))
    return {"draft": draft, "candidates": cand, "q": q_all,
            "bad": bad_rows(logits).any(-1), "bad_lattice": bad_lattice}
