"""Sample generators: small (always) and exhaustive (skipped by --quick) sets per op.

Every set includes batch 1, prime lengths, non-powers of two and vocabularies that are not a
multiple of 16/32/64. Values come from a NumPy generator seeded per sample; a table's seeds go
by position (first seed + row index), so new rows go at the end of a table.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from .reference.sampling import target_probs


@dataclass(frozen=True, kw_only=True)
class Sample:
    name: str
    seed: int
    params: dict[str, Any] = field(default_factory=dict)
    tier: str = "small"                    # "small" or "exhaustive"


def table_samples(first_seed: int, rows) -> list[Sample]:
    """Samples of a table of rows (dataclasses with ``name`` and ``tier``): seed = first_seed +
    row index, params = the row's other fields."""
    out = []
    for i, row in enumerate(rows):
        params = {k: v for k, v in asdict(row).items() if k not in ("name", "tier")}
        out.append(Sample(name=row.name, seed=first_seed + i, params=params, tier=row.tier))
    return out


HALF_UP = float(np.nextafter(np.float32(0.5), np.float32(1)))     # one float32 ulp above 1/2
HALF_DOWN = float(np.nextafter(np.float32(0.5), np.float32(0)))


def rng(sample: Sample) -> np.random.Generator:
    return np.random.default_rng(sample.seed)


def gen_uniforms(g: np.random.Generator, shape) -> np.ndarray:
    """Uniforms of the generator's form (2k+1)·2^-24."""
    return (2 * g.integers(0, 2 ** 23, size=shape) + 1) * 2.0 ** -24


def noise_samples() -> list[Sample]:
    """r requests × γ positions; seeds / request ids / positions drawn unless given."""
    return [
        Sample(name="batch1_gamma1", seed=1,
               params=dict(r=1, gamma=1, seeds=[0], req=[0], pos=[0])),
        Sample(name="extreme_keys", seed=2,
               params=dict(r=3, gamma=7, seeds=[1, 2 ** 32 + 5, 2 ** 63 - 1],
                           req=[0, 2 ** 32 - 1, 77], pos=[0, 2 ** 31, 2 ** 40 + 3])),
        Sample(name="position_carry_into_hi_word", seed=6,
               params=dict(r=2, gamma=5, seeds=[3, 3], req=[1, 1],
                           pos=[2 ** 32 - 3, 2 ** 33 - 2])),
        Sample(name="batch5_gamma15", seed=3, params=dict(r=5, gamma=15)),
        Sample(name="batch13_gamma3", seed=4, params=dict(r=13, gamma=3), tier="exhaustive"),
        Sample(name="batch2_gamma31", seed=5, params=dict(r=2, gamma=31), tier="exhaustive"),
    ]


@dataclass(frozen=True, kw_only=True)
class ConvShape:
    """block_size rows per block × r requests, hidden channels in ``groups`` groups, ``taps``."""

    name: str
    block: int
    r: int
    hidden: int
    groups: int
    taps: int
    tier: str = "small"


CONV_SHAPES = [
    ConvShape(name="b2_r1_h8_g2_t1", block=2, r=1, hidden=8, groups=2, taps=1),
    ConvShape(name="b3_r2_h24_g3_t3", block=3, r=2, hidden=24, groups=3, taps=3),
    ConvShape(name="b7_r1_h40_g5_t4", block=7, r=1, hidden=40, groups=5, taps=4),
    ConvShape(name="b5_r3_h30_g6_t7_taps_past_block", block=5, r=3, hidden=30, groups=6, taps=7),
    ConvShape(name="b1_r5_h12_g4_t2_single_row_blocks", block=1, r=5, hidden=12, groups=4,
              taps=2),
    ConvShape(name="b16_r3_h96_g12_t3", block=16, r=3, hidden=96, groups=12, taps=3,
              tier="exhaustive"),
    ConvShape(name="b13_r2_h56_g7_t2", block=13, r=2, hidden=56, groups=7, taps=2,
              tier="exhaustive"),
    ConvShape(name="b11_r4_h66_g11_t5", block=11, r=4, hidden=66, groups=11, taps=5,
              tier="exhaustive"),
    # Above every kernel channel tile (block_h 128 / 256) and not a multiple of one; group size
    # 28 straddles the tile edges, so a group index taken within the tile is caught.
    ConvShape(name="b4_r2_h392_g14_t3_multi_tile", block=4, r=2, hidden=392, groups=14, taps=3),
    ConvShape(name="b16_r1_h520_g65_t2_multi_tile", block=16, r=1, hidden=520, groups=65,
              taps=2),
    ConvShape(name="b8_r2_h1000_g40_t4_multi_tile", block=8, r=2, hidden=1000, groups=40,
              taps=4, tier="exhaustive"),
]


