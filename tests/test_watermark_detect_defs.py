"""The detector's inputs and verdict against watermark.md and detect.py's definitions: the
context width, the false-positive rate and the token containers edge by edge, one condition
wrong at a time; the default rate and the verdict p ≤ fpr at its boundary; the gamma tail
against its sum in decimals; one evidence entry per scored position; a verdict that cannot
change.

Classes of bug held: a width or rate bound off by one step (a closed end where (0, 1) is
open); a container check whose conditions are joined the wrong way (a str, bytes or a set of
ids read as tokens); a default rate other than the documented 1 %, or a verdict that is strict
where the definition is not; a p-value above 1 (a log10 above 0) where the tail's sum rounds
past 1; evidence arrays of unequal lengths (a context row for a text too short to score); a
mutable result."""

from __future__ import annotations

import dataclasses
import math
from decimal import Decimal, localcontext

import numpy as np
import pytest
import torch

from dflash2rt.errors import InvalidInputError
from dflash2rt.watermark import WatermarkKey, detect, token_evidence
from dflash2rt.watermark.detect import gamma_sf

KEY = WatermarkKey(np.random.default_rng(77).bytes(32))
TOKENS = np.random.default_rng(78).integers(0, 5000, 90).tolist()


@pytest.mark.parametrize("width", [1, 2, 63, 64])
def test_context_widths_inside_the_domain_are_kept(width):
    tokens = TOKENS + TOKENS[:10]
    got = detect(KEY, tokens, context_width=width)
    assert got.context_width == width
    assert got.tokens_total == 100
    assert got.tokens_scored + got.repeated_skipped == 100 - width


@pytest.mark.parametrize("width", [0, -1, 65, 2**63, True, 4.0, "4", None])
def test_context_widths_outside_the_domain_are_refused(width):
    with pytest.raises(InvalidInputError, match=r"context width must be an integer in \[1, 64\]"):
        detect(KEY, TOKENS, context_width=width)


@pytest.mark.parametrize("tokens", [TOKENS, tuple(TOKENS), torch.tensor(TOKENS)],
                         ids=["list", "tuple", "tensor"])
def test_token_sequences_are_read(tokens):
    want = detect(KEY, list(TOKENS))
    assert detect(KEY, tokens) == want


@pytest.mark.parametrize("tokens, kind", [
    ("\x01\x02\x03\x04\x05\x06", "str"),         # a sequence, but of text
    (b"\x01\x02\x03\x04\x05\x06", "bytes"),      # a sequence of valid ids, but bytes
    ({1, 2, 3, 4, 5, 6}, "set"),                 # valid ids, not a sequence
    (iter([1, 2, 3, 4, 5, 6]), "list_iterator"),
    ({1: 2, 3: 4, 5: 6, 7: 8, 9: 10}, "dict"),
    (7, "int"),
    (None, "NoneType"),
])
def test_token_containers_refused_one_condition_at_a_time(tokens, kind):
    with pytest.raises(InvalidInputError,
                       match=rf"^tokens must be a list of integer token ids, got {kind}$"):
        detect(KEY, tokens)


def _p_between(lo: float, hi: float):
    """The first random text (fixed seeds) whose p-value lies in (lo, hi]."""
    g = np.random.default_rng(79)
    for _ in range(5000):
        tokens = g.integers(0, 5000, 40).tolist()
        r = detect(KEY, tokens, fpr=0.5)
        if lo < r.p_value <= hi:
            return tokens, r.p_value
    raise AssertionError("no text found")


def test_default_fpr_is_one_percent_and_the_verdict_is_p_at_most_fpr():
    tokens, p = _p_between(0.01, 0.02)
    got = detect(KEY, tokens)
    assert got.fpr == 0.01 and got.p_value == p
    assert got.watermarked is False
    assert detect(KEY, tokens, fpr=p).watermarked is True              # p ≤ fpr, at equality
    assert detect(KEY, tokens, fpr=math.nextafter(p, 0)).watermarked is False
    tokens, p = _p_between(0.005, 0.01)
    assert detect(KEY, tokens).watermarked is True


def test_the_result_cannot_be_changed():
    got = detect(KEY, TOKENS)
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.watermarked = True
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.p_value = 0.0


def q_reference(n: int, x: float) -> Decimal:
    """Q(n, x) = e^-x Σ_{j<n} x^j / j! in 40-digit decimals."""
    with localcontext() as ctx:
        ctx.prec = 40
        xd, term, tail = Decimal(x), Decimal(1), Decimal(0)
        for j in range(n):
            tail += term
            term = term * xd / (j + 1)
        return (-xd).exp() * tail


@pytest.mark.parametrize("n", [1, 2, 5, 10, 50, 100, 1000])
def test_gamma_tail_is_a_probability_and_equals_its_definition(n):
    """Next to Q = 1 (small x, large n) the log-space sum rounds past 0 on several cells: the
    p-value stays at most 1 and its log10 at most 0; both equal the definition (log10 to an
    absolute 1e-11 next to 0, where the sum of up to 1000 terms carries its rounding)."""
    for x in (1e-3, 1e-2, 0.1, 0.5, 1.0, 2.0, 5.0, 50.0, 400.0):
        p, log10_p = gamma_sf(n, x)
        want = q_reference(n, x)
        assert 0.0 <= p <= 1.0 and log10_p <= 0.0, (n, x, p, log10_p)
        assert p == pytest.approx(float(want), rel=1e-10, abs=0), (n, x)
        with localcontext() as ctx:
            ctx.prec = 40
            assert log10_p == pytest.approx(float(want.log10()), rel=1e-10, abs=1e-11), (n, x)


@pytest.mark.parametrize("width", [1, 4, 6])
def test_evidence_has_one_row_per_scored_position(width):
    """Texts of 0 .. width + 2 tokens: every evidence array has exactly one entry per position
    with a full window (none for a text of at most ``width`` tokens)."""
    for n in range(width + 3):
        ev = token_evidence(KEY, TOKENS[:n], width)
        scored = max(0, n - width)
        assert ev["position"].tolist() == list(range(width, n))
        assert ev["token"].tolist() == TOKENS[width:n]
        for name in ("context", "r_draft", "r_target", "score", "repeated"):
            assert ev[name].shape == (scored,), (name, n)


@pytest.mark.parametrize("fpr", [5e-324, 1e-300, 0.25, 0.5, math.nextafter(1.0, 0.0)])
def test_rates_inside_the_open_interval_are_kept(fpr):
    got = detect(KEY, TOKENS, fpr=fpr)
    assert got.fpr == fpr and got.watermarked is (got.p_value <= fpr)


@pytest.mark.parametrize("fpr", [0, 0.0, -0.0, 1, 1.0, math.nextafter(1.0, 2.0), -1e-300,
                                 float("nan"), float("inf"), True, False, "0.01", None])
def test_rates_outside_the_open_interval_are_refused(fpr):
    with pytest.raises(InvalidInputError, match=r"^fpr must be a number in \(0, 1\), got "):
        detect(KEY, TOKENS, fpr=fpr)
