"""The detector: p-values uniform (never anti-conservative) under H0, watermarked token sequences
from the Gumbel-max sampler detected whichever side drew them, deduplication, the exact null."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from dflash2rt.errors import InvalidInputError
from dflash2rt.watermark import WatermarkKey, detect, sampler, token_evidence, values
from dflash2rt.watermark.detect import gamma_sf


def _key(i: int) -> WatermarkKey:
    return WatermarkKey(np.random.default_rng(1000 + i).bytes(32))


def _ks(p: np.ndarray) -> float:
    """Kolmogorov-Smirnov distance of a sample to U(0, 1)."""
    p = np.sort(p)
    n = len(p)
    return float(max(np.max(np.arange(1, n + 1) / n - p), np.max(p - np.arange(n) / n)))


def test_gamma_sf_exact_values():
    assert gamma_sf(1, 2.0)[0] == pytest.approx(math.exp(-2.0), rel=1e-14)
    assert gamma_sf(3, 2.0)[0] == pytest.approx(math.exp(-2) * (1 + 2 + 2), rel=1e-14)
    assert gamma_sf(0, 5.0) == (1.0, 0.0) and gamma_sf(4, 0.0) == (1.0, 0.0)
    p, log10 = gamma_sf(100, 400.0)
    assert p == pytest.approx(10 ** log10, rel=1e-9) and log10 < -70
    assert gamma_sf(10, 5000.0)[0] == 0.0 and gamma_sf(10, 5000.0)[1] < -2000   # log: no underflow
    assert gamma_sf(10_000, 0.5)[0] == pytest.approx(1.0)


def test_p_values_uniform_under_h0():
    """600 random texts (random lengths, random keys): KS distance to U(0, 1) within the 0.1%
    critical value, and the empirical rates at 1% / 10% within sampling error."""
    g = np.random.default_rng(7)
    ps = np.array([detect(_key(i), g.integers(0, 5000, int(g.integers(8, 80))).tolist()).p_value
                   for i in range(600)])
    assert _ks(ps) < 1.95 / math.sqrt(len(ps))
    assert (ps <= 0.10).mean() < 0.10 + 3 * math.sqrt(0.09 / 600)
    assert (ps <= 0.01).mean() < 0.01 + 3 * math.sqrt(0.0099 / 600)


def test_null_score_is_exp1_per_token():
    """The per-token statistic over many distinct (context, token) pairs: mean 1, variance 1,
    P(s > 3) = e^-3 (Exp(1))."""
    ev = token_evidence(_key(0), np.random.default_rng(8).integers(0, 50_000, 60_000).tolist())
    s = ev["score"][~ev["repeated"]]
    n = len(s)
    assert abs(s.mean() - 1) < 5 / math.sqrt(n) and abs(s.var() - 1) < 10 / math.sqrt(n)
    assert abs((s > 3).mean() - math.exp(-3)) < 5 * math.sqrt(math.exp(-3) / n)


def _generate(key, n_tokens, seed, sides="B", vocab=300, width=4):
    """A toy LM: a random law per step (logits N(0, 2²)), tokens drawn by Gumbel-max under the
    side's subkey (for "AB", each token's side is chosen at random, as speculative decoding
    does) from the context of the last ``width`` tokens."""
    g = np.random.default_rng(seed)
    seq = g.integers(0, vocab, width).tolist()
    for _ in range(n_tokens):
        probs = torch.softmax(torch.tensor(g.normal(size=vocab) * 2.0), -1).float().view(1, -1)
        ctx = values.context_hash(torch.tensor(seq[-width:]).view(1, -1))
        side = sides[int(g.integers(0, len(sides)))]
        seq.append(int(sampler.draw_dense(key.subkey(side), ctx, probs)[0]))
    return seq


@pytest.mark.parametrize("sides", ["B", "A", "AB"])
def test_watermarked_sequences_detected(sides):
    key = _key(1)
    for doc in range(5):
        seq = _generate(key, 64, seed=doc, sides=sides)
        res = detect(key, seq, fpr=0.001)
        assert res.watermarked and res.p_value < 1e-6, res
        assert res.tokens_scored == 64 and res.tokens_total == 68
        assert detect(_key(2), seq).p_value > 1e-5           # another key sees nothing


def test_repeated_context_token_pairs_scored_once():
    key = _key(3)
    seq = _generate(key, 32, seed=9)
    looped = seq + seq[:8] * 6 + seq
    res = detect(key, looped)
    base = detect(key, seq)
    ev = token_evidence(key, looped)
    assert res.tokens_scored == len(set(zip(ev["context"].tolist(), ev["token"].tolist())))
    assert res.repeated_skipped == len(ev["token"]) - res.tokens_scored
    assert res.repeated_skipped >= len(seq) - 4           # the second copy adds nothing new
    assert res.tokens_scored - base.tokens_scored <= 8 * 6 + 4
    assert detect(key, [5, 6, 7, 8] * 50).tokens_scored == 4


def test_short_texts_and_bad_input():
    key = _key(4)
    r = detect(key, [1, 2, 3])
    assert (r.tokens_scored, r.p_value, r.watermarked, r.tokens_total) == (0, 1.0, False, 3)
    assert detect(key, []).tokens_scored == 0
    assert set(r.as_dict()) >= {"p_value", "score", "tokens_scored", "watermarked"}
    with pytest.raises(InvalidInputError, match="token 1"):
        detect(key, [1, -2, 3])
    with pytest.raises(InvalidInputError, match="token ids"):
        detect(key, "hello")
    with pytest.raises(InvalidInputError, match="fpr"):
        detect(key, [1, 2], fpr=0)
    with pytest.raises(InvalidInputError, match="context width"):
        detect(key, [1, 2], context_width=0)
    with pytest.raises(InvalidInputError, match="WatermarkKey"):
        detect(b"\0" * 32, [1, 2])


def test_repeated_unmarked_text_is_no_evidence():
    """Text repeated many times (a model stuck in a loop, a quoted passage) is scored once per
    distinct (context, token) pair: the p-value of a repeated unmarked text is that of its
    distinct pairs, however many copies, so a loop never turns into a detection. Over texts
    whose single copy already scores above its mean (the case a per-token count would blow
    up), the p-value of 30 copies stays the single copy's up to the few pairs the copies'
    seams add."""
    key = _key(5)
    g = np.random.default_rng(55)
    checked = 0
    for _ in range(60):
        seq = g.integers(0, 1000, 24).tolist()
        one = detect(key, seq)
        if one.score <= one.tokens_scored:                  # at or below the null mean
            continue
        many = detect(key, seq * 30)
        ev = token_evidence(key, seq * 30)
        distinct = len(set(zip(ev["context"].tolist(), ev["token"].tolist())))
        assert many.tokens_scored == distinct <= one.tokens_scored + 4
        assert many.log10_p_value >= one.log10_p_value - 2, (one, many)
        assert many.watermarked <= (one.p_value < 0.05)
        checked += 1
    assert checked >= 10
