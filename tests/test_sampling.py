"""Logit processing (temperature, top-k, top-p), parameter checks, and the induced law."""

from __future__ import annotations

import pytest
import torch

from dflash2rt.errors import SamplingParamsError
from dflash2rt.ops import exact32
from dflash2rt.ops.batch import BlockNoise, SamplingBatch
from dflash2rt.ops.sampling import (check_sampling_params, inverse_cdf, target_logprobs,
                                    target_probs)
from dflash2rt.ops.verify import verify


def _probs(logits, t=1.0, k=0, p=1.0):
    return target_probs(logits.view(1, 1, -1), torch.tensor([t]), torch.tensor([k]),
                        torch.tensor([p]))[0, 0]


def test_temperature_top_k_top_p():
    x = torch.tensor([2.0, 1.0, 1.0, 0.0, -1.0])
    torch.testing.assert_close(_probs(x, t=0.5), torch.softmax(x / 0.5, -1))
    p = _probs(x, k=2)   # ties with the k-th value are kept
    assert bool((p[:3] > 0).all()) and bool((p[3:] == 0).all())
    full = torch.softmax(x, -1)
    p = _probs(x, p=float(full[0]))        # mass of the top token alone reaches top_p
    assert p.tolist() == [1.0, 0.0, 0.0, 0.0, 0.0]
    p = _probs(x, p=float(full[0]) + 1e-3)  # needs the next token (lower id wins the tie)
    assert bool(p[1] > 0) and float(p[2]) == 0.0
    assert bool((_probs(x, p=1.0) > 0).all())


@pytest.mark.parametrize("t,k,p", [(-0.1, 0, 1.0), (float("nan"), 0, 1.0), (float("inf"), 0, 1.0),
                                   (1.0, -1, 1.0), (1.0, 1.5, 1.0), (1.0, 0, 0.0),
                                   (1.0, 0, 1.01)])
def test_bad_sampling_values_raise(t, k, p):
    with pytest.raises(SamplingParamsError):
        check_sampling_params(t, k, p)
    with pytest.raises(SamplingParamsError):
        SamplingBatch.build([t], [k], [p])


def test_inverse_cdf_skips_zero_weights_and_clamps():
    w = torch.tensor([0.0, 0.25, 0.0, 0.75, 0.0], dtype=torch.float64)
    assert int(inverse_cdf(w, torch.tensor(1e-9))) == 1
    assert int(inverse_cdf(w, torch.tensor(0.25))) == 3
    assert int(inverse_cdf(w, torch.tensor(1.0))) == 3   # clamped to the last positive weight


def test_induced_law_of_draft_then_verify_is_p():
    """Enumerate walk, accept and residual uniforms on a lattice: the output law is p."""
    n = 48
    grid = (torch.arange(n, dtype=torch.float64) + 0.5) / n
    uw, ua, ur = (t.reshape(-1).float() for t in torch.meshgrid(grid, grid, grid, indexing="ij"))
    rows = uw.numel()
    logits = torch.tensor([[0.4, -0.3, 1.2, 0.1], [0.0, 0.0, 0.0, 0.0]]).expand(rows, 2, 4)
    q_law = torch.tensor([0.1, 0.5, 0.15, 0.25])
    draft = inverse_cdf(q_law.double().expand(rows, 4), uw).view(rows, 1)
    cand = torch.arange(4).expand(rows, 1, 4)
    q = q_law.expand(rows, 1, 4)
    sampling = SamplingBatch.build([1.0] * rows, [0] * rows, [1.0] * rows)
    noise = BlockNoise(uw.view(rows, 1), ua.view(rows, 1), ur.view(rows, 1), ua)
    out = verify(logits, draft, cand, q, sampling, noise)
    first = out.tokens[:, 0]
    law = torch.bincount(first, minlength=4).double() / rows
    p = torch.softmax(torch.tensor([0.4, -0.3, 1.2, 0.1], dtype=torch.float64), -1)
    assert float((law - p).abs().sum()) / 2 < 3 / n   # lattice resolution
    accept = float((out.accept_len == 1).double().mean())
    tv_pq = float((p - q_law.double()).abs().sum()) / 2
    assert abs(accept - (1 - tv_pq)) < 3 / n


