"""Op specs of the dflash2rt.ops functions every engine path runs on the backend's device:
target_probs, inverse_cdf, topk_lowest_index, unary_scores, sample_next, and the sampling
parameter checks."""

from __future__ import annotations

import numpy as np
import torch

from dflash2rt.errors import SamplingParamsError
from dflash2rt.ops import sampling as t_sampling, selector as t_selector, verify as t_verify
from dflash2rt.ops.batch import SamplingBatch
from dflash2rt.ops.selector import SelectorParams

from . import samples as S
from .harness import In
from .opspec import ALL, ErrorInput, OpSpec
from .reference import sampling as r_sampling, selector as r_selector, verify as r_verify

I64, F32, F64, BOOL = torch.int64, torch.float32, torch.float64, torch.bool


def _f32(x):
    return np.asarray(x, np.float32).astype(np.float64)


def _make_probs(s, dtype):
    p, g = s.params, S.rng(s)
    shape = (p["r"], p["t"], p["v"])
    logits = S.tied_logits(g, shape, p["tied"]) if p.get("tied") else \
        S.random_logits(g, shape, ties=p["ties"])
    u = np.full(p["r"], 1 - 2.0 ** -24) if p.get("u_max") else S.gen_uniforms(g, (p["r"],))
    return {"logits": In(logits), "temps": In(p["temps"], "obj"), "top_k": In(p["top_k"], "obj"),
            "top_p": In(p["top_p"], "obj"), "u": In(u, "f32")}


def _sb(t, device):
    return SamplingBatch.build(t["temps"], t["top_k"], t["top_p"], device)


TARGET_PROBS = OpSpec(
    "target_probs", "device", ALL, S.probs_samples, _make_probs,
    lambda r: {"p": r_sampling.target_probs(r["logits"], _f32(r["temps"]), np.asarray(r["top_k"]),
                                            _f32(r["top_p"]))},
    lambda b, t: (lambda s: {"p": t_sampling.target_probs(t["logits"], s.temperature, s.top_k,
                                                          s.top_p)})(_sb(t, b.device)),
    {"p": ("float", F32)}, doc="temperature → top-k (ties kept) → top-p, float32 probabilities")


def _ref_sample_next(r):
    temps = np.asarray(r["temps"], np.float64)
    out = r_verify.sample_next(r["logits"][:, 0], _f32(temps), np.asarray(r["top_k"]),
                               _f32(r["top_p"]), temps == 0, r["u"])
    return {**out, "_rows": ~out["bad"]}


def _call_sample_next(b, t):
    tok, bad = t_verify.sample_next(t["logits"][:, 0], _sb(t, b.device), t["u"])
    return {"token": tok, "bad": bad}


SAMPLE_NEXT = OpSpec(
    "sample_next", "device", ALL, S.probs_samples, _make_probs, _ref_sample_next,
    _call_sample_next, {"token": ("exact", I64), "bad": ("exact", BOOL)}, frozenset({"token"}),
    doc="one token per request after prefill / in target-only decoding")


def _icdf_samples():
    return [S.Sample("batch1_v5", 600, dict(r=1, v=5)),
            S.Sample("zeros_and_tail_v37", 601, dict(r=9, v=37, zeros=True)),
            S.Sample("u_near_one_v61", 602, dict(r=5, v=61, zeros=True, near_one=True)),
            S.Sample("v1000", 603, dict(r=17, v=1000, zeros=True), "exhaustive")]


