"""Exact laws of speculative sampling: lattice enumeration (Fraction or float64) and closed form.

``enumerate_law(fn, m)`` runs ``fn(draws)`` once per assignment of the uniforms it actually
reads: each named uniform takes the m midpoints (2k+1)/(2m) with weight 1/m, discovered lazily
(a verifier that stops at the first rejection never branches on later coins). With tables whose
decision breakpoints are multiples of 1/m (``quarter_table`` with m = 4) the lattice law *is* the
continuous law, so a lossless pipeline gives TV = 0 exactly in Fractions.
"""

from __future__ import annotations

import zlib
from fractions import Fraction
from typing import Callable

import numpy as np

from .sampling import argmax_lowest, inverse_cdf
from .mutants import verify_le
from .verify import verify_greedy_row, verify_sampled_row


class _Branch(Exception):
    pass


class Draws:
    """The uniforms of one path: ``u(name)`` returns the lattice value chosen for ``name``."""

    def __init__(self, path: tuple[int, ...], m: int, exact: bool) -> None:
        self.path, self.m, self.exact, self.values = path, m, exact, {}

    def u(self, name) -> Fraction | float:
        if name not in self.values:
            i = len(self.values)
            if i >= len(self.path):
                raise _Branch
            k = self.path[i]
            self.values[name] = Fraction(2 * k + 1, 2 * self.m) if self.exact else \
                (2 * k + 1) / (2 * self.m)
        return self.values[name]


class Lazy:
    """``lazy[j]`` → ``draws.u((prefix, j))``: a noise vector read only where it is used."""

    def __init__(self, draws: Draws, prefix: str, shift=0) -> None:
        self.draws, self.prefix, self.shift = draws, prefix, shift

    def __getitem__(self, j):
        return self.draws.u((self.prefix, j)) - self.shift


def enumerate_law(fn: Callable[[Draws], tuple], m: int, exact: bool = True) -> dict:
    law: dict = {}
    stack: list[tuple[int, ...]] = [()]
    one = Fraction(1) if exact else 1.0
    while stack:
        path = stack.pop()
        try:
            out = fn(Draws(path, m, exact))
        except _Branch:
            stack.extend(path + (k,) for k in range(m))
            continue
        law[out] = law.get(out, 0 * one) + (one / m) ** len(path)
    return law


def tv(a: dict, b: dict):
    keys = set(a) | set(b)
    return sum(abs(a.get(k, 0) - b.get(k, 0)) for k in keys) / 2


def quarter_row(seed_key, v: int, exact: bool) -> np.ndarray:
    """A Dirichlet(1) row quantised to multiples of 1/4 (largest remainder; some tokens get
    p = 0), keyed by ``seed_key``. Fractions (object array) or float64."""
    rs = np.random.default_rng(zlib.crc32(repr(seed_key).encode()))
    x = rs.dirichlet(np.ones(v)) * 4
    base = np.floor(x).astype(int)
    for i in np.argsort(-(x - base))[: 4 - base.sum()]:
        base[i] += 1
    return np.array([Fraction(int(b), 4) if exact else b / 4 for b in base], dtype=object
                    if exact else np.float64)


def draft_row(seed_key, v: int, exact: bool, p: np.ndarray, k: int | None = None) -> np.ndarray:
    """A draft law on the quarter lattice, q ∈ {0, 1/4, 1/2, 1}, over at most ``k`` tokens, with
    residual mass Σ(p − q)+ ∈ {0, 1/4, 1/2, 1}: every acceptance ratio min(1, p/q) and every
    normalised residual CDF is then a multiple of 1/4 (exact on the 4-point lattice)."""
    rs = np.random.default_rng(zlib.crc32(repr(("q",) + tuple(seed_key)).encode()))
    patterns = [pt for pt in [(4,), (2, 2), (2, 1, 1), (1, 1, 1, 1)] if len(pt) <= min(k or v, v)]
    for _ in range(1000):
        pattern = patterns[rs.integers(0, len(patterns))]
        out = np.zeros(v, dtype=int)
        out[rs.permutation(v)[:len(pattern)]] = pattern
        if float(np.maximum(np.asarray(p, float) - out / 4, 0).sum()) in (0.0, .25, .5, 1.0):
            break
    return np.array([Fraction(int(b), 4) if exact else b / 4 for b in out],
                    dtype=object if exact else np.float64)


