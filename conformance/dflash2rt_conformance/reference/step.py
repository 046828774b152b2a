"""One full speculative step in float64: prefill token, draft block, selector, verify, accept.

Weights are NumPy dicts (target and draft state_dicts); configs as in ``reference.model``. The
step mirrors docs/design.md §1: the anchor is the token sampled after the prompt (BONUS stream at
position n), the block [anchor, MASK × γ] at positions n..n+γ is embedded with the target's
embedding, the draft sees the prompt's target taps as context, the selector walks with the WALK
stream, the target verifies [anchor, d_1..d_γ] and the ACCEPT / RESIDUAL / BONUS streams decide.
``margins`` holds the smallest float64 distance of each decision to its flipping point, so a
caller can tell a real mismatch from a near-tie within its dtype's noise.
"""

from __future__ import annotations

import numpy as np

from . import rng
from .model import draft_forward, target_forward
from .sampling import softmax, target_probs
from .selector import lattice_row, select, topk_lowest_index, unary
from .verify import sample_next, verify


def top2_margin(row: np.ndarray) -> float:
    s = np.sort(np.asarray(row, np.float64))[::-1]
    return float(s[0] - s[1]) if s.size > 1 else np.inf


def cdf_margin(weights: np.ndarray, u: float) -> float:
    """Distance (as a fraction of the total) between u and the nearest CDF breakpoint."""
    cdf = np.cumsum(weights)
    return float(np.min(np.abs(cdf[:-1] / cdf[-1] - u))) if cdf.size > 1 else np.inf


def spec_step(tw: dict, tcfg: dict, dw: dict, dcfg: dict, prompt, seed: int, key: int,
              temperature: float, top_k: int, top_p: float) -> dict:
    """→ dict(anchor, draft_hidden [γ, H], draft_logits [γ, V], proj, candidates, draft, q,
    verify_logits [γ+1, V], accept_len, tokens [γ+1], margins {decision: float})."""
    n, gamma, greedy = len(prompt), dcfg["block"] - 1, temperature == 0
    samp = (np.array([temperature]), np.array([top_k]), np.array([top_p]))
    logits, taps = target_forward(tw, tcfg, prompt, dcfg["taps"])
    u0 = rng.uniforms(seed, key, n, rng.BONUS)
    anchor = int(sample_next(logits[-1:], *samp, np.array([greedy]), np.array([u0]))["token"][0])
    margins = {"prefill_argmax": top2_margin(logits[-1])}
    if not greedy:
        margins["prefill_cdf"] = cdf_margin(target_probs(logits[None, -1:], *samp)[0, 0], u0)
    ids = [anchor] + [dcfg["mask"]] * gamma
    h = draft_forward(dw, dcfg, tw["model.embed_tokens.weight"][ids], n + np.arange(gamma + 1),
                      taps, np.arange(n))
    h_e = h[1:]
    dlogits = h_e @ tw["lm_head.weight"].T
    sel_w = dcfg["selector"]
    if sel_w is None:                                   # DFlash v1: per-slot argmax
        proj, a_cb, b_cb = np.zeros((gamma, 0)), np.zeros((dlogits.shape[1], 0)), None
        k, mult, cap = 1, 1.0, None
    else:
        proj = h_e @ dw["candidate_selector.hidden_projection.weight"].T
        a_cb = dw["candidate_selector.predecessor_codebook"]
        b_cb = dw["candidate_selector.successor_codebook"]
        k, mult, cap = sel_w["top_k"], sel_w["output_multiplier"], sel_w["softcap"]
    b_cb = a_cb if b_cb is None else b_cb
    noise = rng.block_noise([seed], [key], [n], gamma)
    sel = select(dlogits[None], proj[None], [anchor], a_cb, b_cb, k, mult, cap, samp[0],
                 np.array([greedy]), noise["walk"])
    margins.update(_select_margins(dlogits, proj, anchor, a_cb, b_cb, k, mult, cap,
                                   temperature, noise["walk"][0], sel))
    seq = list(prompt) + [anchor] + [int(x) for x in sel["draft"][0]]
    vlogits = target_forward(tw, tcfg, seq)[0][n:]
    ver = verify(vlogits[None], sel["draft"], sel["candidates"], sel["q"], *samp,
                 np.array([greedy]), noise["accept"], noise["residual"], noise["bonus"])
    margins.update(_verify_margins(vlogits, sel, ver, samp, greedy, noise))
    return {"anchor": anchor, "draft_hidden": h_e, "draft_logits": dlogits, "proj": proj,
            "candidates": sel["candidates"][0], "draft": sel["draft"][0], "q": sel["q"][0],
            "verify_logits": vlogits, "accept_len": int(ver["accept_len"][0]),
            "tokens": ver["tokens"][0], "margins": margins}


def _select_margins(dlogits, proj, anchor, a_cb, b_cb, k, mult, cap, temperature, u_walk, sel):
    v = dlogits.shape[1]
    srt = -np.sort(-dlogits, axis=-1)
    m = {"topk_boundary": float(np.min(srt[:, k - 1] - srt[:, k])) if k < v else np.inf}
    vals, cand = topk_lowest_index(dlogits, k)
    un = unary(vals, mult, cap)
    prev, walk = anchor, []
    for e in range(dlogits.shape[0]):
        row = lattice_row(un[e], a_cb[prev], proj[e], b_cb[cand[e]])
        walk.append(top2_margin(row) if temperature == 0 else
                    cdf_margin(softmax(row / temperature), u_walk[e]))
        prev = int(sel["draft"][0, e])
    m["walk"] = float(min(walk))
    return m


def _verify_margins(vlogits, sel, ver, samp, greedy, noise):
    acc = int(ver["accept_len"][0])
    rows = range(min(acc + 1, vlogits.shape[0]))
    if greedy:
        return {"verify_argmax": float(min(top2_margin(vlogits[j]) for j in rows))}
    p = target_probs(vlogits[None], *samp)[0]
    d, c, q = sel["draft"][0], sel["candidates"][0], sel["q"][0]
    gaps = [abs(noise["accept"][0, j] * np.sum(q[j][c[j] == d[j]]) - p[j, d[j]])
            for j in range(min(acc + 1, len(d)))]
    return {"accept_threshold": float(min(gaps)) if gaps else np.inf,
            "emit_cdf": cdf_margin(p[acc], noise["bonus"][0]) if acc == len(d) else np.inf}