# ---- the float32 formulation (devices without float64, ops.exact32) ----
def test_inverse_cdf32_reads_the_low_part():
    """w = (1 + 2^-30, 1), u = 1/2: the target 1 + 2^-31 falls below the first CDF step only
    when the low part 2^-30 is counted (float64 counts it)."""
    hi, lo = torch.tensor([[1.0, 1.0]]), torch.tensor([[2.0 ** -30, 0.0]])
    u = torch.tensor([0.5])
    assert inverse_cdf(hi.double() + lo.double(), u).tolist() == [0]
    assert exact32.inverse_cdf32(hi, u, lo).tolist() == [0]
    assert exact32.inverse_cdf32(hi, u).tolist() == [1]


def test_inverse_cdf32_scales_subnormal_weights():
    """w = 3 × 2^-149, u = 1/2: u·total = 1.5·2^-149 is no float32; scaled first, it is exact."""
    w, u = torch.full((1, 3), 2.0 ** -149), torch.tensor([0.5])
    assert exact32.inverse_cdf32(w, u).tolist() == inverse_cdf(w.double(), u).tolist() == [1]


def test_mantissa_exponent_from_bits_matches_frexp():
    x = torch.randint(-2 ** 31, 2 ** 31 - 1, (50000,), generator=torch.Generator().manual_seed(9),
                      dtype=torch.int64).to(torch.int32).view(torch.float32)
    x = torch.cat([x[torch.isfinite(x) & (x != 0)], torch.tensor([2.0 ** -149, -2.0 ** -127])])
    m, e = exact32._mant_exp(x)
    f, want_e = torch.frexp(x)
    assert torch.equal(m, (f * 2.0 ** 24).to(torch.int64))
    assert torch.equal(e, want_e.to(torch.int64) - 24)


def _weights(g, shape, kind):
    w = torch.rand(*shape, generator=g) ** 4
    w[torch.rand(*shape, generator=g) < 0.3] = 0.0
    w[..., -3:] = 0.0                                           # trailing zeros: the clamp
    if kind == "tiny":
        w = w * 1e-38                                           # subnormal weights
    if kind == "dyadic":
        w = torch.randint(0, 16, shape, generator=g).to(torch.float32) / 16
    return w


@pytest.mark.parametrize("kind", ["plain", "tiny", "dyadic"])
def test_inverse_cdf32_matches_float64(kind):
    g = torch.Generator().manual_seed(2)
    w = _weights(g, (64, 300), kind)
    w[0] = 0.0                                                  # no mass
    for u in (torch.rand(64, generator=g), torch.full((64,), 1 - 2.0 ** -24),
              torch.full((64,), 2.0 ** -24), torch.randint(0, 16, (64,), generator=g) / 16,
              torch.randint(0, 16, (64,), generator=g) / 16 + 1 / 32):
        u = u.to(torch.float32)
        assert torch.equal(exact32.inverse_cdf32(w, u), inverse_cdf(w.double(), u))


def test_inverse_cdf32_bad_laws():
    nan, inf = float("nan"), float("inf")
    w = torch.tensor([[0.2, 0.3], [nan, 1.0], [inf, 1.0], [-0.1, 1.0], [0.0, 0.0]])
    u = torch.full((5,), 0.5)
    assert exact32.inverse_cdf32(w, u).tolist() == inverse_cdf(w.double(), u).tolist() \
        == [1, -1, -1, -1, -1]