def quarter_tables(v: int, exact: bool, salt: str = "", k: int | None = None):
    """Context-dependent (p_fn(ctx), q_fn(ctx, slot)) quarter tables, memoised."""
    p_memo: dict = {}
    q_memo: dict = {}

    def p_fn(ctx: tuple) -> np.ndarray:
        if ctx not in p_memo:
            p_memo[ctx] = quarter_row((salt, "p") + ctx, v, exact)
        return p_memo[ctx]

    def q_fn(ctx: tuple, e: int) -> np.ndarray:
        if (ctx, e) not in q_memo:
            q_memo[(ctx, e)] = draft_row((salt,) + ctx + (e,), v, exact, p_fn(ctx), k)
        return q_memo[(ctx, e)]

    return p_fn, q_fn


def target_law(p_fn: Callable, prompt: tuple, length: int) -> dict:
    """P(x_1..x_L) = Π p(x_t | prompt, x_<t) over every sequence with positive mass."""
    law = {(): Fraction(1) if p_fn(prompt).dtype == object else 1.0}
    for _ in range(length):
        nxt = {}
        for seq, w in law.items():
            for x, px in enumerate(p_fn(prompt + seq)):
                if px > 0:
                    nxt[seq + (x,)] = w * px
        law = nxt
    return law


def spec_round(d: Draws, ctx: tuple, p_fn, q_fn, gamma: int, mutant=None) -> tuple:
    """One round of DFlash2 speculative sampling with the reference verifier (or a mutant)."""
    drafts, qs = [], []
    for e in range(gamma):
        q = q_fn(ctx + tuple(drafts), e)
        x = argmax_lowest(q.astype(float)) if mutant == "onehot_softmax_q" else \
            inverse_cdf(q, d.u(("walk", e)))
        drafts.append(x)
        qs.append(q)
    p = np.array([p_fn(ctx + tuple(drafts[:j])) for j in range(gamma + 1)], dtype=qs[0].dtype)
    cand = [np.arange(len(q)) for q in qs]
    u_acc = Lazy(d, "walk" if mutant == "shared_noise" else "accept")
    if mutant == "off_by_one_row":
        p = np.concatenate([p[1:], p[-1:]])
    if mutant == "le_u_zero":                       # u on the floor lattice k/m, 0 included
        half = Fraction(1, 2 * d.m) if d.exact else 0.5 / d.m
        acc, tok = verify_le(p, drafts, cand, qs, Lazy(d, "accept", half), Lazy(d, "residual"),
                             Lazy(d, "bonus"))
    else:
        acc, tok = verify_sampled_row(p, drafts, cand, qs, u_acc, Lazy(d, "residual"),
                                      Lazy(d, "bonus"))
    return tuple(drafts[:acc]) + (tok,)


def greedy_round(ctx: tuple, p_fn, q_fn, gamma: int) -> tuple:
    """Argmax drafts, greedy verification (scores = probabilities, same argmax)."""
    drafts = []
    for e in range(gamma):
        drafts.append(argmax_lowest(np.asarray(q_fn(ctx + tuple(drafts), e), float)))
    rows = np.array([np.asarray(p_fn(ctx + tuple(drafts[:j])), float) for j in range(gamma + 1)])
    acc, tok = verify_greedy_row(rows, np.array(drafts))
    return tuple(drafts[:acc]) + (tok,)


def joint_law(round_law: Callable[[tuple], dict], prompt: tuple, length: int) -> dict:
    """Law of the first ``length`` tokens over as many rounds as needed (memoised per context)."""
    memo: dict = {}

    def law_from(ctx: tuple, need: int) -> dict:
        if (ctx, need) in memo:
            return memo[(ctx, need)]
        out: dict = {}
        for seq, w in round_law(ctx).items():
            seq = seq[:need]
            if len(seq) == need:
                out[seq] = out.get(seq, 0) + w
                continue
            for rest, w2 in law_from(ctx + seq, need - len(seq)).items():
                out[seq + rest] = out.get(seq + rest, 0) + w * w2
        memo[(ctx, need)] = out
        return out

    return law_from(prompt, length)


