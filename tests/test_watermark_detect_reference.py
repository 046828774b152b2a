"""Watermark detection scores against a reference written from the definitions alone."""

# The reference shares no code with the detector: Philox-4x32-10 in Python integers (Random123's
# rounds), the context hash and keyed value as watermark/values.py defines them, and the
# statistic of watermark/detect.py's docstring in 50-digit decimals: per scored token
# m = max(lo(r_A), lo(r_B)) with lo(r) = k / 2^23 the lower end of the value's grid cell,
# s = -ln(1 - m^2), the first occurrence of each (context, token) pair only, S = sum of s and
# p = Q(n, S) = e^-S sum_{j<n} S^j / j!. The tolerances are far below what a one-cell shift of m
# moves (a relative 2^-23 / m per token at least), so a detector off by one grid step fails.

from __future__ import annotations

import math
from decimal import Decimal, getcontext

import numpy as np
import pytest
import torch

from dflash2rt.watermark import WatermarkKey, detect, sampler, token_evidence, values

M32 = 0xFFFFFFFF
DIGITS = 50


def philox(counter: tuple[int, int, int, int], key: tuple[int, int]) -> tuple[int, ...]:
    """Philox-4x32-10 (Random123's rounds and constants) of Python integers."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for _ in range(10):
        p0, p1 = 0xD2511F53 * c0, 0xCD9E8D57 * c2
        c0, c1, c2, c3 = (p1 >> 32) ^ c1 ^ k0, p1 & M32, (p0 >> 32) ^ c3 ^ k1, p0 & M32
        k0, k1 = (k0 + 0x9E3779B9) & M32, (k1 + 0xBB67AE85) & M32
    return c0, c1, c2, c3


def context(window: list[int]) -> int:
    """The 64-bit context hash (two's complement) of the tokens before a position."""
    h = len(window)
    words = [(t + 1) & M32 if t >= 0 else 0 for t in window]
    words += [0] * (max(4, h + h % 2) - h)
    ck0, ck1 = values.CONTEXT_KEY
    s0, s1, _, _ = philox(tuple(words[:4]), (ck0 & M32, (ck1 + h) & M32))
    for i in range(4, len(words), 2):
        s0, s1, _, _ = philox((s0, s1, words[i], words[i + 1]), ((ck0 + i) & M32, (ck1 + h) & M32))
    x = (s1 << 32) | s0
    return x - (1 << 64) if x >> 63 else x


def grid_cell(sub, ctx: int, token: int) -> int:
    """k of the keyed value r = (2k + 1)·2⁻²⁴: the first Philox word's top 23 bits."""
    u = ctx & ((1 << 64) - 1)
    return philox((u & M32, u >> 32, token & M32, sub.word), (sub.k0, sub.k1))[0] >> 9


def reference(key: WatermarkKey, tokens: list[int], width: int = 4) -> dict:
    """Per scored position its score (Decimal) or None (a repeated pair), S, n, p and log10 p."""
    getcontext().prec = DIGITS
    scores, seen = [], set()
    for i in range(width, len(tokens)):
        c = context(tokens[i - width:i])
        if (c, tokens[i]) in seen:
            scores.append(None)
            continue
        seen.add((c, tokens[i]))
        m = Decimal(max(grid_cell(key.draft, c, tokens[i]),
                        grid_cell(key.target, c, tokens[i]))) / Decimal(2 ** 23)
        scores.append(-(1 - m * m).ln())
    kept = [s for s in scores if s is not None]
    n, total = len(kept), sum(kept, Decimal(0))
    term, tail = Decimal(1), Decimal(0)
    for j in range(n):                       # Σ_{j<n} S^j / j!
        tail += term
        term = term * total / (j + 1)
    p = (-total).exp() * tail if n else Decimal(1)
    return {"scores": scores, "score": total, "n": n, "p": p, "log10_p": p.log10()}


def _key(i: int) -> WatermarkKey:
    return WatermarkKey(np.random.default_rng(500 + i).bytes(32))


def _watermarked(key: WatermarkKey, n: int, seed: int, width: int = 4, vocab: int = 300) -> list:
    """Tokens drawn by Gumbel-max under subkey B (or A at random) from random laws."""
    g = np.random.default_rng(seed)
    seq = g.integers(0, vocab, width).tolist()
    for _ in range(n):
        probs = torch.softmax(torch.tensor(g.normal(size=vocab) * 2.0), -1).float().view(1, -1)
        ctx = values.context_hash(torch.tensor(seq[-width:]).view(1, -1))
        side = key.target if g.random() < 0.7 else key.draft
        seq.append(int(sampler.draw_dense(side, ctx, probs)[0]))
    return seq


def _texts():
    g = np.random.default_rng(3)
    plain = g.integers(0, 5000, 150).tolist()
    looped = plain[:30] + plain[10:40] * 3 + plain[:30]            # repeated pairs
    big = [values.MAX_TOKEN_ID, 0, values.MAX_TOKEN_ID - 1, 7] * 6 + g.integers(
        2**31, values.MAX_TOKEN_ID, 40).tolist()                     # ids past 2³¹
    return [("plain", _key(0), plain, 4), ("looped", _key(1), looped, 4),
            ("large-ids", _key(2), big, 4), ("width-1", _key(3), plain[:80], 1),
            ("width-7", _key(4), plain[:80], 7),
            ("watermarked", _key(5), _watermarked(_key(5), 60, 1), 4),
            ("watermarked-width-6", _key(6), _watermarked(_key(6), 60, 2, width=6), 6)]


TEXTS = _texts()


@pytest.mark.parametrize("name, key, tokens, width", TEXTS, ids=[t[0] for t in TEXTS])
def test_scores_and_p_value_equal_the_reference(name, key, tokens, width):
    want = reference(key, tokens, width)
    ev = token_evidence(key, tokens, width)
    assert ev["repeated"].tolist() == [s is None for s in want["scores"]]
    kept = np.array([float(s) for s in want["scores"] if s is not None])
    np.testing.assert_allclose(ev["score"][~ev["repeated"]], kept, rtol=1e-13, atol=0)
    got = detect(key, tokens, context_width=width)
    assert got.tokens_scored == want["n"]
    assert got.repeated_skipped == len(want["scores"]) - want["n"]
    assert got.score == pytest.approx(float(want["score"]), rel=1e-13, abs=0)
    assert got.p_value == pytest.approx(float(want["p"]), rel=1e-10, abs=0)
    assert got.log10_p_value == pytest.approx(float(want["log10_p"]), rel=1e-11, abs=1e-12)
    if name.startswith("watermarked"):
        assert got.watermarked and got.log10_p_value < -8


def test_the_reference_is_its_own_definition():
    """The reference's pieces against the library's (bit for bit): so a disagreement above is
    the statistic's, not the reference's."""
    key = _key(7)
    g = np.random.default_rng(9)
    for width in (1, 4, 5, 8):
        win = g.integers(-1, values.MAX_TOKEN_ID, (20, width))
        want = values.context_hash(torch.tensor(win)).tolist()
        assert [context(list(w)) for w in win.tolist()] == want
    ctx = g.integers(-2**63, 2**63 - 1, 50)
    tok = g.integers(0, 200_000, 50)
    for sub in (key.draft, key.target):
        u = values.keyed_uniforms(sub, torch.tensor(ctx), torch.tensor(tok)).double().numpy()
        k = np.array([grid_cell(sub, int(c), int(t)) for c, t in zip(ctx, tok)])
        assert np.array_equal(u, (2 * k + 1) * 2.0 ** -24)
    assert math.isclose(float(reference(key, [1, 2, 3, 4, 5])["p"]),
                        math.exp(-float(reference(key, [1, 2, 3, 4, 5])["score"])), rel_tol=1e-15)
