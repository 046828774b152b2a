"""Op spec of the Backend's ``select`` (top-K, softcap unary, low-rank lattice, draft walk) and
its sample table."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from dflash2rt.errors import InvalidInputError
from dflash2rt.ops.batch import SamplingBatch
from dflash2rt.ops.selector import SelectorParams

from .harness import Arg
from .opspec import ALL_DTYPES, ErrorInput, OpSpec, sampling_batch
from .reference import selector as ref_selector
from .samples import Sample, gen_uniforms, random_logits, rng, table_samples


@dataclass(frozen=True, kw_only=True)
class SelectCase:
    """r requests × γ slots over v tokens, top-k candidates, lattice ``rank``; ``ties``: logits
    on a ½ grid; ``tail``: that many trailing −inf logits; ``anchor``: every request's anchor;
    ``nan`` / ``nan_codebook``: the request whose draft logits / anchor codebook row get a NaN."""

    name: str
    r: int
    gamma: int
    v: int
    k: int
    rank: int
    temps: list
    softcap: float | None = None
    mult: float = 1.0
    ties: bool = False
    tail: int = 0
    anchor: int | None = None
    nan: int | None = None
    nan_codebook: int | None = None
    tier: str = "small"


SELECT_CASES = [
    SelectCase(name="batch1_greedy_v5_k5", r=1, gamma=3, v=5, k=5, rank=2, temps=[0.0]),
    SelectCase(name="mixed_v37_k8_r6", r=4, gamma=7, v=37, k=8, rank=6, softcap=10.0, mult=0.5,
               temps=[0.0, 0.7, 1.3, 0.0]),
    SelectCase(name="dflash1_v61_k1_rank0", r=2, gamma=5, v=61, k=1, rank=0, temps=[0.0, 1.0]),
    SelectCase(name="ties_v23_k6", r=3, gamma=4, v=23, k=6, rank=3, temps=[0.0, 1.0, 0.5],
               ties=True),
    SelectCase(name="ties_zero_rank_greedy", r=2, gamma=5, v=29, k=7, rank=0, temps=[0.0, 0.0],
               ties=True),
    SelectCase(name="low_temperature_1e-3", r=2, gamma=4, v=31, k=5, rank=4, softcap=30.0,
               temps=[1e-3, 1e-3]),
    SelectCase(name="padded_tail_neg_inf", r=2, gamma=3, v=41, k=6, rank=3, temps=[0.0, 1.0],
               tail=9),
    SelectCase(name="anchor_is_mask_id", r=2, gamma=3, v=19, k=4, rank=2, temps=[0.0, 0.9],
               anchor=18),
    SelectCase(name="nan_row_flagged", r=3, gamma=3, v=17, k=4, rank=2, temps=[0.0, 1.0, 1.0],
               nan=1),
    SelectCase(name="v100_k16_softcap", r=3, gamma=15, v=100, k=16, rank=8, softcap=15.0,
               mult=0.8, temps=[0.0, 1.0, 2.0], tier="exhaustive"),
    SelectCase(name="v129_k32", r=2, gamma=7, v=129, k=32, rank=5, temps=[0.6, 0.0],
               tier="exhaustive"),
    SelectCase(name="v97_k97_full", r=1, gamma=11, v=97, k=97, rank=4, softcap=5.0, temps=[1.0],
               tier="exhaustive"),
    # Candidate counts past the trained one (a request's own count, engine/candidates.py):
    # K = 128 sampled; K = 64 over a row with 10 finite logits (|S| < K: the rest −inf, q = 0).
    SelectCase(name="v160_k128_sampled", r=2, gamma=3, v=160, k=128, rank=3, temps=[1.0, 0.7]),
    SelectCase(name="few_finite_k64", r=2, gamma=3, v=80, k=64, rank=3, temps=[1.0, 0.0],
               tail=70),
    # The walk that scores only the rows it reads (ops.selector.ROW_WALK_MIN_K = 128 on):
    # ties (lowest index wins), fewer finite logits than K, a bad anchor codebook row.
    SelectCase(name="row_walk_ties_v150_k128", r=3, gamma=4, v=150, k=128, rank=3,
               temps=[0.0, 1.0, 0.5], ties=True),
    SelectCase(name="row_walk_few_finite_v200_k128", r=2, gamma=3, v=200, k=128, rank=3,
               temps=[1.0, 0.0], tail=150),
    SelectCase(name="row_walk_nan_codebook_v130_k128", r=3, gamma=3, v=130, k=128, rank=3,
               temps=[1.0, 1.0, 0.0], nan_codebook=1),
    SelectCase(name="nan_codebook_lattice_flagged", r=3, gamma=3, v=43, k=4, rank=3,
               temps=[1.0, 1.0, 0.0], nan_codebook=1),
    SelectCase(name="tiny_temperatures_no_overflow", r=3, gamma=4, v=31, k=5, rank=3,
               temps=[1e-38, 1.4e-45, 1e-30]),
    # Real vocabulary sizes, K = 16 as the published draft: logits on a ½ grid, so the K-th
    # value is tied across the vocabulary (lowest ids win); a −inf padded tail.
    SelectCase(name="large_vocab_v151936_k8", r=2, gamma=2, v=151_936, k=8, rank=4,
               temps=[0.0, 1.0], ties=True, tail=64),
    SelectCase(name="large_vocab_v202048_k16", r=2, gamma=3, v=202_048, k=16, rank=4,
               softcap=30.0, temps=[0.8, 0.0], ties=True),
]


def select_samples() -> list[Sample]:
    return table_samples(200, SELECT_CASES)


def make_select_inputs(sample, dtype):
    p, g = sample.params, rng(sample)
    r, gamma, v, rank = p["r"], p["gamma"], p["v"], p["rank"]
    logits = random_logits(g, (r, gamma, v), ties=p["ties"])
    if p["tail"]:
        logits[..., v - p["tail"]:] = -np.inf
    if p["nan"] is not None:
        logits[p["nan"], 1, 3] = np.nan
    anchor = g.integers(0, v, r)
    if p["anchor"] is not None:
        anchor[:] = p["anchor"]
    pred, succ = g.normal(0, 0.7, (v, rank)), g.normal(0, 0.7, (v, rank))
    if p["nan_codebook"] is not None:       # the anchor's codebook row: slot 0 reads it
        pred[anchor[p["nan_codebook"]], 0] = np.nan
    return {"logits": Arg(logits), "proj": Arg(g.normal(0, 1, (r, gamma, rank))),
            "anchor": Arg(anchor, "i64"), "pred": Arg(pred), "succ": Arg(succ),
            "u_walk": Arg(gen_uniforms(g, (r, gamma)), "f32"),
            "params": Arg(SelectorParams(p["k"], p["mult"], p["softcap"]), "obj"),
            "temps": Arg(p["temps"], "obj")}


def reference_select(x):
    params, temps = x["params"], np.asarray(x["temps"])
    out = ref_selector.select(x["logits"], x["proj"], x["anchor"], x["pred"], x["succ"],
                              params.top_k, params.output_multiplier, params.softcap, temps,
                              temps == 0, x["u_walk"])
    # A bad lattice row voids that request's walk; the flag itself is defined unless the
    # draft logits are bad (then the walk's first picks are not defined).
    return {**out, "_rows": ~out["bad"] & ~out["bad_lattice"], "_rows_bad_lattice": ~out["bad"]}


def call_select(backend, x):
    out = backend.select(x["logits"], x["proj"], x["anchor"], x["pred"], x["succ"], x["params"],
                         sampling_batch(x, backend.device), x["u_walk"])
    return {"draft": out.draft, "candidates": out.candidates, "q": out.q, "bad": out.bad,
            "bad_lattice": out.bad_lattice}


def _select_call(k=3, proj_rank=2, u_shape=(1, 2)):
    """An ErrorInput builder: select on a 1 × 2 × 5 block with one argument made invalid."""
    def build(device):
        logits = torch.zeros(1, 2, 5, device=device)
        proj = torch.zeros(1, 2, proj_rank, device=device)
        codebook = torch.zeros(5, 2, device=device)
        sampling = SamplingBatch.greedy_batch(1, device)
        anchor = torch.zeros(1, dtype=torch.int64, device=device)
        u = torch.full(u_shape, 0.5, device=device)
        return lambda be: be.select(logits, proj, anchor, codebook, codebook,
                                    SelectorParams(k), sampling, u)
    return build


def select_errors():
    def err(name, build, match):
        return ErrorInput(name=name, build=build, error=InvalidInputError, match=match)
    return [err("top_k_zero", _select_call(k=0), "top_k"),
            err("top_k_above_vocab", _select_call(k=6), "top_k"),
            err("proj_rank_mismatch", _select_call(proj_rank=3), "shapes"),
            err("u_walk_shape_mismatch", _select_call(u_shape=(1, 3)), "shapes")]


SELECT = OpSpec(
    name="select", kind="backend", dtypes=ALL_DTYPES,
    samples=select_samples, make_inputs=make_select_inputs,
    reference=reference_select, call=call_select,
    outputs={"draft": ("exact", torch.int64), "candidates": ("exact", torch.int64),
             "q": ("float", torch.float32), "bad": ("exact", torch.bool),
             "bad_lattice": ("exact", torch.bool)},
    row_masked=frozenset({"draft", "candidates", "q", "bad_lattice"}),
    errors=select_errors,
    doc="top-K (lowest id on ties), softcap unary, low-rank lattice, greedy / sampled walk")