def spec_step(d: Draws, ctx: tuple, p_fn, q_fn, block: int) -> tuple:
    """One step of block size ``block`` on the reference → (index k of the slot-0 acceptance coin
    (2k+1)/(2m), emitted tokens). Block 1 is a target-only step: one token from p(· | ctx)
    with the bonus coin (the slot-0 coin is still keyed: it exists, the step does not read it)."""
    a = d.u(("accept", 0))
    k = int(a * 2 * d.m - 1) // 2
    if block == 1:
        return k, (inverse_cdf(p_fn(ctx), d.u(("bonus", 0))),)
    return k, spec_round(d, ctx, p_fn, q_fn, block - 1)


def adaptive_joint_law(step_law: Callable[[tuple, int], dict], schedule: Callable, prompt: tuple,
                       length: int, m: int, blocks: set | None = None) -> dict:
    """Law of the first ``length`` tokens when each step's block size is
    ``schedule(history, ctx, peek)`` (``schedules.py``: history = ((block, accepted), …) of the
    earlier steps, ctx the committed tokens, peek the current step's slot-0 acceptance coin).

    ``step_law(ctx, block)`` → {(k, emitted tokens): weight}, k the index of the slot-0 coin
    on the m-point lattice; the schedule is asked once per k, so one that reads ``peek``
    is enumerated exactly too. ``blocks`` (a set) collects the block sizes chosen."""
    memo: dict = {}

    def law_from(ctx: tuple, hist: tuple, need: int) -> dict:
        if (ctx, hist, need) in memo:
            return memo[(ctx, hist, need)]
        out: dict = {}
        chosen = [schedule(hist, ctx, (2 * k + 1) / (2 * m)) for k in range(m)]
        if blocks is not None:
            blocks.update(chosen)
        laws = {b: step_law(ctx, b) for b in set(chosen)}
        for (k, seq), w in sorted(((key, w) for b in laws for key, w in laws[b].items()
                                   if chosen[key[0]] == b), key=lambda kw: kw[0]):
            nxt = hist + ((chosen[k], len(seq) - 1),)
            seq = seq[:need]
            if len(seq) == need:
                out[seq] = out.get(seq, 0) + w
                continue
            for rest, w2 in law_from(ctx + seq, nxt, need - len(seq)).items():
                out[seq + rest] = out.get(seq + rest, 0) + w * w2
        memo[(ctx, hist, need)] = out
        return out

    return law_from(prompt, (), length)


def closed_form_round(ctx: tuple, p_fn, q_fn, gamma: int) -> dict:
    """The round's law from the rule itself (accept min(1, p/q), residual norm((p−q)+), bonus p),
    in float64 for any (irrational) tables."""
    out: dict = {}

    def walk(c: tuple, j: int, w: float) -> None:
        p = np.asarray(p_fn(c), np.float64)
        if j == gamma:
            for y in np.nonzero(p > 0)[0]:
                out[c[len(ctx):] + (int(y),)] = out.get(c[len(ctx):] + (int(y),), 0.0) + w * p[y]
            return
        q = np.asarray(q_fn(c, j), np.float64)
        resid = np.maximum(p - q, 0.0)
        rej = 0.0
        for x in np.nonzero(q > 0)[0]:
            a = min(1.0, p[x] / q[x])
            walk(c + (int(x),), j + 1, w * q[x] * a)
            rej += q[x] * (1 - a)
        weights = p if resid.sum() <= 0 else resid / resid.sum()
        for y in np.nonzero(weights > 0)[0]:
            key = c[len(ctx):] + (int(y),)
            out[key] = out.get(key, 0.0) + w * rej * weights[y]

    walk(tuple(ctx), 0, 1.0)
    return out
