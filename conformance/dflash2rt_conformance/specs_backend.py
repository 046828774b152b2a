"""Op specs of the Backend methods noise, conv (both sides) and verify (``select``: in
``specs_select``)."""

from __future__ import annotations

import numpy as np
import torch

from dflash2rt.errors import InvalidInputError, NonFiniteLogitsError
from dflash2rt.ops.batch import BlockNoise, SamplingBatch

from .harness import Arg
from .opspec import ALL_DTYPES, ErrorInput, OpSpec, sampling_batch
from .reference import conv as ref_conv, rng as ref_rng, verify as ref_verify
from .samples import conv_samples, noise_samples, rng
from .verify_corpus import build_verify_case, verify_samples


# ---- noise -------------------------------------------------------------------------------
def make_noise_inputs(sample, dtype):
    p, g = sample.params, rng(sample)
    r = p["r"]
    seeds = p.get("seeds") or list(g.integers(0, 2 ** 63 - 1, r, dtype=np.int64))
    req = p.get("req") or list(g.integers(0, 2 ** 32, r))
    pos = p.get("pos") or list(g.integers(0, 2 ** 33, r))
    return {"seed": Arg(seeds, "i64"), "request": Arg(req, "i64"),
            "anchor_pos": Arg(pos, "i64"), "gamma": Arg(p["gamma"], "obj")}


def reference_noise(x):
    return ref_rng.block_noise(x["seed"], x["request"], x["anchor_pos"], x["gamma"])


def call_noise(backend, x):
    return backend.noise(x["seed"], x["request"], x["anchor_pos"], x["gamma"]).__dict__


NOISE = OpSpec(
    name="noise", kind="backend", dtypes=("float32",),
    samples=noise_samples, make_inputs=make_noise_inputs,
    reference=reference_noise, call=call_noise,
    outputs={k: ("exact", torch.float32) for k in ("walk", "accept", "residual", "bonus")},
    doc="Philox-4x32-10 uniforms per (seed, request, position, stream), bit for bit")


# ---- conv --------------------------------------------------------------------------------
def make_conv_inputs(sample, dtype):
    p, g = sample.params, rng(sample)
    n, hidden = p["block"] * p["r"], p["hidden"]
    base = g.normal(0, 0.5, (p["taps"], hidden))
    base[0] += 1.0
    return {"x": Arg(g.normal(0, 1, (n, hidden))), "h": Arg(g.normal(0, 1, (n, hidden))),
            "base": Arg(base), "delta": Arg(g.normal(0, 0.3, (n, p["taps"], p["groups"]))),
            "block": Arg(p["block"], "obj")}


def reference_conv_prepare(x):
    return {"out": ref_conv.conv_prepare(x["x"], x["base"], x["delta"], x["block"])}


def call_conv_prepare(backend, x):
    return {"out": backend.conv_prepare(x["x"], x["base"], x["delta"], x["block"])}


def reference_conv_finish(x):
    return {"out": ref_conv.conv_finish(x["h"], x["x"], x["base"], x["delta"], x["block"])}


def call_conv_finish(backend, x):
    return {"out": backend.conv_finish(x["h"], x["x"], x["base"], x["delta"], x["block"])}


def _conv_errors(method: str):
    """The ErrorInputs of ``conv_prepare`` or ``conv_finish``: zeros of invalid shapes."""
    def call(shape_x, shape_base, shape_delta, block):
        def build(device):
            def zeros(shape):
                return torch.zeros(shape, device=device)
            args = (zeros(shape_x), zeros(shape_base), zeros(shape_delta), block)
            if method == "conv_finish":
                return lambda be: be.conv_finish(zeros(shape_x), *args)
            return lambda be: be.conv_prepare(*args)
        return build

    def err(name, build, match):
        return ErrorInput(name=name, build=build, error=InvalidInputError, match=match)

    def errors():
        return [
            err("rows_not_multiple_of_block", call((10, 8), (2, 8), (10, 2, 2), 3),
                "multiple of block_size"),
            err("base_hidden_mismatch", call((6, 8), (2, 7), (6, 2, 2), 3), "base must be"),
            err("delta_taps_mismatch", call((6, 8), (2, 8), (6, 3, 2), 3), "delta must be"),
            err("groups_do_not_divide_hidden", call((6, 8), (2, 8), (6, 2, 3), 3), "groups"),
            err("x_not_2d", call((6, 8, 1), (2, 8), (6, 2, 2), 3), "conv input must be"),
        ]
    return errors


