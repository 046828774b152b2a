"""The sample list of the verify op: the hand-made adversarial cases (``corpus``), random blocks,
and the bug-class cases of ``corpus_edges``. Seeds go by position within each table."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import numpy as np

from . import corpus, corpus_edges
from .corpus import random_case
from .samples import Sample, rng, table_samples


@dataclass(frozen=True, kw_only=True)
class HandCase:
    """A case whose inputs ``build(generator)`` makes (its docstring says what it pins down)."""

    name: str
    build: Callable[[np.random.Generator], dict]
    tier: str = "small"


@dataclass(frozen=True, kw_only=True)
class RandomCase:
    """``corpus.random_case``: r requests × γ slots over v tokens, k candidates, per-request
    temps / top_k / top_p (filters off when None); ``dup``: duplicated candidates."""

    name: str
    r: int
    gamma: int
    v: int
    k: int
    temps: list
    top_k: list | None = None
    top_p: list | None = None
    dup: bool = False
    tier: str = "small"


HAND_CASES = [
    HandCase(name="u_at_threshold", build=corpus.u_at_threshold),
    HandCase(name="p_zero_u_to_0", build=corpus.p_zero),
    HandCase(name="p_equals_q", build=corpus.p_equals_q),
    HandCase(name="empty_residual_falls_back_to_p", build=corpus.empty_residual),
    HandCase(name="greedy_ties_lowest_index", build=corpus.greedy_ties),
    HandCase(name="nan_inf_rows_flagged", build=corpus.nonfinite_rows),
    HandCase(name="duplicated_candidates", build=corpus.duplicated_candidates),
    HandCase(name="mask_id_tokens", build=corpus.mask_id_tokens),
    HandCase(name="draft_outside_q_flagged", build=corpus.bad_q),
    HandCase(name="nonfinite_q_flagged", build=corpus.nonfinite_q),
]

RANDOM_CASES = [
    RandomCase(name="batch1_v5", r=1, gamma=3, v=5, k=3, temps=[1.0]),
    RandomCase(name="mixed_v37", r=5, gamma=4, v=37, k=5, temps=[0.0, 0.8, 1.0, 1.7, 0.0],
               top_k=[0, 5, 0, 0, 0], top_p=[1.0, 1.0, 0.9, 1.0, 1.0]),
    RandomCase(name="t_1e-3_v31", r=3, gamma=3, v=31, k=4, temps=[1e-3] * 3),
    RandomCase(name="dup_candidates_random_v23", r=4, gamma=5, v=23, k=6, temps=[1.0] * 4,
               dup=True),
    RandomCase(name="b16_v61", r=3, gamma=15, v=61, k=8, temps=[0.0, 1.0, 0.6], top_k=[0, 0, 20],
               top_p=[1.0, 0.95, 1.0], tier="exhaustive"),
    RandomCase(name="v97", r=2, gamma=7, v=97, k=16, temps=[1.2, 1.0], top_p=[0.8, 1.0],
               tier="exhaustive"),
    RandomCase(name="v129", r=6, gamma=5, v=129, k=32, temps=[1.0, 0.0, 0.9, 1.1, 0.0, 2.0],
               tier="exhaustive"),
    RandomCase(name="t_tiny_v31", r=3, gamma=3, v=31, k=4, temps=[1e-38, 1.4e-45, 1e-30]),
]

EDGE_CASES = [
    HandCase(name="topp_boundary_ties", build=corpus_edges.topp_boundary_ties),
    HandCase(name="deep_accept_b16_greedy_every_slot", build=corpus_edges.deep_accept_greedy),
    HandCase(name="deep_accept_b16_sampled_every_slot", build=corpus_edges.deep_accept_sampled),
    HandCase(name="vocab_chunks_greedy_ties_v3001", build=corpus_edges.chunk_greedy_ties),
    HandCase(name="vocab_chunks_residual_bonus_v3001", build=corpus_edges.chunk_residual_bonus),
    HandCase(name="real_vocab_v151936", build=corpus_edges.real_vocab,
             tier="exhaustive"),                      # ~18 s in the Triton interpreter
    HandCase(name="accept_f32_vs_f64_q_not_pow2", build=corpus_edges.f32_product_flips),
    # Large vocabularies in the quick tier, sized for the Triton interpreter (one γ = 1 request
    # per kind; a sampled program there costs ~2 s at V = 202,048).
    HandCase(name="large_vocab_v151936_greedy_plain",
             build=functools.partial(corpus_edges.large_vocab, v=151_936,
                                     kinds=("greedy", "plain"))),
    HandCase(name="large_vocab_v202048_topk_topp",
             build=functools.partial(corpus_edges.large_vocab, v=202_048,
                                     kinds=("greedy", "top_k", "top_p"))),
]


def verify_samples() -> list[Sample]:
    """Hand cases (seeds 400…), random blocks (500…), edge cases (450…), in that order."""
    return (table_samples(400, HAND_CASES) + table_samples(500, RANDOM_CASES)
            + table_samples(450, EDGE_CASES))


def build_verify_case(sample: Sample) -> dict:
    """The NumPy inputs of one verify sample."""
    params, g = sample.params, rng(sample)
    if "build" in params:
        return params["build"](g)
    return random_case(g, **params)
