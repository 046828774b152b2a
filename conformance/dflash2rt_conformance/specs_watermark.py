"""Op specs of the watermark: keyed values and context hashes (bit-exact float32 /
int64), the Gumbel-max draws over a dense law and a sparse candidate set and the keyed coin
(tokens exact, -log values bit-exact float64), and the key / detector input errors.

The draws compute E / p in float64, so their spec has test dtype "float64" (as inverse_cdf): a
backend that does not declare float64 skips it as a dtype skip, and a device without float64
raises WatermarkUnsupportedError (error input ``draw_without_fp64``). The values are integer
work plus an exact float32 map and run on every backend. A backend whose keyed draws are Triton
kernels (``implementation["watermark"]``) computes the context hashes, the keyed uniforms and
E = -log r with the kernels' own pieces (``kernels.watermark.kernel_values``): the same bits as
the float64 reference; the Gumbel-max token choice itself runs inside its select / verify
kernels and is checked against the torch ops by the kernel tests."""

from __future__ import annotations

import numpy as np
import torch

from dflash2rt.backend import TRITON_INTERPRETER, TRITON_KERNEL
from dflash2rt.errors import InvalidInputError
from dflash2rt.ops.exact32 import without_fp64
from dflash2rt.watermark import WatermarkKey, WatermarkKeyError, detect, sampler, values
from dflash2rt_conformance.capability import skip_without_fp64

from .harness import Arg
from .opspec import ErrorInput, OpSpec
from .reference import watermark as ref
from .samples import Sample, rng

MAX_ID = 2**32 - 2


def _key(sample) -> WatermarkKey:
    return WatermarkKey(rng(sample).bytes(32))


def _triple(sub):
    return (sub.k0, sub.k1, sub.word)


# ---- keyed values ------------------------------------------------------------------------
def values_samples():
    return [Sample(name="batch1_h1", seed=1700, params=dict(r=1, h=1)),
            Sample(name="r13_h4_padding_and_extreme_ids", seed=1701,
                   params=dict(r=13, h=4, extreme=True)),
            Sample(name="r97_h7", seed=1702, params=dict(r=97, h=7)),
            Sample(name="r4099_h4", seed=1703, params=dict(r=4099, h=4), tier="exhaustive")]


def make_values_inputs(sample, dtype):
    p, g = sample.params, rng(sample)
    win = g.integers(0, 200_000, (p["r"], p["h"]))
    tok = g.integers(0, 200_000, p["r"])
    if p.get("extreme"):
        win[:, 0] = -1                                   # before the start of the sequence
        win[::3, -1] = MAX_ID
        tok[::2] = np.resize([0, MAX_ID], len(tok[::2]))
        win[1, :] = -1
    return {"window": Arg(win, "i64"), "token": Arg(tok, "i64"), "key": Arg(_key(sample), "obj")}


def reference_values(x):
    ctx = ref.context_hash(x["window"])
    k = x["key"]
    return {"ctx": ctx, **{f"u_{s.name}": ref.keyed_uniforms(_triple(s), ctx, x["token"])
                           for s in (k.draft, k.target, k.coin)}}


def _kernel_values(backend):
    """``kernels.watermark.kernel_values`` where the backend's keyed draws are Triton kernels,
    else None (the torch ops)."""
    if backend.implementation.get("watermark") not in (TRITON_KERNEL, TRITON_INTERPRETER):
        return None
    from dflash2rt.kernels.watermark import kernel_values

    return kernel_values


def call_values(backend, x):
    k, kv = x["key"], _kernel_values(backend)
    if kv is not None:
        ctx = kv(windows=x["window"])["hash"]
        return {"ctx": ctx, **{f"u_{s.name}": kv(ctx=ctx, token=x["token"], sub=s)["u"]
                               for s in (k.draft, k.target, k.coin)}}
    ctx = values.context_hash(x["window"])
    return {"ctx": ctx, **{f"u_{s.name}": values.keyed_uniforms(s, ctx, x["token"])
                           for s in (k.draft, k.target, k.coin)}}


WM_VALUES = OpSpec(
    name="watermark_values", kind="device", dtypes=("float32",),
    samples=values_samples, make_inputs=make_values_inputs,
    reference=reference_values, call=call_values,
    outputs={"ctx": ("exact", torch.int64), "u_A": ("exact", torch.float32),
             "u_B": ("exact", torch.float32), "u_C": ("exact", torch.float32)},
    doc="context hash and keyed uniforms under subkeys A / B / C, bit-exact (the kernels' on "
        "a kernel backend)")


# ---- E = -log r ----------------------------------------------------------------------------
def neg_log_samples():
    return [Sample(name="extremes_and_power_of_two_edges", seed=1720, params=dict(n=0)),
            Sample(name="n4099_random", seed=1721, params=dict(n=4099))]


def make_neg_log_inputs(sample, dtype):
    j = np.arange(1, 24)                                  # both sides of each power of two
    k = np.concatenate([[0, 2**23 - 1], 2**(j - 1) - 1, 2**(j - 1),
                        rng(sample).integers(0, 2**23, sample.params["n"])])
    return {"u": Arg((2 * k + 1).astype(np.float32) * np.float32(2.0**-24), "f32")}


def call_neg_log(backend, x):
    skip_without_fp64(backend)
    kv = _kernel_values(backend)
    return {"e": values.neg_log(x["u"]) if kv is None else kv(u=x["u"])["e"]}


