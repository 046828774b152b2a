"""The float32 formulation of the sampled path (devices without float64, ``ops.exact32``): the
acceptance test is the float64 decision bit for bit, verify's draws match float64, the
cpu-nofp64 backend really forbids float64, and an Engine decode on it equals the cpu backend's.
(Inverse CDF: tests/test_sampling.py; selector walk and sample_next: tests/test_selector.py.)"""

from __future__ import annotations

import json
from fractions import Fraction

import pytest
import torch

import dflash2rt
from dflash2rt.ops import exact32, verify as ops_verify
from dflash2rt.ops.batch import BlockNoise, SamplingBatch
from dflash2rt.ops.sampling import inverse_cdf

F32 = torch.float32
G = lambda s: torch.Generator().manual_seed(s)  # noqa: E731


def _f32(x):
    return torch.tensor(x, dtype=F32)


def _bits(n, g):
    """Random finite non-negative float32 over every exponent, subnormals included."""
    x = torch.randint(0, 0x7F800000, (n,), generator=g, dtype=torch.int64)
    return x.to(torch.int32).view(F32)


SPECIAL = [0.0, 1e-45, 3e-45, 2.0 ** -140, 1.1754942e-38, 2.0 ** -126, 1e-30, 2.0 ** -24,
           1e-10, 0.25, 0.5, 1 - 2.0 ** -24, 1.0, 3.0, 2.0 ** 100, 3.4028235e38]
U_SPECIAL = [2.0 ** -24, 3 * 2.0 ** -24, 0.5, 0.75, 1 - 2.0 ** -24, 1.0, 1e-45, 1e-30, 0.1]


def adversarial():
    """(u, q, p) float32 triples: ties u·q == p and ±1 ulp, zeros, subnormals, exponent gaps
    beyond 62 bits, random bit patterns and random probabilities."""
    g = G(0)
    u, q, p = torch.meshgrid(_f32(U_SPECIAL), _f32(SPECIAL), _f32(SPECIAL), indexing="ij")
    cols = [(u.flatten(), q.flatten(), p.flatten())]
    n = 20000
    uu = (2 * torch.randint(0, 2 ** 23, (n,), generator=g) + 1).to(F32) * 2.0 ** -24
    qq = torch.rand(n, generator=g) ** 4
    tie = (uu.double() * qq.double()).float()                # u·q rounded: ties and near-ties
    for d in (-1, 0, 1):
        pp = torch.nextafter(tie, torch.full_like(tie, float(d) * float("inf"))) if d else tie
        cols.append((uu, qq, pp))
    exact_tie = torch.randint(1, 2 ** 12, (n,), generator=g).to(F32) * 2.0 ** -12  # 12-bit q
    u12 = torch.randint(1, 2 ** 12, (n,), generator=g).to(F32) * 2.0 ** -12
    cols.append((u12, exact_tie, u12 * exact_tie))          # exact in float32: u·q == p
    cols.append((uu, _bits(n, g), _bits(n, g)))
    cols.append((torch.rand(n, generator=g).clamp(min=2.0 ** -24), _bits(n, g), _bits(n, g)))
    return tuple(torch.cat(c) for c in zip(*cols))


def reference(u, q, p):
    return u.double() * q.double() < p.double()


def disagreements(fn) -> int:
    u, q, p = adversarial()
    return int((fn(u, q, p) != reference(u, q, p)).sum())


def test_exact_acceptance_is_the_float64_decision():
    assert disagreements(lambda u, q, p: exact32.accept(u, q, None, p)) == 0


@pytest.mark.parametrize("mutant", [
    lambda u, q, p: exact32.accept(u, q, None, p) | (u.double() * q.double() == p.double()),
    lambda u, q, p: u * q < p,                                    # a plain float32 product
    lambda u, q, p: u * q <= p])
def test_acceptance_mutants_are_caught(mutant):
    assert disagreements(mutant) > 0


