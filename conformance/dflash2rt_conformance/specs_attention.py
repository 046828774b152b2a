"""Op spec of the Backend's ``attention`` (key ranges per query row over a static KV cache) and
its sample table: ragged lengths, GQA ratios 1-8, the draft's sliding windows (lo > 0), T = 1
(decode) and T = 17 (a b16 block plus one) query rows, head dims 8-256, and K / V passed as the
strided slice ``cache[:, :L]`` of a longer cache, as the models pass them."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from dflash2rt.errors import InvalidInputError

from .harness import Arg
from .opspec import ALL_DTYPES, ErrorInput, OpSpec
from .reference import attention as ref_attention
from .samples import rng, table_samples


@dataclass(frozen=True, kw_only=True)
class AttentionCase:
    """r requests × t query rows, n_kv KV heads × ``group`` query heads each, head dim hd, over
    the first ``keys`` rows of a cache of ``keys + spare`` rows. ``ranges``: "causal" (target:
    lo = 0, hi = pos + 1), "block" (draft: lo = the sliding ``window``'s start, at most lens,
    hi = lens + t) or "random" (any 0 <= lo < hi <= keys). Request 0 fills the slice (lens =
    keys - t), request 1 has no context (lens = 0), the rest are drawn. ``sharp`` scales q (large
    scores: the online softmax's running max must rescale)."""

    name: str
    r: int
    t: int
    n_kv: int
    group: int
    hd: int
    keys: int
    ranges: str = "causal"
    window: int | None = None
    spare: int = 5
    sharp: float = 1.0
    tier: str = "small"


ATTENTION_CASES = [
    AttentionCase(name="batch1_decode_one_key", r=1, t=1, n_kv=2, group=1, hd=16, keys=1),
    AttentionCase(name="decode_gqa2_ragged_L23", r=3, t=1, n_kv=2, group=2, hd=32, keys=23),
    AttentionCase(name="decode_gqa4_hd64_L37", r=2, t=1, n_kv=1, group=4, hd=64, keys=37),
    AttentionCase(name="decode_gqa8_hd8_L19", r=2, t=1, n_kv=2, group=8, hd=8, keys=19),
    AttentionCase(name="verify_t17_gqa8_L41", r=2, t=17, n_kv=1, group=8, hd=16, keys=41),
    AttentionCase(name="draft_t17_window5_gqa2_hd24", r=3, t=17, n_kv=2, group=2, hd=24, keys=53,
                  ranges="block", window=5),
    AttentionCase(name="draft_t4_window3_mha", r=3, t=4, n_kv=2, group=1, hd=16, keys=11,
                  ranges="block", window=3),
    AttentionCase(name="random_ranges_gqa4_L131_hd128", r=2, t=3, n_kv=1, group=4, hd=128,
                  keys=131, ranges="random"),
    AttentionCase(name="sharp_scores_L97", r=2, t=2, n_kv=1, group=2, hd=32, keys=97,
                  sharp=4.0),
    AttentionCase(name="verify_t17_gqa4_hd256_L300", r=2, t=17, n_kv=2, group=4, hd=256,
                  keys=300, tier="exhaustive"),
    AttentionCase(name="draft_t16_window64_gqa8_L257", r=4, t=16, n_kv=1, group=8, hd=64,
                  keys=257, ranges="block", window=64, tier="exhaustive"),
    AttentionCase(name="decode_gqa3_hd96_L1000_batch7", r=7, t=1, n_kv=2, group=3, hd=96,
                  keys=1000, tier="exhaustive"),
    AttentionCase(name="random_ranges_t17_gqa2_L200", r=3, t=17, n_kv=2, group=2, hd=48,
                  keys=200, ranges="random", tier="exhaustive"),
    # long contexts (each request's keys >= 4 MiB in float32): the torch op's grouped path
    AttentionCase(name="decode_qwen3_heads_L2048_long", r=2, t=1, n_kv=8, group=2, hd=128,
                  keys=2048, tier="exhaustive"),
    AttentionCase(name="verify_t9_qwen3_heads_L1100_long", r=2, t=9, n_kv=8, group=2, hd=128,
                  keys=1100, ranges="random", tier="exhaustive"),
]


def attention_samples():
    return table_samples(600, ATTENTION_CASES)


def _ranges(p: dict, g: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    r, t, keys = p["r"], p["t"], p["keys"]
    if p["ranges"] == "random":
        hi = g.integers(1, keys + 1, (r, t))
        return np.minimum(g.integers(0, keys, (r, t)), hi - 1), hi
    lens = g.integers(0, keys - t + 1, r)
    lens[0] = keys - t
    if r > 1:
        lens[1] = 0
    pos = lens[:, None] + np.arange(t)                          # [R, T]
    if p["ranges"] == "causal":
        return np.zeros_like(pos), pos + 1
    lo = np.minimum(np.maximum(pos - p["window"] + 1, 0), lens[:, None])
    return lo, np.broadcast_to((lens + t)[:, None], (r, t)).copy()


def make_attention_inputs(sample, dtype):
    p, g = sample.params, rng(sample)
    r, t, n_kv, hd = p["r"], p["t"], p["n_kv"], p["hd"]
    cache = (r, p["keys"] + p["spare"], n_kv, hd)
    lo, hi = _ranges(p, g)
    return {"q": Arg(p["sharp"] * g.normal(0, 1, (r, t, n_kv * p["group"], hd))),
            "cache_k": Arg(g.normal(0, 1, cache)), "cache_v": Arg(g.normal(0, 1, cache)),
            "lo": Arg(lo, "i64"), "hi": Arg(hi, "i64"), "keys": Arg(p["keys"], "obj"),
            "scale": Arg(hd ** -0.5, "obj")}


def reference_attention(x):
    n = x["keys"]
    return {"out": ref_attention.attention(x["q"], x["cache_k"][:, :n], x["cache_v"][:, :n],
                                           x["lo"], x["hi"], x["scale"])}


def call_attention(backend, x):
    n = x["keys"]                           # the first L rows of the cache: a strided view
    return {"out": backend.attention(x["q"], x["cache_k"][:, :n], x["cache_v"][:, :n],
                                     x["lo"], x["hi"], x["scale"])}


def _attention_call(q_shape, kv_shape, range_shape, v_shape=None):
    def build(device):
        def zeros(shape, dtype=torch.float32):
            return torch.zeros(shape, dtype=dtype, device=device)
        q, k, v = zeros(q_shape), zeros(kv_shape), zeros(v_shape or kv_shape)
        lo, hi = zeros(range_shape, torch.int64), torch.ones(range_shape, dtype=torch.int64,
                                                                   device=device)
        return lambda be: be.attention(q, k, v, lo, hi, 0.5)
    return build


def attention_errors():
    def err(name, build, match):
        return ErrorInput(name=name, build=build, error=InvalidInputError, match=match)

    return [err("heads_not_multiple_of_kv_heads", _attention_call((1, 1, 3, 8), (1, 4, 2, 8),
                                                                  (1, 1)), "incompatible"),
            err("k_v_shape_mismatch", _attention_call((1, 1, 2, 8), (1, 4, 2, 8), (1, 1),
                                                      (1, 5, 2, 8)), "incompatible"),
            err("ranges_not_r_by_t", _attention_call((2, 3, 2, 8), (2, 4, 2, 8), (2, 2)),
                r"must be \[R, T\]")]


ATTENTION = OpSpec(
    name="attention", kind="backend", dtypes=ALL_DTYPES,
    samples=attention_samples, make_inputs=make_attention_inputs,
    reference=reference_attention, call=call_attention,
    outputs={"out": ("float", "x")}, errors=attention_errors,
    doc="softmax attention of each query row over its key range lo <= p < hi of the cache "
        "rows (GQA by head mapping; ragged lengths, sliding windows, strided cache slices)")
