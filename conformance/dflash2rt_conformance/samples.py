"""Sample generators: small (always) and exhaustive (skipped by --quick) sets per op.

Every set includes batch 1, prime lengths, non-powers of two and vocabularies that are not a
multiple of 16/32/64. Values come from a NumPy generator seeded per sample.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .reference.sampling import target_probs


@dataclass(frozen=True)
class Sample:
    name: str
    seed: int
    params: dict[str, Any] = field(default_factory=dict)
    tier: str = "small"                    # "small" or "exhaustive"


HALF_UP = float(np.nextafter(np.float32(0.5), np.float32(1)))     # one float32 ulp above 1/2
HALF_DOWN = float(np.nextafter(np.float32(0.5), np.float32(0)))


def rng(sample: Sample) -> np.random.Generator:
    return np.random.default_rng(sample.seed)


def gen_uniforms(g: np.random.Generator, shape) -> np.ndarray:
    """Uniforms of the generator's form (2k+1)·2^-24."""
    return (2 * g.integers(0, 2 ** 23, size=shape) + 1) * 2.0 ** -24


def noise_samples() -> list[Sample]:
    s = [Sample("batch1_gamma1", 1, dict(r=1, gamma=1, seeds=[0], req=[0], pos=[0])),
         Sample("extreme_keys", 2, dict(r=3, gamma=7, seeds=[1, 2 ** 32 + 5, 2 ** 63 - 1],
                                        req=[0, 2 ** 32 - 1, 77], pos=[0, 2 ** 31, 2 ** 40 + 3])),
         Sample("position_carry_into_hi_word", 6, dict(r=2, gamma=5, seeds=[3, 3], req=[1, 1],
                                                       pos=[2 ** 32 - 3, 2 ** 33 - 2])),
         Sample("batch5_gamma15", 3, dict(r=5, gamma=15)),
         Sample("batch13_gamma3", 4, dict(r=13, gamma=3), "exhaustive"),
         Sample("batch2_gamma31", 5, dict(r=2, gamma=31), "exhaustive")]
    return s


CONV_SHAPES = [  # (name, block, requests, hidden, groups, taps, tier)
    ("b2_r1_h8_g2_t1", 2, 1, 8, 2, 1, "small"),
    ("b3_r2_h24_g3_t3", 3, 2, 24, 3, 3, "small"),
    ("b7_r1_h40_g5_t4", 7, 1, 40, 5, 4, "small"),
    ("b5_r3_h30_g6_t7_taps_past_block", 5, 3, 30, 6, 7, "small"),
    ("b1_r5_h12_g4_t2_single_row_blocks", 1, 5, 12, 4, 2, "small"),
    ("b16_r3_h96_g12_t3", 16, 3, 96, 12, 3, "exhaustive"),
    ("b13_r2_h56_g7_t2", 13, 2, 56, 7, 2, "exhaustive"),
    ("b11_r4_h66_g11_t5", 11, 4, 66, 11, 5, "exhaustive"),
    # Above every kernel channel tile (block_h 128 / 256) and not a multiple of one; group size
    # 28 straddles the tile edges, so a group index taken within the tile is caught.
    ("b4_r2_h392_g14_t3_multi_tile", 4, 2, 392, 14, 3, "small"),
    ("b16_r1_h520_g65_t2_multi_tile", 16, 1, 520, 65, 2, "small"),
    ("b8_r2_h1000_g40_t4_multi_tile", 8, 2, 1000, 40, 4, "exhaustive"),
]


def conv_samples() -> list[Sample]:
    return [Sample(n, 100 + i, dict(block=b, r=r, h=h, g=g, taps=t), tier)
            for i, (n, b, r, h, g, t, tier) in enumerate(CONV_SHAPES)]


SELECT_CASES = [  # name, R, γ, V, K, rank, softcap, mult, temps, tier, extra
    ("batch1_greedy_v5_k5", 1, 3, 5, 5, 2, None, 1.0, [0.0], "small", {}),
    ("mixed_v37_k8_r6", 4, 7, 37, 8, 6, 10.0, 0.5, [0.0, 0.7, 1.3, 0.0], "small", {}),
    ("dflash1_v61_k1_rank0", 2, 5, 61, 1, 0, None, 1.0, [0.0, 1.0], "small", {}),
    ("ties_v23_k6", 3, 4, 23, 6, 3, None, 1.0, [0.0, 1.0, 0.5], "small", {"ties": True}),
    ("ties_zero_rank_greedy", 2, 5, 29, 7, 0, None, 1.0, [0.0, 0.0], "small", {"ties": True}),
    ("low_temperature_1e-3", 2, 4, 31, 5, 4, 30.0, 1.0, [1e-3, 1e-3], "small", {}),
    ("padded_tail_neg_inf", 2, 3, 41, 6, 3, None, 1.0, [0.0, 1.0], "small", {"tail": 9}),
    ("anchor_is_mask_id", 2, 3, 19, 4, 2, None, 1.0, [0.0, 0.9], "small", {"anchor": 18}),
    ("nan_row_flagged", 3, 3, 17, 4, 2, None, 1.0, [0.0, 1.0, 1.0], "small", {"nan": 1}),
    ("v100_k16_softcap", 3, 15, 100, 16, 8, 15.0, 0.8, [0.0, 1.0, 2.0], "exhaustive", {}),
    ("v129_k32", 2, 7, 129, 32, 5, None, 1.0, [0.6, 0.0], "exhaustive", {}),
    ("v97_k97_full", 1, 11, 97, 97, 4, 5.0, 1.0, [1.0], "exhaustive", {}),
    ("nan_codebook_lattice_flagged", 3, 3, 43, 4, 3, None, 1.0, [1.0, 1.0, 0.0], "small",
     {"nan_codebook": 1}),
    ("tiny_temperatures_no_overflow", 3, 4, 31, 5, 3, None, 1.0, [1e-38, 1.4e-45, 1e-30],
     "small", {}),
]


