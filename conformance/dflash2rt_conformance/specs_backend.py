"""Op specs of the Backend methods: noise, conv (both sides), select, verify."""

from __future__ import annotations

import numpy as np
import torch

from dflash2rt.errors import InvalidInputError, NonFiniteLogitsError
from dflash2rt.ops.batch import BlockNoise, SamplingBatch
from dflash2rt.ops.selector import SelectorParams

from . import corpus, samples as S
from .harness import In
from .opspec import ALL, ErrorInput, OpSpec
from .reference import conv as r_conv, rng as r_rng, selector as r_selector, verify as r_verify

I64, F32, BOOL = torch.int64, torch.float32, torch.bool


def _sampling(t, device):
    r = len(t["temps"])
    return SamplingBatch.build(t["temps"], t.get("top_k") or [0] * r, t.get("top_p") or [1.0] * r,
                               device)


# ---- noise -------------------------------------------------------------------------------
def _make_noise(s, dtype):
    p, g = s.params, S.rng(s)
    r = p["r"]
    seeds = p.get("seeds") or list(g.integers(0, 2 ** 63 - 1, r, dtype=np.int64))
    req = p.get("req") or list(g.integers(0, 2 ** 32, r))
    pos = p.get("pos") or list(g.integers(0, 2 ** 33, r))
    return {"seed": In(seeds, "i64"), "request": In(req, "i64"), "anchor_pos": In(pos, "i64"),
            "gamma": In(p["gamma"], "obj")}


NOISE = OpSpec(
    "noise", "backend", ("float32",), S.noise_samples, _make_noise,
    lambda r: r_rng.block_noise(r["seed"], r["request"], r["anchor_pos"], r["gamma"]),
    lambda b, t: b.noise(t["seed"], t["request"], t["anchor_pos"], t["gamma"]).__dict__,
    {k: ("exact", F32) for k in ("walk", "accept", "residual", "bonus")},
    doc="Philox-4x32-10 uniforms per (seed, request, position, stream), bit for bit")


# ---- conv --------------------------------------------------------------------------------
def _make_conv(s, dtype):
    p, g = s.params, S.rng(s)
    n = p["block"] * p["r"]
    base = g.normal(0, 0.5, (p["taps"], p["h"]))
    base[0] += 1.0
    return {"x": In(g.normal(0, 1, (n, p["h"]))), "h": In(g.normal(0, 1, (n, p["h"]))),
            "base": In(base), "delta": In(g.normal(0, 0.3, (n, p["taps"], p["g"]))),
            "block": In(p["block"], "obj")}


def _conv_errors(fn_name):
    def build(shape_x, shape_base, shape_delta, block):
        def b(device):
            z = lambda sh: torch.zeros(sh, device=device)  # noqa: E731
            args = (z(shape_x), z(shape_base), z(shape_delta), block)
            if fn_name == "conv_finish":
                return lambda be: be.conv_finish(z(shape_x), *args)
            return lambda be: be.conv_prepare(*args)
        return b
    return lambda: [
        ErrorInput("rows_not_multiple_of_block", build((10, 8), (2, 8), (10, 2, 2), 3),
                   InvalidInputError, "multiple of block_size"),
        ErrorInput("base_hidden_mismatch", build((6, 8), (2, 7), (6, 2, 2), 3),
                   InvalidInputError, "base must be"),
        ErrorInput("delta_taps_mismatch", build((6, 8), (2, 8), (6, 3, 2), 3),
                   InvalidInputError, "delta must be"),
        ErrorInput("groups_do_not_divide_hidden", build((6, 8), (2, 8), (6, 2, 3), 3),
                   InvalidInputError, "groups"),
        ErrorInput("x_not_2d", build((6, 8, 1), (2, 8), (6, 2, 2), 3), InvalidInputError,
                   "conv input must be"),
    ]