def _make_icdf(s, dtype):
    p, g = s.params, S.rng(s)
    w = g.dirichlet(np.ones(p["v"]), p["r"])
    if p.get("zeros"):
        w[g.random(w.shape) < 0.4] = 0.0
        w[:, -max(1, p["v"] // 5):] = 0.0                   # trailing zeros: the clamp case
        w[:, 0] += 1e-3
    u = S.gen_uniforms(g, (p["r"],))
    if p.get("near_one"):
        u[:] = 1 - 2.0 ** -24
    return {"w": In(w, "f64"), "u": In(u, "f64")}


INVERSE_CDF = OpSpec(
    "inverse_cdf", "device", ("float64",), _icdf_samples, _make_icdf,
    lambda r: {"idx": np.array([r_sampling.inverse_cdf(w, u) for w, u in zip(r["w"], r["u"])])},
    lambda b, t: {"idx": t_sampling.inverse_cdf(t["w"], t["u"])},
    {"idx": ("exact", I64)}, doc="first index with cdf > u·total, clamped to the last positive")


def _topk_samples():
    return [S.Sample("batch1_v5_k5", 610, dict(r=1, v=5, k=5, ties=False)),
            S.Sample("ties_v23_k6", 611, dict(r=6, v=23, k=6, ties=True)),
            S.Sample("ties_v61_k1", 612, dict(r=4, v=61, k=1, ties=True)),
            S.Sample("neg_inf_tail_v41_k7", 613, dict(r=3, v=41, k=7, ties=True, tail=30)),
            S.Sample("ties_v129_k64", 614, dict(r=5, v=129, k=64, ties=True), "exhaustive")]


def _make_topk(s, dtype):
    p, g = s.params, S.rng(s)
    x = S.random_logits(g, (p["r"], p["v"]), ties=p["ties"])
    if p.get("tail"):
        x[:, -p["tail"]:] = -np.inf
    return {"logits": In(x), "k": In(p["k"], "obj")}


def _ref_topk(r):
    vals, ids = r_selector.topk_lowest_index(r["logits"], r["k"])
    return {"values": vals, "ids": ids}


def _call_topk(b, t):
    vals, ids = t_selector.topk_lowest_index(t["logits"], t["k"])
    return {"values": vals, "ids": ids}


TOPK = OpSpec(
    "topk_lowest_index", "device", ALL, _topk_samples, _make_topk, _ref_topk, _call_topk,
    {"values": ("exact", "x"), "ids": ("exact", I64)},
    doc="top-K by value, descending, lowest id first among equal values")


def _unary_samples():
    return [S.Sample("plain_k5", 620, dict(r=2, k=5, mult=1.0, cap=None)),
            S.Sample("softcap_k8", 621, dict(r=3, k=8, mult=0.5, cap=10.0)),
            S.Sample("neg_inf_k6", 622, dict(r=2, k=6, mult=2.0, cap=3.0, neg_inf=True))]


def _make_unary(s, dtype):
    p, g = s.params, S.rng(s)
    x = g.normal(0, 8, (p["r"], p["k"]))
    if p.get("neg_inf"):
        x[:, -2:] = -np.inf
    return {"vals": In(x), "params": In(SelectorParams(p["k"], p["mult"], p["cap"]), "obj")}


UNARY = OpSpec(
    "unary_scores", "device", ALL, _unary_samples, _make_unary,
    lambda r: {"unary": r_selector.unary(r["vals"], r["params"].output_multiplier,
                                         r["params"].softcap)},
    lambda b, t: {"unary": t_selector.unary_scores(t["vals"], t["params"])},
    {"unary": ("float", F32)}, doc="softcap(val · output_multiplier), −inf kept")


def _params_errors():
    def build(t, k, p):
        return lambda device: (lambda be: SamplingBatch.build([t], [k], [p], device))
    return [ErrorInput("negative_temperature", build(-0.1, 0, 1.0), SamplingParamsError, "temp"),
            ErrorInput("nan_temperature", build(float("nan"), 0, 1.0), SamplingParamsError, "temp"),
            ErrorInput("inf_temperature", build(float("inf"), 0, 1.0), SamplingParamsError, "temp"),
            ErrorInput("negative_top_k", build(1.0, -1, 1.0), SamplingParamsError, "top_k"),
            ErrorInput("top_p_zero", build(1.0, 0, 0.0), SamplingParamsError, "top_p"),
            ErrorInput("top_p_above_one", build(1.0, 0, 1.5), SamplingParamsError, "top_p")]


SAMPLING_PARAMS = OpSpec(
    "sampling_params", "device", ("float32",), lambda: [], None, None, None, {},
    errors=_params_errors, doc="sampling parameters a request may not carry")