def select_samples() -> list[Sample]:
    return [Sample(c[0], 200 + i, dict(r=c[1], gamma=c[2], v=c[3], k=c[4], rank=c[5],
                                       softcap=c[6], mult=c[7], temps=c[8], **c[10]), c[9])
            for i, c in enumerate(SELECT_CASES)]


PROBS_CASES = [  # name, R, T, V, temps, top_k, top_p, tier
    ("batch1_plain_v5", 1, 1, 5, [1.0], [0], [1.0], "small"),
    ("filters_v37", 4, 3, 37, [0.7, 1.0, 1.5, 0.0], [0, 5, 3, 0], [1.0, 0.9, 0.5, 1.0], "small"),
    ("t_1e-3_v61", 2, 2, 61, [1e-3, 1e-3], [0, 4], [1.0, 0.95], "small"),
    ("ties_topk_v23", 3, 2, 23, [1.0, 1.0, 2.0], [4, 7, 2], [1.0, 0.8, 1.0], "small"),
    ("v100_topp", 5, 4, 100, [0.9] * 5, [0, 10, 50, 0, 1], [0.3, 0.99, 1.0, 0.6, 1.0],
     "exhaustive"),
    ("v257", 2, 3, 257, [1.0, 0.5], [100, 0], [0.9, 0.95], "exhaustive"),
    ("t_tiny_no_overflow_v29", 3, 2, 29, [1e-38, 1.4e-45, 1e-30], [0, 3, 0], [1.0, 1.0, 0.9],
     "small"),
    # Exact top-p boundaries: request i has tied[i] equal logits (−inf elsewhere), so the mass
    # ahead of a token is a multiple of 1/tied[i] and lands exactly on top_p (4 ties at 1/2 keep
    # 2; 8 at 1/2 keep 4; 4 at 1/4 keep 1; 2 at 1/2 keep 1; one float32 ulp above / below 1/2
    # keeps 3 / 2; top_k = 3 keeps all 4 ties first; 8 at 3/8 keep 3). sample_next draws at
    # u = 1 − 2^-24: the last kept token, so keeping one token too many changes it.
    ("topp_boundary_ties_v37", 8, 2, 37, [1.0, 1.0, 1.0, 0.8, 1.0, 1.0, 0.7, 1.3],
     [0, 0, 0, 0, 0, 0, 3, 0], [0.5, 0.5, 0.25, 0.5, HALF_UP, HALF_DOWN, 0.5, 0.375], "small",
     {"tied": [4, 8, 4, 2, 4, 4, 4, 8], "u_max": True}),
]


def probs_samples() -> list[Sample]:
    out = []
    for i, c in enumerate(PROBS_CASES):
        extra = c[8] if len(c) > 8 else {}          # e.g. tied logits, u at its maximum
        out.append(Sample(c[0], 300 + i, dict(r=c[1], t=c[2], v=c[3], temps=c[4], top_k=c[5],
                                              top_p=c[6], ties="ties" in c[0], **extra), c[7]))
    return out


def tied_logits(g: np.random.Generator, shape, tied: list[int]) -> np.ndarray:
    """[R, T, V]: request i has ``tied[i]`` equal logits at random ids, −inf elsewhere."""
    x = np.full(shape, -np.inf)
    for i in range(shape[0]):
        for j in range(shape[1]):
            x[i, j, g.choice(shape[2], tied[i], replace=False)] = 0.0
    return x


def random_logits(g: np.random.Generator, shape, ties: bool = False, scale: float = 2.0):
    x = g.normal(0, scale, size=shape)
    return np.round(x * 2) / 2 if ties else x


def sampled_draft(g, p_or_none, k: int, v: int, dup: bool = False):
    """Candidates (k ids, optionally with a duplicate), q over them, and a draft drawn from q."""
    cand = g.choice(v, size=k, replace=False)
    if dup and k > 2:
        cand[1] = cand[0]
    q = g.dirichlet(np.ones(k)).astype(np.float32).astype(np.float64)
    d = cand[int(np.searchsorted(np.cumsum(q), g.random() * q.sum(), side="right").clip(0, k - 1))]
    return cand, q, d


def probs64(logits, temps, top_k, top_p) -> np.ndarray:
    return target_probs(logits, np.asarray(temps), np.asarray(top_k), np.asarray(top_p))