def test_acceptance_exact_against_fractions_with_a_double_float_q():
    """q = hi + lo (duplicated candidates): decided exactly for the pair."""
    g = G(1)
    hi = torch.rand(400, generator=g) + 0.01
    lo = (torch.rand(400, generator=g) - 0.5) * hi * 2.0 ** -24
    hi, lo = exact32.two_sum(hi, lo)
    u = torch.full((400,), 0.75)
    exact = [Fraction(0.75) * (Fraction(float(h)) + Fraction(float(l))) for h, l in zip(hi, lo)]
    p = torch.tensor([float(e) for e in exact], dtype=F32)       # p rounded near u·q
    want = [e < Fraction(float(x)) for e, x in zip(exact, p)]
    assert exact32.accept(u, hi, lo, p).tolist() == want


def test_nonfinite_inputs_decide_as_float64():
    u, p = _f32([0.5, 0.5, 0.5, 0.5]), _f32([0.5, 0.0, float("nan"), 0.1])
    q = _f32([float("inf"), float("nan"), 0.5, -1.0])
    assert exact32.accept(u, q, None, p).tolist() == reference(u, q, p).tolist()


def _fr(x) -> Fraction:
    return Fraction(float(x))


def test_duplicate_mass_and_residual_are_exact_double_floats():
    """Two duplicated hits sum exactly; p − q with one hit is exact (float32 alone is not)."""
    g = G(7)
    q1, q2 = torch.rand(300, generator=g), torch.rand(300, generator=g) * 2.0 ** -20
    cand = torch.tensor([[[5, 5, 1]]]).expand(300, 1, 3)
    q = torch.stack([q1, q2, torch.full_like(q1, 0.5)], -1).view(300, 1, 3)
    hi, lo = exact32.draft_mass32(torch.full((300, 1), 5), cand, q)
    assert all(_fr(h) + _fr(lo_) == _fr(a) + _fr(b) for h, lo_, a, b in
               zip(hi.flatten(), lo.flatten(), q1, q2))
    p = torch.rand(300, 4, generator=g)
    qs = torch.rand(300, 4, generator=g) * torch.tensor([1.0, 2.0 ** -20, 1e-40, 2.0 ** -40])
    hi, lo = exact32.residual32(p, torch.arange(4).expand(300, 4), qs)
    want = [[max(_fr(a) - _fr(b), Fraction(0)) for a, b in zip(pr, qr)] for pr, qr in zip(p, qs)]
    assert [[_fr(h) + _fr(x) for h, x in zip(hr, lr)] for hr, lr in zip(hi, lo)] == want


def _verify_case(g, r=24, gamma=3, v=37, k=5, dup=False):
    logits = torch.randn(r, gamma + 1, v, generator=g) * 2
    cand = torch.stack([torch.randperm(v, generator=g)[:k] for _ in range(r * gamma)])
    cand = cand.view(r, gamma, k)
    if dup:
        cand[..., 1] = cand[..., 0]
    q = torch.softmax(torch.randn(r, gamma, k, generator=g), -1)
    draft = cand.gather(-1, torch.randint(0, k, (r, gamma, 1), generator=g)).squeeze(-1)
    u = lambda *s: torch.rand(*s, generator=g).to(F32)  # noqa: E731
    noise = BlockNoise(u(r, gamma), u(r, gamma), u(r, gamma), u(r))
    temps = [0.0 if i % 5 == 0 else 0.7 + 0.1 * (i % 4) for i in range(r)]
    return logits, draft, cand, q, SamplingBatch.build(temps, [0] * r, [1.0] * r), noise


@pytest.mark.parametrize("dup", [False, True])
def test_verify_fp32_equals_fp64(dup):
    g = G(3)
    for _ in range(5):
        args = _verify_case(g, dup=dup)
        a = ops_verify.verify(*args, check=False, has_fp64=True)
        b = ops_verify.verify(*args, check=False, has_fp64=False)
        for f in ("accept_len", "tokens", "bad", "bad_q"):
            assert torch.equal(getattr(a, f), getattr(b, f)), f


def test_verify_bad_laws_flag_identically():
    """NaN / +inf / all −inf logits, q with NaN, inf, a negative entry or no mass on d."""
    logits, draft, cand, q, sampling, noise = _verify_case(G(8), r=10)
    logits[1, 0, 3], logits[2, 1, 0], logits[3, 2] = float("nan"), float("inf"), float("-inf")
    q[4, 0, 1], q[5, 1, 2], q[6, 0, 0] = float("nan"), float("inf"), -0.25
    q[7, 1] = torch.where(cand[7, 1] == draft[7, 1, None], 0.0, q[7, 1])
    a = ops_verify.verify(logits, draft, cand, q, sampling, noise, check=False, has_fp64=True)
    b = ops_verify.verify(logits, draft, cand, q, sampling, noise, check=False, has_fp64=False)
    assert torch.equal(a.bad, b.bad) and torch.equal(a.bad_q, b.bad_q) and a.bad_q.any()
    ok = ~a.bad & ~a.bad_q
    assert torch.equal(a.tokens[ok], b.tokens[ok])