def conv_spec(side: str, reference, call, doc: str) -> OpSpec:
    """One side of the DFlash2 conv (``conv_prepare`` / ``conv_finish``): same samples, inputs,
    output and error inputs, its own reference, call and doc."""
    return OpSpec(name=side, kind="backend", dtypes=ALL_DTYPES, samples=conv_samples,
                  make_inputs=make_conv_inputs, reference=reference, call=call,
                  outputs={"out": ("float", "x")}, errors=_conv_errors(side), doc=doc)


CONV_PREPARE = conv_spec("conv_prepare", reference_conv_prepare, call_conv_prepare,
                         "input side of the DFlash2 conv; taps never cross a block boundary")
CONV_FINISH = conv_spec("conv_finish", reference_conv_finish, call_conv_finish,
                        "output side: h + conv(a, base[1], δ[:, 1])")


# ---- verify ------------------------------------------------------------------------------
def make_verify_inputs(sample, dtype):
    c = build_verify_case(sample)
    return {"logits": Arg(c["logits"]), "draft": Arg(c["draft"], "i64"),
            "cand": Arg(c["cand"], "i64"), "q": Arg(c["q"], "f32"),
            "walk": Arg(c["walk"], "f32"), "accept": Arg(c["accept"], "f32"),
            "residual": Arg(c["residual"], "f32"), "bonus": Arg(c["bonus"], "f32"),
            "temps": Arg(c["temps"], "obj"), "top_k": Arg(c["top_k"], "obj"),
            "top_p": Arg(c["top_p"], "obj")}


def reference_verify(x):
    temps = np.asarray(x["temps"], np.float64)
    temps32 = temps.astype(np.float32).astype(np.float64)     # staged as float32 by contract
    top_p32 = np.asarray(x["top_p"], np.float32).astype(np.float64)
    out = ref_verify.verify(x["logits"], x["draft"], x["cand"], x["q"], temps32,
                            np.asarray(x["top_k"]), top_p32, temps == 0, x["accept"],
                            x["residual"], x["bonus"])
    return {**out, "_rows": ~out["bad"] & ~out["bad_q"]}


def call_verify(backend, x):
    noise = BlockNoise(x["walk"], x["accept"], x["residual"], x["bonus"])
    out = backend.verify(x["logits"], x["draft"], x["cand"], x["q"],
                         sampling_batch(x, backend.device), noise, check=False)
    return {"accept_len": out.accept_len, "tokens": out.tokens, "bad": out.bad,
            "bad_q": out.bad_q}


def _verify_call(kind: str):
    """An ErrorInput builder: verify (check=True) on a 2 × 3 × 5 block made invalid by ``kind``."""
    def build(device):
        logits = torch.zeros(2, 3, 5, device=device)
        draft = torch.tensor([[0, 1], [2, 3]], device=device)
        cand = draft.unsqueeze(-1).clone()
        q = torch.ones(2, 2, 1, device=device)
        sampling = SamplingBatch.build([1.0, 1.0], [0, 0], [1.0, 1.0], device)
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
        return lambda be: be.verify(logits, draft, cand, q, sampling, noise, check=True)
    return build


def verify_errors():
    return [ErrorInput(name="nan_logits_raise", build=_verify_call("nan"),
                       error=NonFiniteLogitsError, match=r"request\(s\) \[1\]"),
            ErrorInput(name="draft_with_q_zero_raises", build=_verify_call("q_zero"),
                       error=InvalidInputError, match="q = 0"),
            ErrorInput(name="draft_shape_mismatch", build=_verify_call("shape"),
                       error=InvalidInputError, match="shapes"),
            ErrorInput(name="no_draft_slot", build=_verify_call("no_slot"),
                       error=InvalidInputError, match="draft slot")]


VERIFY = OpSpec(
    name="verify", kind="backend", dtypes=ALL_DTYPES,
    samples=verify_samples, make_inputs=make_verify_inputs,
    reference=reference_verify, call=call_verify,
    outputs={"accept_len": ("exact", torch.int64), "tokens": ("exact", torch.int64),
             "bad": ("exact", torch.bool), "bad_q": ("exact", torch.bool)},
    row_masked=frozenset({"accept_len", "tokens"}), errors=verify_errors,
    doc="greedy and chain speculative sampling; decisions bit for bit on the adversarial corpus")