CONV_PREPARE = OpSpec(
    "conv_prepare", "backend", ALL, S.conv_samples, _make_conv,
    lambda r: {"out": r_conv.conv_prepare(r["x"], r["base"], r["delta"], r["block"])},
    lambda b, t: {"out": b.conv_prepare(t["x"], t["base"], t["delta"], t["block"])},
    {"out": ("float", "x")}, errors=_conv_errors("conv_prepare"),
    doc="input side of the DFlash2 conv; taps never cross a block boundary")
CONV_FINISH = OpSpec(
    "conv_finish", "backend", ALL, S.conv_samples, _make_conv,
    lambda r: {"out": r_conv.conv_finish(r["h"], r["x"], r["base"], r["delta"], r["block"])},
    lambda b, t: {"out": b.conv_finish(t["h"], t["x"], t["base"], t["delta"], t["block"])},
    {"out": ("float", "x")}, errors=_conv_errors("conv_finish"),
    doc="output side: h + conv(a, base[1], δ[:, 1])")


# ---- select ------------------------------------------------------------------------------
def _make_select(s, dtype):
    p, g = s.params, S.rng(s)
    r, gamma, v, rank = p["r"], p["gamma"], p["v"], p["rank"]
    logits = S.random_logits(g, (r, gamma, v), ties=p.get("ties", False))
    if p.get("tail"):
        logits[..., v - p["tail"]:] = -np.inf
    if p.get("nan") is not None:
        logits[p["nan"], 1, 3] = np.nan
    anchor = g.integers(0, v, r)
    if p.get("anchor") is not None:
        anchor[:] = p["anchor"]
    pred, succ = g.normal(0, 0.7, (v, rank)), g.normal(0, 0.7, (v, rank))
    if p.get("nan_codebook") is not None:       # the anchor's codebook row: slot 0 reads it
        pred[anchor[p["nan_codebook"]], 0] = np.nan
    return {"logits": In(logits), "proj": In(g.normal(0, 1, (r, gamma, rank))),
            "anchor": In(anchor, "i64"), "pred": In(pred), "succ": In(succ),
            "u_walk": In(S.gen_uniforms(g, (r, gamma)), "f32"),
            "params": In(SelectorParams(p["k"], p["mult"], p["softcap"]), "obj"),
            "temps": In(p["temps"], "obj")}


def _ref_select(r):
    pr = r["params"]
    out = r_selector.select(r["logits"], r["proj"], r["anchor"], r["pred"], r["succ"], pr.top_k,
                            pr.output_multiplier, pr.softcap, np.asarray(r["temps"]),
                            np.asarray(r["temps"]) == 0, r["u_walk"])
    # A bad lattice row voids that request's walk; the flag itself is defined unless the
    # draft logits are bad (then the walk's first picks are not defined).
    return {**out, "_rows": ~out["bad"] & ~out["bad_lattice"], "_rows_bad_lattice": ~out["bad"]}


def _call_select(b, t):
    out = b.select(t["logits"], t["proj"], t["anchor"], t["pred"], t["succ"], t["params"],
                   _sampling(t, b.device), t["u_walk"])
    return {"draft": out.draft, "candidates": out.candidates, "q": out.q, "bad": out.bad,
            "bad_lattice": out.bad_lattice}


def _select_errors():
    def build(k=3, proj_rank=2, u_shape=(1, 2)):
        def b(device):
            logits = torch.zeros(1, 2, 5, device=device)
            proj = torch.zeros(1, 2, proj_rank, device=device)
            cb = torch.zeros(5, 2, device=device)
            samp = SamplingBatch.greedy_batch(1, device)
            anchor = torch.zeros(1, dtype=torch.int64, device=device)
            u = torch.full(u_shape, 0.5, device=device)
            return lambda be: be.select(logits, proj, anchor, cb, cb, SelectorParams(k), samp, u)
        return b
    return [ErrorInput("top_k_zero", build(k=0), InvalidInputError, "top_k"),
            ErrorInput("top_k_above_vocab", build(k=6), InvalidInputError, "top_k"),
            ErrorInput("proj_rank_mismatch", build(proj_rank=3), InvalidInputError, "shapes"),
            ErrorInput("u_walk_shape_mismatch", build(u_shape=(1, 3)), InvalidInputError,
                       "shapes")]