def test_verify_fp32_exact_tie_and_empty_residual():
    """u·q == p exactly rejects (strict <); p == q leaves no residual: draw from p."""
    logits = torch.log(_f32([[[0.5, 0.5, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25]]]))
    draft, cand = torch.tensor([[0]]), torch.tensor([[[0, 1]]])
    q = _f32([[[0.5, 0.5]]])
    sampling = SamplingBatch.build([1.0], [0], [1.0])
    noise = BlockNoise(_f32([[0.5]]), _f32([[1.0]]), _f32([[0.7]]), _f32([0.5]))
    for fp64 in (True, False):
        out = ops_verify.verify(logits, draft, cand, q, sampling, noise, has_fp64=fp64)
        assert out.accept_len.tolist() == [0] and out.tokens.tolist() == [[1, -1]]


def test_forbidding_mode_raises_on_float64():
    from dflash2rt.cpu.nofp64 import Float64Error, Float64Forbidden

    x = torch.ones(3)
    with Float64Forbidden():
        (x * 2.0).sum()                                          # Python scalars are fine
        torch.cat([x, x]), torch.stack((x, x)).max(dim=0)          # containers of float32
        for bad in (lambda: x.double(), lambda: torch.zeros(2, dtype=torch.float64),
                    lambda: x + torch.ones(3, dtype=torch.float64),
                    lambda: torch.cat([x, x, torch.ones(3, dtype=torch.float64)])):   # in a list
            with pytest.raises(Float64Error):
                bad()
    d = torch.ones(3, 2, dtype=torch.float64)
    with Float64Forbidden(), pytest.raises(Float64Error):
        d.max(dim=0)                                   # an op whose result is a tuple


def test_nofp64_backend_catches_a_float64_op_path():
    """The cpu-nofp64 backend would fail if its ops took the float64 formulation."""
    from dflash2rt.cpu.nofp64 import Float64Error

    backend = dflash2rt.get_backend("cpu-nofp64")
    assert backend.has_fp64 is False
    args = _verify_case(G(5))
    backend.verify(*args, check=False)
    backend.has_fp64 = True                                      # a mutant: the float64 path
    with pytest.raises(Float64Error):
        backend.verify(*args, check=False)


def test_run_context_forbids_float64_and_selects_the_float32_path():
    from dflash2rt.cpu.nofp64 import Float64Error

    backend = dflash2rt.get_backend("cpu-nofp64")
    logits, u = torch.randn(3, 11, generator=G(10)), torch.rand(3, generator=G(11))
    sampling = SamplingBatch.build([1.0] * 3, [0] * 3, [1.0] * 3)
    with backend.run_context():
        token, _ = ops_verify.sample_next(logits, sampling, u)          # float32 formulation
        with pytest.raises(Float64Error):
            ops_verify.sample_next(logits, sampling, u, has_fp64=True)
    assert torch.equal(token, ops_verify.sample_next(logits, sampling, u)[0])


