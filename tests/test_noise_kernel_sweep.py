"""``kernels.noise`` (under the interpreter) against the step's uniforms written anew: for request
r and position p = first[r] + lead + e, Philox-4x32-10 in Python integers (Random123's rounds)
of counter (p lo, p hi, request lo, 0) and key (seed lo, seed hi), all in 64-bit two's
complement, and word w's uniform (2·(w >> 9) + 1)·2⁻²⁴; ``block_noise`` takes slots e < γ of
positions anchor + 1 + e for the walk, accept and residual streams (words 0, 1, 2) and word 3
at anchor + 1 + γ for the bonus. No requests or no positions: an empty result and no launch;
keys not all [R]: ``InvalidInputError``."""

from __future__ import annotations

import pytest
import torch

from dflash2rt.errors import InvalidInputError
from dflash2rt.plugin_kit import interpreting

pytest.importorskip("triton", reason="triton is not installed (pip install 'dflash2rt[triton]')")
if not interpreting():
    pytest.skip("TRITON_INTERPRET is off in this process (a GPU is present, see conftest.py)",
                allow_module_level=True)
from dflash2rt.kernels import noise  # noqa: E402
from dflash2rt.kernels.launch import recording  # noqa: E402
from test_watermark_detect_reference import M32, philox  # noqa: E402


def uniform(word: int) -> float:
    return ((word >> 9) * 2 + 1) * 2.0 ** -24


def ref_words(seed: int, request: int, pos: int) -> list[float]:
    """The four uniforms of one (seed, request, position)."""
    words = philox((pos & M32, (pos >> 32) & M32, request & M32, 0),
                   (seed & M32, (seed >> 32) & M32))
    return [uniform(w) for w in words]


def ref_uniform_words(seed, request, first, n, lead):
    """[4][R][n] nested lists of Python floats."""
    out = [[[0.0] * n for _ in seed] for _ in range(4)]
    for r, (s, q, f) in enumerate(zip(seed, request, first)):
        for e in range(n):
            for w, u in enumerate(ref_words(s, q, f + lead + e)):
                out[w][r][e] = u
    return out


def _t(vals):
    return torch.tensor(vals, dtype=torch.int64)


def test_the_first_random123_known_answer():
    """Seed 0, request 0, position 0: Philox of the zero counter and key, whose words are
    Random123's known answer (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)."""
    got = noise.uniform_words(_t([0]), _t([0]), _t([0]), 1)
    want = [uniform(w) for w in (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)]
    assert got.shape == (4, 1, 1) and got.dtype == torch.float32
    assert got.flatten().tolist() == want


@pytest.mark.parametrize("seed, req, first, n", [
    ([-1], [-3], [2**32 - 2], 5),                          # one request, a block across 2**32
    ([2**63 - 1], [2**62 + 7], [2**40 + 3], 33),           # past one tile of positions
    ([0, -2**63, 12345], [1, 2**33 + 5, -1], [0, 7, 2**32 - 1], 3),
])
def test_uniform_words_without_a_lead_start_at_first(seed, req, first, n):
    """The default lead is 0: positions first[r] + e, e < n."""
    got = noise.uniform_words(_t(seed), _t(req), _t(first), n)
    assert got.tolist() == ref_uniform_words(seed, req, first, n, 0)


def test_uniform_words_with_a_lead_and_narrow_integer_inputs():
    """int32 keys are read as their int64 values; the lead shifts every position."""
    seed, request, first = [-7, 3], [9, -2], [100, 2**31 - 1]
    got = noise.uniform_words(*(torch.tensor(v, dtype=torch.int32) for v in
                                (seed, request, first)), 4, lead=2)
    assert got.tolist() == ref_uniform_words(seed, request, first, 4, 2)


@pytest.mark.parametrize("r, n", [(0, 3), (2, 0), (0, 0)])
def test_no_requests_or_no_positions_give_an_empty_result_without_a_launch(r, n):
    with recording() as rec:
        got = noise.uniform_words(_t([5] * r), _t([1] * r), _t([0] * r), n)
    assert got.shape == (4, r, n) and got.dtype == torch.float32
    assert rec.count == 0


@pytest.mark.parametrize("shapes", [((2, 1), (2, 1), (2, 1)), ((2,), (3,), (2,)),
                                    ((2,), (2,), (1,)), ((), (), ())])
def test_keys_of_other_shapes_are_refused(shapes):
    """A typed error of the dflash2rt hierarchy (what the CLI and the server report as such)."""
    seed, request, first = (torch.zeros(s, dtype=torch.int64) for s in shapes)
    with pytest.raises(InvalidInputError, match="noise kernel: seed, request and first must"):
        noise.uniform_words(seed, request, first, 2)


@pytest.mark.parametrize("gamma", [1, 4])
def test_block_noise_slots_and_bonus(gamma):
    seed, request, anchor = [3, -9], [0, 2**40 + 1], [2**32 - 3, 17]
    got = noise.block_noise(_t(seed), _t(request), _t(anchor), gamma)
    for r in range(2):
        slots = [ref_words(seed[r], request[r], anchor[r] + 1 + e) for e in range(gamma)]
        assert got.walk[r].tolist() == [w[0] for w in slots]
        assert got.accept[r].tolist() == [w[1] for w in slots]
        assert got.residual[r].tolist() == [w[2] for w in slots]
        assert got.bonus[r].item() == ref_words(seed[r], request[r], anchor[r] + 1 + gamma)[3]
    assert got.walk.shape == (2, gamma) and got.bonus.shape == (2,)