def conv_samples() -> list[Sample]:
    return table_samples(100, CONV_SHAPES)


@dataclass(frozen=True, kw_only=True)
class ProbsCase:
    """r requests × t positions over v tokens, per-request temps / top_k / top_p; ``tied``: the
    number of equal logits per request (−inf elsewhere); ``u_max``: draw at u = 1 − 2^-24."""

    name: str
    r: int
    t: int
    v: int
    temps: list
    top_k: list
    top_p: list
    ties: bool = False
    tied: list | None = None
    u_max: bool = False
    tier: str = "small"


PROBS_CASES = [
    ProbsCase(name="batch1_plain_v5", r=1, t=1, v=5, temps=[1.0], top_k=[0], top_p=[1.0]),
    ProbsCase(name="filters_v37", r=4, t=3, v=37, temps=[0.7, 1.0, 1.5, 0.0], top_k=[0, 5, 3, 0],
              top_p=[1.0, 0.9, 0.5, 1.0]),
    ProbsCase(name="t_1e-3_v61", r=2, t=2, v=61, temps=[1e-3, 1e-3], top_k=[0, 4],
              top_p=[1.0, 0.95]),
    ProbsCase(name="ties_topk_v23", r=3, t=2, v=23, temps=[1.0, 1.0, 2.0], top_k=[4, 7, 2],
              top_p=[1.0, 0.8, 1.0], ties=True),
    ProbsCase(name="v100_topp", r=5, t=4, v=100, temps=[0.9] * 5, top_k=[0, 10, 50, 0, 1],
              top_p=[0.3, 0.99, 1.0, 0.6, 1.0], tier="exhaustive"),
    ProbsCase(name="v257", r=2, t=3, v=257, temps=[1.0, 0.5], top_k=[100, 0], top_p=[0.9, 0.95],
              tier="exhaustive"),
    ProbsCase(name="t_tiny_no_overflow_v29", r=3, t=2, v=29, temps=[1e-38, 1.4e-45, 1e-30],
              top_k=[0, 3, 0], top_p=[1.0, 1.0, 0.9]),
    # Exact top-p boundaries: request i has tied[i] equal logits (−inf elsewhere), so the mass
    # ahead of a token is a multiple of 1/tied[i] and lands exactly on top_p (4 ties at 1/2 keep
    # 2; 8 at 1/2 keep 4; 4 at 1/4 keep 1; 2 at 1/2 keep 1; one float32 ulp above / below 1/2
    # keeps 3 / 2; top_k = 3 keeps all 4 ties first; 8 at 3/8 keep 3). sample_next draws at
    # u = 1 − 2^-24: the last kept token, so keeping one token too many changes it.
    ProbsCase(name="topp_boundary_ties_v37", r=8, t=2, v=37,
              temps=[1.0, 1.0, 1.0, 0.8, 1.0, 1.0, 0.7, 1.3], top_k=[0, 0, 0, 0, 0, 0, 3, 0],
              top_p=[0.5, 0.5, 0.25, 0.5, HALF_UP, HALF_DOWN, 0.5, 0.375],
              tied=[4, 8, 4, 2, 4, 4, 4, 8], u_max=True),
    # Real vocabulary sizes (quick tier): random logits through the softmax-only and the
    # torch.topk paths, a greedy row; then exact top-p / top-k boundaries (tied logits) through
    # the sorted path, next to a row with top_k ≥ V (keeps all) in the same batch.
    ProbsCase(name="large_vocab_v151936", r=3, t=2, v=151_936, temps=[1.0, 0.7, 0.0],
              top_k=[0, 50, 0], top_p=[1.0, 1.0, 1.0]),
    ProbsCase(name="large_vocab_topp_ties_v202048", r=4, t=1, v=202_048,
              temps=[1.0, 0.9, 1.2, 1.0], top_k=[0, 0, 3, 202_049], top_p=[0.5, 0.375, 1.0, 1.0],
              tied=[4, 8, 5, 6], u_max=True),
]


def probs_samples() -> list[Sample]:
    return table_samples(300, PROBS_CASES)


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


def sampled_draft(g, k: int, v: int, dup: bool = False):
    """Candidates (k ids, optionally with a duplicate), q over them, and a draft drawn from q."""
    cand = g.choice(v, size=k, replace=False)
    if dup and k > 2:
        cand[1] = cand[0]
    q = g.dirichlet(np.ones(k)).astype(np.float32).astype(np.float64)
    d = cand[int(np.searchsorted(np.cumsum(q), g.random() * q.sum(), side="right").clip(0, k - 1))]
    return cand, q, d


def probs64(logits, temps, top_k, top_p) -> np.ndarray:
    return target_probs(logits, np.asarray(temps), np.asarray(top_k), np.asarray(top_p))
