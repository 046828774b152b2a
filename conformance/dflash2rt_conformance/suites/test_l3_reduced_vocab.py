"""A reduced draft vocabulary (speculators / EAGLE-3 ``d2t``): the draft proposes among a strict
subset S of the target's ids, its logits placed at their target ids by the runtime's mapping
(``dflash2rt.ops.vocab``, −inf at every other id), and verification stays exact.

- L1: the mapping equals the float64 NumPy reference (draft id i → target id i + d2t[i]).
- L2: the proposal law of the backend's select over the walk lattice is exactly the encoded
  draft law (exact on the quarter lattice), every proposal lies in S, and every candidate
  outside S has q = 0 (also when K exceeds |S|, so the top-K holds −inf ids).
- L3: the joint law of the first L tokens over several rounds of the backend's select + verify
  equals the target's (TV ≤ 1e-12; exact on the lattice), sampled and greedy: tokens outside S
  reach the output through the residual and bonus draws only.
``--dflash2rt-small`` (sizes.py): γ = 2, L = 2, verify once per distinct draft."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dflash2rt.errors import DFlash2Error
from dflash2rt.ops.batch import SamplingBatch
from dflash2rt.ops.selector import SelectorParams
from dflash2rt.ops.vocab import place_draft_logits, target_ids
from dflash2rt_conformance import lattice
from dflash2rt_conformance.compare import ConformanceFailure
from dflash2rt_conformance.reference import laws

V, K = 5, 3
PROMPT = (0,)
# name → (draft vocabulary S as target ids, table salt): |S| = K, and |S| < K (−inf candidates)
CASES = {"s3": ((0, 2, 3), "rv1"), "s2": ((1, 4), "rv2")}


def _d2t(ids) -> np.ndarray:
    return np.asarray(ids, np.int64) - np.arange(len(ids))


@pytest.mark.dflash2rt_level("L1")
def test_reduced_vocab_mapping_equals_reference(backend, results):
    g = np.random.default_rng(7)
    ids = np.sort(g.choice(97, 23, replace=False))
    own = g.normal(0, 2, (3, 4, 23))
    ref = np.full((3, 4, 97), -np.inf)
    ref[..., np.arange(23) + _d2t(ids)] = own                  # float64 reference: i + d2t[i]
    dev = backend.device
    logits = torch.from_numpy(own.astype(np.float32)).to(dev)     # host-side cast: no float64
    d2t = torch.from_numpy(_d2t(ids)).to(dev)                     # reaches a device without it
    with backend.run_context():
        got = place_draft_logits(logits, target_ids(d2t), 97)
    got = got.double().cpu().numpy()
    err = float(np.max(np.abs(np.where(np.isinf(ref), 0, got - ref))))
    results.metric("L1", "reduced-vocab mapping max |error|", err)
    assert np.array_equal(np.isneginf(got), np.isneginf(ref)), \
        "[L1 reduced-vocab mapping] −inf pattern differs from i + d2t[i]"
    assert err <= 2 ** -20 * 8, f"[L1 reduced-vocab mapping] max |error| {err:.3g}"


def _tables(name):
    ids, salt = CASES[name]
    return ids, *lattice.context_tables(salt, V, K, draft_ids=ids)


def _walk_law_reference(sel, ctx, gamma):
    """{draft: weight} of the encoded draft laws q(· | ctx, e, prev), prev from the anchor."""
    law = {(): 1.0}
    for e in range(gamma):
        nxt = {}
        for path, w in law.items():
            q = np.asarray(sel.q_fn(ctx, e, path[-1] if path else ctx[-1]), float)
            for c in np.flatnonzero(q > 0):
                nxt[path + (int(c),)] = nxt.get(path + (int(c),), 0.0) + w * q[c]
        law = nxt
    return law


@pytest.mark.dflash2rt_level("L2")
@pytest.mark.parametrize("name", list(CASES))
def test_reduced_vocab_proposal_law(name, backend, results, sizes):
    ids, p_fn, sel = _tables(name)
    gamma, m = sizes.l3_gamma, lattice.M_WALK
    dev = backend.device
    for ctx in [PROMPT, (0, 3, 1)]:
        walks = lattice.grid(*(m,) * gamma)
        r = len(walks)
        logits, proj = sel.inputs(ctx, gamma)

        def t(x, dt=torch.float32):
            return torch.tensor(np.asarray(x), dtype=torch.float64).to(dt).to(dev)
        try:
            out = backend.select(
                t(np.broadcast_to(logits, (r, gamma, V))),
                t(np.broadcast_to(proj, (r, gamma, V * V))),
                torch.full((r,), ctx[-1], dtype=torch.int64, device=dev), t(sel.a), t(sel.b),
                SelectorParams(K), SamplingBatch.build([1.0] * r, [0] * r, [1.0] * r, dev),
                t(lattice.midpoints(m)[walks]))
        except DFlash2Error as exc:
            raise ConformanceFailure(f"[L2 reduced-vocab case={name}] the backend raised "
                                     f"{type(exc).__name__} on lattice-exact inputs: {exc}") from exc
        draft = out.draft.cpu().numpy()
        cand, q = out.candidates.cpu().numpy(), out.q.double().cpu().numpy()
        outside = ~np.isin(cand, ids)
        assert np.isin(draft, ids).all(), f"[L2 reduced-vocab case={name}] proposals outside " \
                                          f"S={ids}: {sorted(set(draft.ravel()) - set(ids))}"
        assert (q[outside] == 0).all(), f"[L2 reduced-vocab case={name}] q > 0 on candidates " \
                                        f"outside S={ids}"
        assert outside.any() == (len(ids) < K), f"[L2 reduced-vocab case={name}] top-K"
        law = lattice.law_of(draft, np.full(r, 1.0 / r))
        ref = _walk_law_reference(sel, ctx, gamma)
        tv = float(laws.tv(law, ref))
        results.metric("L2", f"TV reduced-vocab proposal law {name} ctx={ctx}", tv)
        assert tv <= 1e-12, f"[L2 reduced-vocab case={name}] TV(proposal law, encoded law) = " \
                            f"{tv:.3g} from {ctx}; worst: {lattice.worst(law, ref)}"


def _joint(backend, sizes, name, temperature):
    ids, p_fn, sel = _tables(name)
    memo: dict = {}

    def round_law(ctx):
        if (ctx[-1], len(ctx)) not in memo:
            try:
                memo[(ctx[-1], len(ctx))] = lattice.round_law_backend(
                    backend, ctx, p_fn, sel, sizes.l3_gamma, torch.float32, temperature,
                    dedup=sizes.l3_dedup)
            except DFlash2Error as exc:
                raise ConformanceFailure(
                    f"[L3 reduced-vocab case={name}] the backend raised {type(exc).__name__} "
                    f"on lattice-exact inputs from context {ctx}: {exc}") from exc
        return memo[(ctx[-1], len(ctx))]

    return laws.joint_law(round_law, PROMPT, sizes.l3_length), p_fn, ids


@pytest.mark.dflash2rt_level("L3")
@pytest.mark.parametrize("name", list(CASES))
def test_reduced_vocab_joint_law_sampled(name, backend, results, sizes):
    law, p_fn, ids = _joint(backend, sizes, name, 1.0)
    target = laws.target_law(p_fn, PROMPT, sizes.l3_length)
    tv = float(laws.tv(law, target))
    results.metric("L3", f"TV reduced-vocab sampled {name}", tv)
    assert any(t not in ids for s in target for t in s), "tables never need a token outside S"
    assert tv <= 1e-12, f"[L3 reduced-vocab case={name}] TV = {tv:.4g} > 1e-12 against " \
                        f"target-only decoding; worst: {lattice.worst(law, target)}"


@pytest.mark.dflash2rt_level("L3")
@pytest.mark.parametrize("name", list(CASES))
def test_reduced_vocab_joint_law_greedy(name, backend, results, sizes):
    law, p_fn, _ = _joint(backend, sizes, name, 0.0)
    chain = ()
    for _ in range(sizes.l3_length):
        p = np.asarray(p_fn(PROMPT + chain), float)
        chain += (int(np.flatnonzero(p == p.max())[0]),)
    assert law == {chain: 1.0}, f"[L3 reduced-vocab greedy case={name}] law {law} ≠ {chain}"