MIXES = [(1.0, 0, 1.0, 0.0), (0.7, 3, 1.0, 0.0), (1.3, 0, 0.6, 0.0), (0.9, 2, 0.8, 0.0),
         (1.0, 0, 1.0, 0.2), (0.5, 4, 0.9, 0.1), (0.0, 0, 1.0, 0.0), (2.0, 1, 1.0, 0.0),
         (1.0, 0, 1.0, 1.0)]                      # min-p 1: the most likely tokens only


@pytest.mark.parametrize("seed", range(6))
def test_mixed_batches_match_the_float64_reference_row_by_row(seed):
    """Batches mixing rows with and without top-k / top-p / min-p (so that the host facts send
    some rows down the sorted path and others not), logits with ties and −inf: target_probs
    and target_logprobs of each row equal the float64 reference's law of that row."""
    from dflash2rt_conformance.reference import sampling as ref

    g = torch.Generator().manual_seed(seed)
    rows = [MIXES[i] for i in torch.randperm(len(MIXES), generator=g)[:2 + seed % 5].tolist()]
    r, t, v = len(rows), 2, 11
    logits = (torch.randint(-4, 4, (r, t, v), generator=g) / 2).float()     # ties
    logits[torch.rand(r, t, v, generator=g) < 0.15] = float("-inf")
    logits[..., 0] = 1.0                                                   # a finite entry
    logits[..., 1] = -30.0                               # p ~ 1e-14: after the mass reaches 1
    temps, ks, ps, mps = (list(c) for c in zip(*rows))
    sb = SamplingBatch.build(temps, ks, ps, min_p=mps)
    args = (logits, sb.temperature, sb.top_k, sb.top_p)
    facts = dict(top_k_max=sb.top_k_max, top_p_rows=sb.top_p_rows, min_p=sb.min_p)
    want = ref.target_probs(logits.double().numpy(), temps, ks, ps, mps)
    for unknown in (False, True):           # True: no host facts (graph bodies): all sorted
        if unknown:
            facts.update(top_k_max=None, top_p_rows=None)
        _check_rows(rows, want, target_probs(*args, **facts), target_logprobs(*args, **facts))


def _check_rows(rows, want, p, lp):
    for i in range(len(rows)):
        got, w = p[i].double(), torch.from_numpy(want[i])
        assert torch.equal(got == 0, w == 0), rows[i]               # the same tokens kept
        torch.testing.assert_close(got, w, atol=2e-6, rtol=1e-5, msg=str(rows[i]))
        kept = w > 0
        assert bool(torch.isneginf(lp[i][~kept]).all()), rows[i]
        torch.testing.assert_close(lp[i][kept].double(), torch.log(w[kept]), atol=2e-5,
                                   rtol=1e-5, msg=str(rows[i]))


def test_min_p_off_leaves_a_row_bit_for_bit():
    """Rows with min_p = 0 beside rows with min-p: their probabilities and log-probabilities
    are exactly what they are without min-p (not renormalized)."""
    from dflash2rt.ops.sampling import apply_min_p

    logits = torch.randn(2, 3, 50, generator=torch.Generator().manual_seed(8))
    args = (logits, torch.tensor([0.7, 1.3]), torch.tensor([0, 5]), torch.tensor([1.0, 0.9]))
    p = target_probs(*args)
    with_min_p = apply_min_p(p, torch.tensor([0.0, 0.3]))
    assert torch.equal(with_min_p[0], p[0]) and not torch.equal(with_min_p[1], p[1])
    lp = target_logprobs(*args, min_p=torch.tensor([0.0, 0.3]))
    assert torch.equal(lp[0], target_logprobs(*args)[0])


def test_no_temperature_overflows_the_largest_logits():
    """Logits near float32's largest value at a small temperature: the law is finite (the
    row's maximum is subtracted before the division)."""
    logits = torch.tensor([[[3e38, 1e38, -3e38]]])
    for t in (0.5, 1e-3, 1.0):
        p = target_probs(logits, torch.tensor([t]), torch.tensor([0]), torch.tensor([1.0]))
        assert p[0, 0].tolist() == [1.0, 0.0, 0.0], t
