"""Exact induced laws of a backend's select + verify over uniform lattices (levels L2 and L3).

A lattice coordinate with m points takes the midpoints (2k+1)/(2m), each with weight 1/m; the
backend runs once per lattice point (all points batched as rows), so its law is exact for the
lattice. With quarter tables every breakpoint (walk CDF, acceptance ratio min(1, p/q)) is a
multiple of 1/4 (the tables keep the residual mass in {0, 1/4, 1/2, 1}), at least 1/8 away
from a midpoint: float32 rounding of p and q cannot move a decision, and the lattice law is the
continuous law. Residual and bonus share one coordinate (a correct verifier reads
exactly one of them per round). One block's verify law alone (level L2): ``verify_lattice``.
"""

from __future__ import annotations

import itertools
import zlib

import numpy as np
import torch

from dflash2rt.ops.batch import BlockNoise, SamplingBatch
from dflash2rt.ops import selector as ops_selector
from dflash2rt.ops.selector import SelectorParams
from dflash2rt.ops.vocab import place_draft_logits

from .reference import laws

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
    so unary scores cancel in the softmax).

    ``draft_ids`` (a reduced draft vocabulary, ascending target ids): the draft's logits are
    over those ids only and reach the selector through the runtime's mapping
    (``ops.vocab.place_draft_logits``, −inf at every other id), as ``DraftModel.logits`` does."""

    def __init__(self, v: int, k: int, q_fn, cand_fn, draft_ids=None) -> None:
        self.v, self.k, self.q_fn, self.cand_fn = v, k, q_fn, cand_fn
        self.draft_ids = None if draft_ids is None else np.asarray(draft_ids, np.int64)
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
        if self.draft_ids is not None:
            own = torch.tensor(logits[:, self.draft_ids])                 # [γ, Vd] draft ids
            logits = place_draft_logits(own, torch.tensor(self.draft_ids), v).numpy()
        return logits, proj


def context_tables(salt: str, v: int, k: int, masked: bool = False, draft_ids=None):
    """Context-dependent quarter tables keyed by (last token, position): target rows
    p(· | x_last, t) with zeros; candidates C(t) of size K; draft laws q(· | prev, t) over C(t)
    of shape {1}, {1/2, 1/2} or {1/2, 1/4, 1/4}, chosen so that the residual mass Σ(p − q)+ is
    0, 1/4, 1/2 or 1. Every walk / accept / residual breakpoint is then a multiple of 1/4.
    Level L3 (fixed and adaptive block sizes). ``masked``: the draft's walk is masked to the
    support of p (a constraint allowing exactly that support), so each q is chosen so that
    its *masked* law (q on supp p, renormalised) has those shapes and residual masses.
    ``draft_ids``: a reduced draft vocabulary (target ids): candidates and q lie among those ids
    (at most K of them; with fewer than K the rest of the top-K are −inf ids with q = 0).
    → (p_fn(ctx), SelectorTables)."""
    p_memo: dict = {}
    q_memo: dict = {}

    def rs(*key):
        return np.random.default_rng(zlib.crc32(repr((salt,) + key).encode()))

    def p_at(last, t):
        if (last, t) not in p_memo:
            p_memo[(last, t)] = laws.quarter_row((salt, "p", last, t), v, False)
        return p_memo[(last, t)]

    def p_fn(ctx):
        return p_at(ctx[-1], len(ctx))

    pool = np.arange(v) if draft_ids is None else np.asarray(draft_ids, np.int64)

    def cand_at(t):
        return np.sort(rs("C", t).choice(pool, min(k, len(pool)), replace=False))

    def q_at(prev, t):
        if (prev, t) not in q_memo:
            p, c = p_at(prev, t), cand_at(t)
            options = []
            n = len(c)
            for pattern in [(1.0,), (0.5, 0.5), (0.5, 0.25, 0.25)][:n]:
                for first in range(n):
                    q = np.zeros(v)
                    q[c[first]] = pattern[0]
                    q[[c[(first + i) % n] for i in range(1, len(pattern))]] = pattern[1:]
                    if masked:
                        if _masks_on_lattice(q, p, c):
                            options.append(q)
                    elif float(np.maximum(p - q, 0).sum()) in (0.0, 0.25, 0.5, 1.0):
                        options.append(q)
            assert options, f"L3 tables [{salt}]: no lattice-exact q for p={p} on C={c}"
            q_memo[(prev, t)] = options[rs("q", prev, t).integers(len(options))]
        return q_memo[(prev, t)]

    sel = SelectorTables(v, k, lambda ctx, e, prev: q_at(prev, len(ctx) + e),
                         lambda ctx, e: cand_at(len(ctx) + e), draft_ids)
    return p_fn, sel


def _masks_on_lattice(q: np.ndarray, p: np.ndarray, cand: np.ndarray) -> bool:
    """The law the masked walk draws from (q on supp p renormalised; q itself when no
    candidate is allowed) keeps every breakpoint on the quarter lattice: its values are
    {1}, {1/2, 1/2} or {1/2, 1/4, 1/4}, and the normalised residual (p − q')+ / mass is
    made of quarters."""
    qm = q
    if (p[cand] > 0).any():
        kept = np.where(p > 0, q, 0.0)
        if kept.sum() <= 0:
            return False                   # the walk would be uniform on allowed q = 0 ones
        qm = kept / kept.sum()
        vals = np.sort(qm[qm > 0])[::-1]
        if not any(np.array_equal(vals, t) for t in
                   (np.array([1.0]), np.array([0.5, 0.5]), np.array([0.5, 0.25, 0.25]))):
            return False
    res = np.maximum(p - qm, 0.0)
    return res.sum() == 0 or bool(np.all(np.mod(4 * res / res.sum(), 1.0) == 0))


def target_logits(p_fn, ctx: tuple, draft: np.ndarray, v: int, raw_fn=None) -> np.ndarray:
    """Verify logits [R, γ+1, V]: row j = log p(· | ctx + d_1..d_j), per lattice row
    (``raw_fn(ctx)``: the row's logits instead, e.g. ones a logit processor turns into log p)."""
    r, gamma = draft.shape
    out = np.zeros((r, gamma + 1, v))
    for j in range(gamma + 1):
        prefixes, inv = np.unique(draft[:, :j], axis=0, return_inverse=True)
        row_of = raw_fn or (lambda c: log_or_neg(np.asarray(p_fn(c), float)))
        rows = np.stack([row_of(ctx + tuple(int(x) for x in pre)) for pre in prefixes])
        out[:, j] = rows[inv.reshape(-1)]
    return out


def round_law_backend(backend, ctx: tuple, p_fn, sel: SelectorTables, gamma: int,
                      dtype: torch.dtype, temperature: float = 1.0, dedup: bool = False,
                      key_first_accept: bool = False, raw_fn=None, process=None,
                      min_p: float = 0.0, draft_side=None, limit=None) -> dict:
    """The backend's exact law of one round's emitted tokens from ``ctx`` (select + verify).

    Logit processors (``lattice_procs``): ``raw_fn(ctx)`` gives each verify row's raw logits,
    ``process(ctx, logits, draft)`` the runtime's processing of them before verify, ``min_p``
    the requests' min-p. ``draft_side(ctx, logits)`` → (draft logits, walk mask): the engine's
    draft side under a constraint, whose select is ``ops.selector.select`` with that mask (as
    ``engine.stages.select_block`` runs it on every backend). ``limit(logits)`` → (select
    width, logits): the engine's limit of each row to its own candidate count
    (``engine.candidates.limit``) before the backend's select at that width.

    ``key_first_accept``: the law of (index k of slot 0's acceptance coin (2k+1)/(2·M_ACCEPT),
    emitted tokens) instead, so that a schedule that (wrongly) reads the current step's first
    acceptance coin can be enumerated exactly (level L3, adaptive block sizes).

    ``dedup`` (``--dflash2rt-small``): select runs on the walk lattice alone and verify once per
    distinct select output × (accept, residual) lattice, weighted by how many walk points gave
    it. Verify gets the walk noise of the first of those points, so a verifier that reads the
    walk stream still sees it vary across drafts (and fails); for any other verifier the law is
    the full lattice's, on far fewer rows."""
    m_walk, m_acc, m_res = (1, 1, 1) if temperature == 0 else (M_WALK, M_ACCEPT, M_RESIDUAL)
    walks, coins = grid(*(m_walk,) * gamma), grid(*(m_acc,) * gamma, m_res)
    if not dedup:                              # every (walk, accept, residual) point, one row each
        walks, coins = np.repeat(walks, len(coins), 0), np.tile(coins, (len(walks), 1))
    r = len(walks)
    u_walk = midpoints(m_walk)[walks]
    t = _to_device(backend.device, dtype)
    out = _select(backend, ctx, sel, gamma, temperature, u_walk, t, draft_side, limit)
    rows, count, total = np.arange(r), np.ones(r, np.int64), r    # row weight = count / total
    if dedup:                                  # one coin block per distinct select output
        rows, count, total, coins = _distinct_selects(out, r, coins)
    u_coins = (midpoints(m_acc)[coins[:, :gamma]], midpoints(m_res)[coins[:, gamma]])
    tokens = _verify(backend, ctx, p_fn, sel.v, gamma, out, rows, u_walk[rows], u_coins, t,
                     temperature, min_p, raw_fn, process)
    if key_first_accept:
        tokens = np.concatenate([coins[:, :1], tokens], 1)
        law = {(k[0], k[1:]): c for k, c in law_of(tokens, count).items()}
    else:
        law = law_of(tokens, count)
    return {k: c / total for k, c in law.items()}


def _to_device(dev, dtype: torch.dtype):
    """x → a tensor on ``dev`` of dtype ``dt`` (default ``dtype``), through float64."""
    def t(x, dt=dtype):
        return torch.tensor(np.asarray(x), dtype=torch.float64).to(dt).to(dev)
    return t


def _select(backend, ctx: tuple, sel: SelectorTables, gamma: int, temperature: float,
            u_walk: np.ndarray, t, draft_side, limit=None):
    """The backend's select on every walk row (``draft_side``: the engine's constrained draft
    side, then ``ops.selector.select`` with its walk mask; ``limit``: the rows' candidate
    counts, then the backend's select at their width)."""
    dev, v, r = backend.device, sel.v, len(u_walk)
    logits, proj = sel.inputs(ctx, gamma)
    args = (t(np.broadcast_to(logits, (r, gamma, v))),
            t(np.broadcast_to(proj, (r, gamma, v * v))),
            torch.full((r,), ctx[-1], dtype=torch.int64, device=dev),
            t(sel.a), t(sel.b), SelectorParams(sel.k),
            SamplingBatch.build([temperature] * r, [0] * r, [1.0] * r, dev),
            t(u_walk, torch.float32))
    if limit is not None:
        width, x = limit(args[0])
        return backend.select(x, *args[1:5], SelectorParams(width), *args[6:])
    if draft_side is None:
        return backend.select(*args)
    x, mask = draft_side(ctx, args[0])
    with backend.run_context():
        return ops_selector.select(x, *args[1:], has_fp64=backend.has_fp64, mask=mask)


def _distinct_selects(out, r: int, coins: np.ndarray):
    """``dedup``: the first row of each distinct select output (draft, candidates, q), repeated
    once per coin point, with its walk count → (rows, count, total, coins)."""
    key = np.concatenate([x.cpu().numpy().reshape(r, -1) for x in
                          (out.draft, out.candidates, out.q.view(torch.int32))], 1)
    _, first, counts = np.unique(key, axis=0, return_index=True, return_counts=True)
    n = len(coins)
    return (np.repeat(first, n), np.repeat(counts, n), r * n,
            np.tile(coins, (len(first), 1)))


def _verify(backend, ctx: tuple, p_fn, v: int, gamma: int, out, rows: np.ndarray,
            u_walk: np.ndarray, u_coins: tuple, t, temperature: float, min_p: float,
            raw_fn, process) -> np.ndarray:
    """The backend's verify of select rows ``rows`` against the target's law after ``ctx``,
    with walk noise ``u_walk`` and (acceptance, residual) coins ``u_coins`` → emitted tokens
    [n, γ + 1] (−1 after the last emitted one)."""
    dev = backend.device
    sel_rows = torch.tensor(rows, device=dev)
    draft, cand, q = out.draft[sel_rows], out.candidates[sel_rows], out.q[sel_rows]
    u_acc, u_res = u_coins
    vlog = t(target_logits(p_fn, ctx, draft.cpu().numpy(), v, raw_fn))
    if process is not None:
        vlog = process(ctx, vlog, draft)
    res = t(np.repeat(u_res[:, None], gamma, 1), torch.float32)
    noise = BlockNoise(t(u_walk, torch.float32), t(u_acc, torch.float32), res,
                       t(u_res, torch.float32))
    n = len(rows)
    sampling = SamplingBatch.build([temperature] * n, [0] * n, [1.0] * n, dev, [min_p] * n)
    ver = backend.verify(vlog, draft, cand, q, sampling, noise, check=True)
    return ver.tokens.cpu().numpy()


def target_only_law_backend(backend, ctx: tuple, p_fn, dtype: torch.dtype,
                            temperature: float = 1.0) -> dict:
    """The exact law of a target-only step (block size 1) from ``ctx``: the runtime's
    ``ops.verify.sample_next`` (what the engine calls for it) inside ``backend.run_context()``
    on the target row of ``ctx``, over the bonus lattice (the stream a target-only step reads).
    → {(token,): weight}."""
    from dflash2rt.ops.verify import sample_next
    dev, m = backend.device, 1 if temperature == 0 else M_RESIDUAL
    row = log_or_neg(np.asarray(p_fn(ctx), float))
    logits = torch.tensor(np.broadcast_to(row, (m, len(row))).copy(),
                          dtype=torch.float64).to(dtype).to(dev)
    u = torch.tensor(midpoints(m), dtype=torch.float64).to(torch.float32).to(dev)
    sampling = SamplingBatch.build([temperature] * m, [0] * m, [1.0] * m, dev)
    with backend.run_context():
        token, bad = sample_next(logits, sampling, u)
    if bool(bad.any()):
        raise AssertionError(f"target-only step from {ctx}: sample_next flagged a lattice-exact "
                             f"row bad: {bad.cpu().tolist()}")
    return {k: c / m for k, c in law_of(token.cpu().numpy().reshape(m, 1), np.ones(m)).items()}


def worst(law: dict, target: dict, n: int = 5) -> str:
    keys = sorted(set(law) | set(target), key=lambda k: -abs(law.get(k, 0) - target.get(k, 0)))
    return "; ".join(f"{k}: backend {law.get(k, 0):.6g} vs expected "
                     f"{float(target.get(k, 0)):.6g}" for k in keys[:n])


def law_of(tokens: np.ndarray, weight: np.ndarray) -> dict:
    law: dict = {}
    for row, w in zip(tokens, weight):
        key = tuple(int(x) for x in row if x >= 0)
        law[key] = law.get(key, 0.0) + w
    return law


def check_processed_joint_law(backend, results, sizes, prompt: tuple, p_fn, sel, raw_fn,
                              process, ref_p, temperature: float, label: str, name: str,
                              under: str, min_p: float = 0.0, draft_side=None) -> None:
    """L3 for a step whose verify rows are processed (``process``; logit processors,
    constraint masks) and whose inputs depend on the whole output so far: the backend's joint
    law of the first ``sizes.l3_length`` tokens equals the reference chain (greedy) or, within
    TV 1e-12, target-only decoding of ``ref_p`` (sampled); ``min_p`` is every request's min-p
    (``ref_p`` must already apply it); ``draft_side``: see ``round_law_backend``. Failures
    start with
    ``[L3 {label} case={name}]`` (``[L3 {label} greedy case=...]``)."""
    memo: dict = {}

    def round_law(ctx):
        if ctx not in memo:
            memo[ctx] = round_law_backend(
                backend, ctx, p_fn, sel, sizes.l3_gamma, torch.float32, temperature,
                dedup=sizes.l3_dedup, raw_fn=raw_fn, process=process, min_p=min_p,
                draft_side=draft_side)
        return memo[ctx]

    law = laws.joint_law(round_law, prompt, sizes.l3_length)
    if temperature == 0:
        chain = ()
        for _ in range(sizes.l3_length):
            p = ref_p(prompt + chain)
            chain += (int(np.flatnonzero(p == p.max())[0]),)
        assert law == {chain: 1.0}, f"[L3 {label} greedy case={name}] law {law} ≠ {chain}"
        return
    target = laws.target_law(ref_p, prompt, sizes.l3_length)
    tv = float(laws.tv(law, target))
    results.metric("L3", f"TV {label} {name}", tv)
    assert tv <= 1e-12, f"[L3 {label} case={name}] TV = {tv:.4g} > 1e-12 against target-only " \
                        f"decoding under the same {under}; worst: {worst(law, target)}"
