"""Keyed watermark values against their definitions (watermark/values.py's docstring), written
anew here: -log r bit for bit on every cell of the value grid, the context hash of windows of
any leading shape, and the token-id domain edge by edge.

Each test holds a class of bug: a series one term longer or shorter, or started at the wrong
coefficient, changes the last bit of -log r on a few cells of the 2^23 (a sample of cells
misses them); a window batch concatenated along a fixed axis hashes only 2-D batches right;
an id bound off by one either refuses the top vocabulary id or lets in the id whose window
word wraps onto the "before the start" word."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dflash2rt.errors import InvalidInputError
from dflash2rt.watermark import values
from dflash2rt.watermark.detect import check_tokens
from test_watermark_detect_reference import philox      # Philox-4x32-10 of Python integers

M32 = 0xFFFFFFFF
CONTEXT_KEY = (0x6A09E667, 0x3C6EF372)      # the documented public key of the context hash


def context(window: list[int]) -> int:
    """The definition: words id + 1 (0 before the start), zero-padded to 4 then to an even
    count; Philox of words 0..3 under (CK0, CK1 + h), then of (s0, s1, w_i, w_i+1) under
    (CK0 + i, CK1 + h) for i = 4, 6, ...; the hash is s1:s0 as a signed 64-bit integer."""
    h = len(window)
    words = [(t + 1) & M32 if t >= 0 else 0 for t in window]
    while len(words) < 4 or len(words) % 2:
        words.append(0)
    s0, s1, _, _ = philox(tuple(words[:4]), (CONTEXT_KEY[0], (CONTEXT_KEY[1] + h) & M32))
    for i in range(4, len(words), 2):
        s0, s1, _, _ = philox((s0, s1, words[i], words[i + 1]),
                              ((CONTEXT_KEY[0] + i) & M32, (CONTEXT_KEY[1] + h) & M32))
    x = (s1 << 32) | s0
    return x - (1 << 64) if x >> 63 else x


def neg_log_reference(u: np.ndarray) -> np.ndarray:
    """-log u as the docstring fixes it: u = m·2^e (m ∈ [1/2, 1)), s = (1 - m) / (1 + m),
    2s·Σ_{j<18} s^2j / (2j + 1) in Horner form from the highest term, minus e·ln 2."""
    m, e = np.frexp(u.astype(np.float64))
    s = (1.0 - m) / (1.0 + m)
    z = s * s
    acc = np.full_like(z, 1.0 / 35.0)
    for j in range(16, -1, -1):
        acc = acc * z + 1.0 / (2 * j + 1)
    return (2.0 * s) * acc - e.astype(np.float64) * 0.6931471805599453


def test_neg_log_bit_exact_on_every_cell_of_the_grid():
    """All 2^23 values (2k + 1)·2⁻²⁴: the same bits as the definition everywhere (the series'
    length and its first coefficient each change a few hundred cells only), and within a few
    ulp of the true -log."""
    for lo in range(0, 2**23, 2**21):
        k = np.arange(lo, lo + 2**21, dtype=np.float64)
        u = ((2 * k + 1) * 2.0 ** -24).astype(np.float32)
        assert np.array_equal(u.astype(np.float64), (2 * k + 1) * 2.0 ** -24)   # exact grid
        got = values.neg_log(torch.from_numpy(u))
        assert got.dtype == torch.float64
        got = got.numpy()
        want = neg_log_reference(u)
        bad = np.flatnonzero(got != want)
        assert bad.size == 0, (lo, bad[:5], u[bad[:5]])
        true = -np.log(u.astype(np.float64))
        assert np.max(np.abs(got - true) / true) < 1e-15


def test_neg_log_keeps_the_shape_and_reads_float64_input():
    u = torch.tensor([[0.5, 2.0 ** -24], [0.75, 1 - 2.0 ** -24]], dtype=torch.float64)
    got = values.neg_log(u)
    assert got.shape == (2, 2)
    assert np.array_equal(got.numpy(), neg_log_reference(u.numpy()))


@pytest.mark.parametrize("h", [1, 2, 3, 4, 5, 6, 7])
def test_context_hash_of_windows_of_any_leading_shape(h):
    """[h], [N, h] and [A, B, h] windows (the padded widths below 4 and the odd ones above):
    each window's hash is the definition's, whatever the batch's number of dimensions."""
    g = np.random.default_rng(h)
    win = g.integers(-1, 2**32 - 1, (2, 3, h))
    win[0, 1, :] = -1                                      # a window wholly before the start
    win[1, 2, 0] = 2**32 - 2                               # the top id
    want = [[context(list(w)) for w in row] for row in win.tolist()]
    t = torch.from_numpy(win)
    assert values.context_hash(t).tolist() == want                     # [A, B, h]
    assert values.context_hash(t.reshape(6, h)).tolist() == sum(want, [])  # [N, h]
    assert values.context_hash(t[1, 2]).tolist() == want[1][2]          # [h]: a 0-d hash
    assert values.context_hash(t[1, 2]).shape == ()


def test_token_id_domain_edges():
    """Token ids are [0, 2³² - 2]: the top id is kept exactly, the next one (whose window word
    id + 1 wraps to the "before the start" word 0) and -1 are refused naming the token."""
    top = 2**32 - 2
    assert values.MAX_TOKEN_ID == top
    assert check_tokens([0, top, 7]).tolist() == [0, top, 7]
    for i, bad in ((0, top + 1), (2, 2**32), (1, -1)):
        tokens = [3, 4, 5]
        tokens[i] = bad
        with pytest.raises(InvalidInputError, match=rf"token {i} is {bad}"):
            check_tokens(tokens)
    for array in (np.array([0, top, 7], np.int64), torch.tensor([0, top, 7])):
        assert check_tokens(array).tolist() == [0, top, 7]
    with pytest.raises(InvalidInputError, match="token 1 is 4294967295"):
        check_tokens(np.array([0, top + 1], np.uint64))
    with pytest.raises(InvalidInputError, match="token 0 is 1.0"):
        check_tokens(np.array([1.0, 2.0]))
    with pytest.raises(InvalidInputError, match="token 0 is \\[1, 2\\]"):
        check_tokens(np.array([[1, 2]]))
    # why the bound is where it is: the top id hashes apart from "before the start"
    assert context([top]) != context([-1])
    assert context([top + 1]) == context([-1])
    assert values.context_hash(torch.tensor([[top], [-1]])).tolist() == \
        [context([top]), context([-1])]