@pytest.fixture(scope="module")
def bundled():
    from dflash2rt.bundled import bundled_path
    from dflash2rt.models.pair import load_pair

    root = bundled_path("stdlib-code")
    prompts = json.loads((root / "heldout_prompts.json").read_text(encoding="utf-8"))
    return load_pair(root / "target", root / "draft"), prompts


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_engine_on_cpu_nofp64_equals_cpu(bundled, temperature):
    from dflash2rt.engine.engine import Engine
    from dflash2rt.engine.request import Request, SamplingParams
    from dflash2rt.api import measured_table
    from dflash2rt.engine.policy.adaptive import AdaptivePolicy

    pair, prompts = bundled
    reqs = [Request(tuple(p["prompt_ids"]), SamplingParams(max_new_tokens=20, seed=11,
                                                           temperature=temperature,
                                                           ignore_eos=True), key=i)
            for i, p in enumerate(prompts[:2])]
    nofp64 = dflash2rt.get_backend("cpu-nofp64")
    entered = []
    run_context = nofp64.run_context
    nofp64.run_context = lambda: entered.append(1) or run_context()    # the whole decode in it
    for spec in (True, False):
        engines = [Engine(pair, dflash2rt.get_backend("cpu")), Engine(pair, nofp64)]
        for e in engines:       # one schedule state for both (the default learns per call)
            e.policy = AdaptivePolicy.measured(pair.draft.cfg.block_size,
                                                  measured_table(pair, "cpu"), track=0.0)
        want, _ = engines[0].generate(reqs, spec=spec)
        got, _ = engines[1].generate(reqs, spec=spec)
        assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert len(entered) == 2


def test_kernel_backend_without_fp64_runs_the_float32_kernels(monkeypatch):
    """Without float64 the sampled verify is the kernel compiled with FP64=False (no fallback
    to torch ops, none reported), equal to the float32 torch ops, under the float64 guard."""
    pytest.importorskip("triton", reason="triton is not installed")
    from dflash2rt.plugin_kit import interpreting

    if not interpreting():
        pytest.skip("TRITON_INTERPRET is off in this process (a GPU is present)")
    from dflash2rt.cpu.nofp64 import Float64Forbidden
    from dflash2rt.kernels import backend as kb
    from dflash2rt.kernels import verify as kv

    backend = kb.KernelBackend("kernels-nofp64", "cpu", (F32,), has_fp64=False)
    assert backend.standing_fallbacks == () and backend.implementation["verify"] != "torch ops"
    logits, draft, cand, q, sampling, noise = _verify_case(G(6), r=4, gamma=2, v=19, k=3)
    want = ops_verify.verify(logits, draft, cand, q, sampling, noise, check=False,
                             has_fp64=False)
    launched = []
    real = kv._verify_kernel

    class Spy:
        def __getitem__(self, grid):
            def launch(*a, **k):
                launched.append(k["FP64"])
                return real[grid](*a, **k)
            return launch
    monkeypatch.setattr(kv, "_verify_kernel", Spy())
    with Float64Forbidden():
        got = backend.verify(logits, draft, cand, q, sampling, noise, check=False)
    assert launched == [False] and torch.equal(got.tokens, want.tokens)
    assert torch.equal(got.accept_len, want.accept_len)


def test_two_sum_and_two_prod_are_error_free():
    """s + e == a + b and p + e == a · b exactly (as rationals), over a wide exponent range
    with no overflow or underflow: the identities every double-float step rests on."""
    g = G(21)
    n = 3000
    mag = lambda: 2.0 ** torch.randint(-40, 40, (n,), generator=g).to(F32)   # noqa: E731
    a = (torch.rand(n, generator=g) - 0.5) * mag()
    b = (torch.rand(n, generator=g) - 0.5) * mag()
    s, e = exact32.two_sum(a, b)
    assert all(_fr(x) + _fr(y) == _fr(p) + _fr(q) for x, y, p, q in zip(s, e, a, b))
    p, e = exact32.two_prod(a, b)
    assert p.dtype == e.dtype == F32
    assert all(_fr(x) + _fr(y) == _fr(p_) * _fr(q) for x, y, p_, q in zip(p, e, a, b))


def _dyadic_rows(g, rows, v, scale):
    """Weight rows of small integers times 2^scale (some zero): float32 and float64 sums of
    them are exact, so both inverse CDFs must give the same index for every u."""
    w = torch.randint(0, 50, (rows, v), generator=g).to(F32)
    w[torch.rand(rows, v, generator=g) < 0.3] = 0
    w[:, 0] += (w.sum(-1) == 0).to(F32)                       # at least one positive weight
    return w * 2.0 ** scale


