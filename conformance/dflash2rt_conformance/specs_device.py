"""Op specs of the dflash2rt.ops functions every engine path runs on the backend's device:
target_probs, sample_next, inverse_cdf and the sampling parameter checks (the selector's
topk_lowest_index and unary_scores: ``specs_device_selector``)."""

from __future__ import annotations

import numpy as np
import torch

from dflash2rt.errors import SamplingParamsError
from dflash2rt.ops import sampling as ops_sampling, verify as ops_verify
from dflash2rt.ops.batch import SamplingBatch

from .harness import Arg
from .opspec import ALL_DTYPES, ErrorInput, OpSpec, sampling_batch
from .reference import sampling as ref_sampling, verify as ref_verify
from .samples import Sample, gen_uniforms, probs_samples, random_logits, rng, tied_logits


def _f32(x):
    """As staged by the runtime: rounded to float32."""
    return np.asarray(x, np.float32).astype(np.float64)


# ---- target_probs and sample_next ---------------------------------------------------------
def make_probs_inputs(sample, dtype):
    p, g = sample.params, rng(sample)
    shape = (p["r"], p["t"], p["v"])
    logits = tied_logits(g, shape, p["tied"]) if p["tied"] else \
        random_logits(g, shape, ties=p["ties"])
    u = np.full(p["r"], 1 - 2.0 ** -24) if p["u_max"] else gen_uniforms(g, (p["r"],))
    return {"logits": Arg(logits), "temps": Arg(p["temps"], "obj"),
            "top_k": Arg(p["top_k"], "obj"), "top_p": Arg(p["top_p"], "obj"), "u": Arg(u, "f32")}


def reference_target_probs(x):
    return {"p": ref_sampling.target_probs(x["logits"], _f32(x["temps"]), np.asarray(x["top_k"]),
                                           _f32(x["top_p"]))}


def call_target_probs(backend, x):
    s = sampling_batch(x, backend.device)
    return {"p": ops_sampling.target_probs(x["logits"], s.temperature, s.top_k, s.top_p,
                                           top_k_max=s.top_k_max, top_p_rows=s.top_p_rows)}


TARGET_PROBS = OpSpec(
    name="target_probs", kind="device", dtypes=ALL_DTYPES,
    samples=probs_samples, make_inputs=make_probs_inputs,
    reference=reference_target_probs, call=call_target_probs,
    outputs={"p": ("float", torch.float32)},
    doc="temperature → top-k (ties kept) → top-p, float32 probabilities")


def reference_sample_next(x):
    temps = np.asarray(x["temps"], np.float64)
    out = ref_verify.sample_next(x["logits"][:, 0], _f32(temps), np.asarray(x["top_k"]),
                                 _f32(x["top_p"]), temps == 0, x["u"])
    return {**out, "_rows": ~out["bad"]}


def call_sample_next(backend, x):
    token, bad = ops_verify.sample_next(x["logits"][:, 0], sampling_batch(x, backend.device),
                                        x["u"])
    return {"token": token, "bad": bad}


SAMPLE_NEXT = OpSpec(
    name="sample_next", kind="device", dtypes=ALL_DTYPES,
    samples=probs_samples, make_inputs=make_probs_inputs,
    reference=reference_sample_next, call=call_sample_next,
    outputs={"token": ("exact", torch.int64), "bad": ("exact", torch.bool)},
    row_masked=frozenset({"token"}),
    doc="one token per request after prefill / in target-only decoding")


# ---- inverse_cdf ------------------------------------------------------------------------
def inverse_cdf_samples():
    return [Sample(name="batch1_v5", seed=600, params=dict(r=1, v=5)),
            Sample(name="zeros_and_tail_v37", seed=601, params=dict(r=9, v=37, zeros=True)),
            Sample(name="u_near_one_v61", seed=602,
                   params=dict(r=5, v=61, zeros=True, near_one=True)),
            Sample(name="v1000", seed=603, params=dict(r=17, v=1000, zeros=True),
                   tier="exhaustive"),
            Sample(name="large_vocab_v202048", seed=604, params=dict(r=2, v=202_048, zeros=True))]


def make_inverse_cdf_inputs(sample, dtype):
    p, g = sample.params, rng(sample)
    w = g.dirichlet(np.ones(p["v"]), p["r"])
    if p.get("zeros"):
        w[g.random(w.shape) < 0.4] = 0.0
        w[:, -max(1, p["v"] // 5):] = 0.0                   # trailing zeros: the clamp case
        w[:, 0] += 1e-3
    u = gen_uniforms(g, (p["r"],))
    if p.get("near_one"):
        u[:] = 1 - 2.0 ** -24
    return {"w": Arg(w, "f64"), "u": Arg(u, "f64")}


def reference_inverse_cdf(x):
    return {"idx": np.array([ref_sampling.inverse_cdf(w, u) for w, u in zip(x["w"], x["u"])])}


def call_inverse_cdf(backend, x):
    return {"idx": ops_sampling.inverse_cdf(x["w"], x["u"])}


INVERSE_CDF = OpSpec(
    name="inverse_cdf", kind="device", dtypes=("float64",),
    samples=inverse_cdf_samples, make_inputs=make_inverse_cdf_inputs,
    reference=reference_inverse_cdf, call=call_inverse_cdf,
    outputs={"idx": ("exact", torch.int64)},
    doc="first index with cdf > u·total, clamped to the last positive")


# ---- sampling parameter checks -----------------------------------------------------------
def _sampling_batch_call(temperature, top_k, top_p):
    """An ErrorInput builder: a one-request SamplingBatch with these parameters."""
    def build(device):
        return lambda be: SamplingBatch.build([temperature], [top_k], [top_p], device)
    return build


def sampling_params_errors():
    def err(name, build, match):
        return ErrorInput(name=name, build=build, error=SamplingParamsError, match=match)
    return [err("negative_temperature", _sampling_batch_call(-0.1, 0, 1.0), "temp"),
            err("nan_temperature", _sampling_batch_call(float("nan"), 0, 1.0), "temp"),
            err("inf_temperature", _sampling_batch_call(float("inf"), 0, 1.0), "temp"),
            err("negative_top_k", _sampling_batch_call(1.0, -1, 1.0), "top_k"),
            err("top_p_zero", _sampling_batch_call(1.0, 0, 0.0), "top_p"),
            err("top_p_above_one", _sampling_batch_call(1.0, 0, 1.5), "top_p")]


SAMPLING_PARAMS = OpSpec(
    name="sampling_params", kind="device", dtypes=("float32",), errors=sampling_params_errors,
    doc="sampling parameters a request may not carry")
