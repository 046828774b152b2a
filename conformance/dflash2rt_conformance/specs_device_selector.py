"""Op specs of the selector's dflash2rt.ops functions run on the backend's device:
topk_lowest_index and unary_scores."""

from __future__ import annotations

import numpy as np
import torch

from dflash2rt.ops import selector as ops_selector
from dflash2rt.ops.selector import SelectorParams

from .harness import Arg
from .opspec import ALL_DTYPES, OpSpec
from .reference import selector as ref_selector
from .samples import Sample, random_logits, rng


# ---- topk_lowest_index ------------------------------------------------------------------
def topk_samples():
    return [Sample(name="batch1_v5_k5", seed=610, params=dict(r=1, v=5, k=5, ties=False)),
            Sample(name="ties_v23_k6", seed=611, params=dict(r=6, v=23, k=6, ties=True)),
            Sample(name="ties_v61_k1", seed=612, params=dict(r=4, v=61, k=1, ties=True)),
            Sample(name="neg_inf_tail_v41_k7", seed=613,
                   params=dict(r=3, v=41, k=7, ties=True, tail=30)),
            Sample(name="ties_v129_k64", seed=614, params=dict(r=5, v=129, k=64, ties=True),
                   tier="exhaustive"),
            Sample(name="large_vocab_ties_v151936_k16", seed=615,
                   params=dict(r=3, v=151_936, k=16, ties=True)),
            Sample(name="large_vocab_ties_v202048_k1", seed=616,
                   params=dict(r=2, v=202_048, k=1, ties=True, tail=1000))]


def make_topk_inputs(sample, dtype):
    p, g = sample.params, rng(sample)
    x = random_logits(g, (p["r"], p["v"]), ties=p["ties"])
    if p.get("tail"):
        x[:, -p["tail"]:] = -np.inf
    return {"logits": Arg(x), "k": Arg(p["k"], "obj")}


def reference_topk(x):
    values, ids = ref_selector.topk_lowest_index(x["logits"], x["k"])
    return {"values": values, "ids": ids}


def call_topk(backend, x):
    values, ids = ops_selector.topk_lowest_index(x["logits"], x["k"])
    return {"values": values, "ids": ids}


TOPK = OpSpec(
    name="topk_lowest_index", kind="device", dtypes=ALL_DTYPES,
    samples=topk_samples, make_inputs=make_topk_inputs,
    reference=reference_topk, call=call_topk,
    outputs={"values": ("exact", "x"), "ids": ("exact", torch.int64)},
    doc="top-K by value, descending, lowest id first among equal values")


# ---- unary_scores -----------------------------------------------------------------------
def unary_samples():
    return [Sample(name="plain_k5", seed=620, params=dict(r=2, k=5, mult=1.0, cap=None)),
            Sample(name="softcap_k8", seed=621, params=dict(r=3, k=8, mult=0.5, cap=10.0)),
            Sample(name="neg_inf_k6", seed=622,
                   params=dict(r=2, k=6, mult=2.0, cap=3.0, neg_inf=True))]


def make_unary_inputs(sample, dtype):
    p, g = sample.params, rng(sample)
    x = g.normal(0, 8, (p["r"], p["k"]))
    if p.get("neg_inf"):
        x[:, -2:] = -np.inf
    return {"vals": Arg(x), "params": Arg(SelectorParams(p["k"], p["mult"], p["cap"]), "obj")}


def reference_unary(x):
    params = x["params"]
    return {"unary": ref_selector.unary(x["vals"], params.output_multiplier, params.softcap)}


def call_unary(backend, x):
    return {"unary": ops_selector.unary_scores(x["vals"], x["params"])}


UNARY = OpSpec(
    name="unary_scores", kind="device", dtypes=ALL_DTYPES,
    samples=unary_samples, make_inputs=make_unary_inputs,
    reference=reference_unary, call=call_unary,
    outputs={"unary": ("float", torch.float32)}, doc="softcap(val · output_multiplier), −inf kept")