@pytest.mark.parametrize("scale", [-120, -60, -10, 0, 10, 60, 100])
def test_inverse_cdf32_is_the_float64_index_on_exact_laws(scale):
    """Every magnitude the rescaling must bring into range, and u on the CDF's breakpoints
    (u · total == a cumulative weight) as well as between them: the float64 index, exactly."""
    g = G(100 + scale)
    w = _dyadic_rows(g, 64, 23, scale)
    cdf = torch.cumsum(w.double(), -1)
    total = cdf[:, -1:]
    k = torch.randint(0, 23, (64, 1), generator=g)
    at = (cdf.gather(1, k) / total).squeeze(1)                  # breakpoints (dyadic / total)
    for u in (torch.rand(64, generator=g), at.float(), torch.zeros(64),
              torch.full((64,), 1 - 2.0 ** -24)):
        want = inverse_cdf(w.double(), u.double())
        assert exact32.inverse_cdf32(w, u).tolist() == want.tolist()


def test_inverse_cdf32_refuses_what_is_not_a_law_as_float64_does():
    nan, inf = float("nan"), float("inf")
    rows = [[0.0, 0.0, 0.0], [1.0, nan, 1.0], [1.0, inf, 1.0], [inf, 0.0, 0.0],
            [1.0, -0.5, 2.0], [-1.0, 0.0, 0.0], [3.4e38, 3.4e38, 0.0], [0.0, 1e-45, 0.0],
            [0.0, 2.0, 0.0]]
    w, u = _f32(rows), torch.full((len(rows),), 0.5)
    got = exact32.inverse_cdf32(w, u).tolist()
    assert got == inverse_cdf(w.double(), u.double()).tolist()
    assert got[:6] == [-1] * 6 and got[7:] == [1, 1]


def test_acceptance_with_every_nonfinite_input_decides_as_float64():
    """Every combination of NaN, ±inf, zero, the smallest subnormal and a probability in u,
    q and p (and a huge q or p), with and without a low part of q (where all are finite):
    float64's decision."""
    vals = [0.5, 0.0, float("nan"), float("inf"), -float("inf"), 1e-45, 1.0]
    u, q, p = torch.meshgrid(_f32(vals), _f32(vals + [3e38]), _f32(vals + [3e38]),
                             indexing="ij")
    u, q, p = u.flatten(), q.flatten(), p.flatten()
    assert exact32.accept(u, q, None, p).tolist() == reference(u, q, p).tolist()
    lo = q * 2.0 ** -30                         # a normalized double-float: |lo| < ulp(hi)
    want = (u.double() * (q.double() + lo.double()) < p.double())
    fine = torch.isfinite(u) & torch.isfinite(q) & torch.isfinite(p)
    assert exact32.accept(u, q, lo, p)[fine].tolist() == want[fine].tolist()


def test_float64_is_on_unless_a_context_or_the_caller_turns_it_off():
    assert exact32.fp64_enabled() is True
    with exact32.without_fp64():
        assert exact32.fp64_enabled() is False
        assert exact32.fp64_enabled(True) is True
        with exact32.without_fp64():
            assert exact32.fp64_enabled() is False
        assert exact32.fp64_enabled() is False
    assert exact32.fp64_enabled() is True and exact32.fp64_enabled(False) is False


def test_residual_over_duplicated_candidates_is_a_double_float_within_its_bound():
    """p − (q₁ + q₂) for a token offered twice, and for a third hit: hi + lo within 2^-47 of
    the rational residual (relative to p), clamped at zero, where float32 alone is off by
    ~2^-24."""
    g = G(31)
    r = 400
    p = torch.rand(r, 3, generator=g) + 0.5
    q1 = torch.rand(r, generator=g) * 0.3
    q2 = torch.rand(r, generator=g) * 2.0 ** -18
    q3 = torch.rand(r, generator=g) * 2.0 ** -30
    cand = torch.tensor([[1, 1, 2, 1]]).expand(r, 4)
    q = torch.stack([q1, q2, torch.full_like(q1, 0.75), q3], -1)
    hi, lo = exact32.residual32(p, cand, q)
    for i in range(r):
        want = [_fr(p[i, 0]), max(_fr(p[i, 1]) - _fr(q1[i]) - _fr(q2[i]) - _fr(q3[i]), 0),
                max(_fr(p[i, 2]) - Fraction(3, 4), Fraction(0))]
        for j in range(3):
            got = _fr(hi[i, j]) + _fr(lo[i, j])
            assert abs(got - want[j]) <= _fr(p[i, j]) * Fraction(1, 2 ** 47), (i, j)
            assert (hi[i, j] > 0) == (want[j] > 0)