WM_NEG_LOG = OpSpec(
    name="watermark_neg_log", kind="device", dtypes=("float32",),
    samples=neg_log_samples, make_inputs=make_neg_log_inputs,
    reference=lambda x: {"e": ref.neg_log(x["u"])}, call=call_neg_log,
    outputs={"e": ("exact", torch.float64)},
    doc="E = -log u of the keyed uniforms (2k + 1)·2⁻²⁴, bit-exact float64 (the kernels' on a "
        "kernel backend; skipped without float64)")


# ---- Gumbel-max draws and the coin -------------------------------------------------------
def draw_samples():
    return [Sample(name="batch1_v5", seed=1710, params=dict(r=1, v=5, k=1)),
            Sample(name="r7_v97_zeros_bad_rows", seed=1711, params=dict(r=7, v=97, k=16, bad=True)),
            Sample(name="r5_v1000_k31", seed=1712, params=dict(r=5, v=1000, k=31, bad=True)),
            Sample(name="large_vocab_v151936", seed=1713, params=dict(r=2, v=151_936, k=64)),
            Sample(name="r33_v4099", seed=1714, params=dict(r=33, v=4099, k=7, bad=True),
                   tier="exhaustive")]


def make_draw_inputs(sample, dtype):
    p, g = sample.params, rng(sample)
    r, v, k = p["r"], p["v"], p["k"]
    probs = g.dirichlet(np.full(v, 0.3), r)
    probs[g.random(probs.shape) < 0.3] = 0.0
    probs[:, 0] += 1e-3
    ids = g.integers(0, v, (r, k))
    ids[:, -1] = ids[:, 0]                               # a repeated candidate id
    q = g.random((r, k))
    q[g.random(q.shape) < 0.3] = 0.0
    q[:, 0] += 1e-3
    if p.get("bad"):
        probs[1] = np.nan
        probs[2] = 0.0
        q[1, 0] = -0.5
        q[2] = 0.0
    ctx = ref.context_hash(g.integers(-1, 50_000, (r, 4)))
    return {"probs": Arg(probs, "f32"), "ids": Arg(ids, "i64"), "q": Arg(q, "f32"),
            "ctx": Arg(ctx, "i64"), "key": Arg(_key(sample), "obj")}


def reference_draw(x):
    k, ctx = x["key"], x["ctx"]
    v = x["probs"].shape[-1]
    return {"token_A": ref.draw_dense(_triple(k.draft), ctx, x["probs"]),
            "token_B": ref.draw_dense(_triple(k.target), ctx, x["probs"]),
            "pos_A": ref.draw_sparse(_triple(k.draft), ctx, x["ids"], x["q"]),
            "e_B": ref.neg_log(ref.keyed_uniforms(_triple(k.target), ctx[:, None],
                                                  np.arange(min(v, 64))[None, :])),
            "coin": ref.coin(_triple(k.coin), ctx)}


def call_draw(backend, x):
    k, ctx, kv = x["key"], x["ctx"], _kernel_values(backend)
    v = x["probs"].shape[-1]
    tok = torch.arange(min(v, 64), device=ctx.device)
    if kv is None:
        e_b = values.neg_log(values.keyed_uniforms(k.target, ctx.view(-1, 1), tok.view(1, -1)))
    else:
        c, t = torch.broadcast_tensors(ctx.view(-1, 1), tok.view(1, -1))       # [R, T]
        u = kv(ctx=c.flatten(), token=t.flatten(), sub=k.target)["u"]
        e_b = kv(u=u)["e"].view(c.shape)
    return {"token_A": sampler.draw_dense(k.draft, ctx, x["probs"]),
            "token_B": sampler.draw_dense(k.target, ctx, x["probs"]),
            "pos_A": sampler.draw_sparse(k.draft, ctx, x["ids"], x["q"]),
            "e_B": e_b, "coin": sampler.coin(k.coin, ctx)}


WM_DRAW = OpSpec(
    name="watermark_draw", kind="device", dtypes=("float64",),
    samples=draw_samples, make_inputs=make_draw_inputs,
    reference=reference_draw, call=call_draw,
    outputs={"token_A": ("exact", torch.int64), "token_B": ("exact", torch.int64),
             "pos_A": ("exact", torch.int64), "e_B": ("exact", torch.float64),
             "coin": ("exact", torch.float32)},
    doc="Gumbel-max argmin E/p (ties lower id, p = 0 never, -1 not a law), dense and sparse; "
        "E = -log r bit-exact (the kernels' on a kernel backend); the keyed coin")


# ---- input errors ------------------------------------------------------------------------
def watermark_errors():
    def call(f):
        return lambda device: (lambda backend: f())
    key = WatermarkKey(bytes(32))
    return [ErrorInput(name="short_secret", build=call(lambda: WatermarkKey(b"\0" * 31)),
                       error=WatermarkKeyError, match="32 bytes"),
            ErrorInput(name="negative_token", build=call(lambda: detect(key, [3, -1, 4])),
                       error=InvalidInputError, match="token 1"),
            ErrorInput(name="fpr_out_of_range", build=call(lambda: detect(key, [3], fpr=1.5)),
                       error=InvalidInputError, match="fpr"),
            ErrorInput(name="draw_without_fp64", build=call(_draw_without_fp64),
                       error=sampler.WatermarkUnsupportedError, match="no float64")]


def _draw_without_fp64():
    with without_fp64():
        sampler.draw_dense(WatermarkKey(bytes(32)).target, torch.zeros(1, dtype=torch.int64),
                           torch.ones(1, 3))


WM_ERRORS = OpSpec(name="watermark_inputs", kind="device", dtypes=("float32",),
                   errors=watermark_errors, doc="watermark keys and detector inputs")