SELECT = OpSpec(
    "select", "backend", ALL, S.select_samples, _make_select, _ref_select, _call_select,
    {"draft": ("exact", I64), "candidates": ("exact", I64), "q": ("float", F32),
     "bad": ("exact", BOOL), "bad_lattice": ("exact", BOOL)},
    frozenset({"draft", "candidates", "q", "bad_lattice"}), _select_errors,
    doc="top-K (lowest id on ties), softcap unary, low-rank lattice, greedy / sampled walk")


# ---- verify ------------------------------------------------------------------------------
def _make_verify(s, dtype):
    c = corpus.build(s)
    return {"logits": In(c["logits"]), "draft": In(c["draft"], "i64"),
            "cand": In(c["cand"], "i64"), "q": In(c["q"], "f32"), "walk": In(c["walk"], "f32"),
            "accept": In(c["accept"], "f32"), "residual": In(c["residual"], "f32"),
            "bonus": In(c["bonus"], "f32"), "temps": In(c["temps"], "obj"),
            "top_k": In(c["top_k"], "obj"), "top_p": In(c["top_p"], "obj")}


def _ref_verify(r):
    temps = np.asarray(r["temps"], np.float64)
    temps32 = temps.astype(np.float32).astype(np.float64)     # staged as float32 by contract
    out = r_verify.verify(r["logits"], r["draft"], r["cand"], r["q"], temps32,
                          np.asarray(r["top_k"]),
                          np.asarray(r["top_p"], np.float32).astype(np.float64), temps == 0,
                          r["accept"], r["residual"], r["bonus"])
    return {**out, "_rows": ~out["bad"] & ~out["bad_q"]}


def _call_verify(b, t):
    noise = BlockNoise(t["walk"], t["accept"], t["residual"], t["bonus"])
    out = b.verify(t["logits"], t["draft"], t["cand"], t["q"], _sampling(t, b.device), noise,
                   check=False)
    return {"accept_len": out.accept_len, "tokens": out.tokens, "bad": out.bad,
            "bad_q": out.bad_q}


def _verify_errors():
    def build(kind):
        def b(device):
            logits = torch.zeros(2, 3, 5, device=device)
            draft = torch.tensor([[0, 1], [2, 3]], device=device)
            cand = draft.unsqueeze(-1).clone()
            q = torch.ones(2, 2, 1, device=device)
            samp = SamplingBatch.build([1.0, 1.0], [0, 0], [1.0, 1.0], device)
            u = torch.full((2, 2), 0.5, device=device)
            if kind == "nan":
                logits[1, 2, 4] = float("nan")
            if kind == "q_zero":
                q[1, 0, 0] = 0.0
            if kind == "shape":
                draft = draft[:, :1]
            if kind == "no_slot":
                logits, draft, cand, q = logits[:, :1], draft[:, :0], cand[:, :0], q[:, :0]
            noise = BlockNoise(u, u, u, u[:, 0])
            return lambda be: be.verify(logits, draft, cand, q, samp, noise, check=True)
        return b
    return [ErrorInput("nan_logits_raise", build("nan"), NonFiniteLogitsError, r"request\(s\) \[1\]"),
            ErrorInput("draft_with_q_zero_raises", build("q_zero"), InvalidInputError, "q = 0"),
            ErrorInput("draft_shape_mismatch", build("shape"), InvalidInputError, "shapes"),
            ErrorInput("no_draft_slot", build("no_slot"), InvalidInputError, "draft slot")]


VERIFY = OpSpec(
    "verify", "backend", ALL, corpus.corpus, _make_verify, _ref_verify, _call_verify,
    {"accept_len": ("exact", I64), "tokens": ("exact", I64), "bad": ("exact", BOOL),
     "bad_q": ("exact", BOOL)}, frozenset({"accept_len", "tokens"}), _verify_errors,
    doc="greedy and chain speculative sampling; decisions bit for bit on the adversarial corpus")
