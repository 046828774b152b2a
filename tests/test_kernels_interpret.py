"""The Triton kernels (under the interpreter) against the reference torch ops."""

from __future__ import annotations

import pytest
import torch

from dflash2rt import get_backend
from dflash2rt.ops import conv as ref_conv
from dflash2rt.ops import selector as ref_sel
from dflash2rt.ops import verify as ref_ver
from dflash2rt.ops.batch import BlockNoise, SamplingBatch
from dflash2rt.plugin_kit import interpreting

from backends import available

pytest.importorskip("triton", reason="triton is not installed (pip install 'dflash2rt[triton]')")
if not interpreting():
    pytest.skip("TRITON_INTERPRET is off in this process (a GPU is present, see conftest.py): the "
                "kernels run on the device there, through the conformance suite",
                allow_module_level=True)
from dflash2rt.kernels import conv, selector, verify  # noqa: E402


@pytest.fixture(scope="module")
def backend():
    return available()


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 0.0), (torch.float16, 5e-3)])
@pytest.mark.parametrize("block, taps, h, groups", [(4, 2, 96, 6), (5, 3, 130, 13), (1, 1, 7, 7)])
def test_conv_matches_reference(dtype, tol, block, taps, h, groups):
    g = torch.Generator().manual_seed(h)
    n = 3 * block
    x, a = (torch.randn(n, h, generator=g).to(dtype) for _ in range(2))
    base = torch.randn(taps, h, generator=g).to(dtype)
    delta = torch.randn(n, taps, groups, generator=g).to(dtype)
    want = ref_conv.conv_prepare(x.float(), base.float(), delta.float(), block)
    assert (conv.conv_prepare(x, base, delta, block).float() - want).abs().max() <= tol * 10
    want = ref_conv.conv_finish(x.float(), a.float(), base.float(), delta.float(), block)
    assert (conv.conv_finish(x, a, base, delta, block).float() - want).abs().max() <= tol * 10


def _select_inputs(trial):
    g = torch.Generator().manual_seed(trial)
    r, gamma, v, rank = 3, 5, 40 + trial, 6 + trial % 3
    return (torch.randn(r, gamma, v, generator=g), torch.randn(r, gamma, rank, generator=g),
            torch.randint(0, v, (r,), generator=g), torch.randn(v, rank, generator=g),
            torch.randn(v, rank, generator=g), torch.rand(r, gamma, generator=g))


@pytest.mark.parametrize("fp64", [True, False], ids=["fp64", "nofp64"])
@pytest.mark.parametrize("trial", range(6))
def test_selector_walk_matches_reference(trial, fp64):
    """Without float64 the kernel draws in double-float float32 as ``ops.exact32`` does."""
    logits, proj, anchor, a, b, u = _select_inputs(trial)
    params = ref_sel.SelectorParams(1 + trial, 0.5, 3.0 if trial % 2 else None)
    sampling = SamplingBatch.build([0.0, 1.0, 0.6], [0, 0, 0], [1.0, 1.0, 1.0])
    got = selector.select(logits, proj, anchor, a, b, params, sampling, u, has_fp64=fp64)
    want = ref_sel.select(logits, proj, anchor, a, b, params, sampling, u, has_fp64=fp64)
    assert torch.equal(got.draft, want.draft) and torch.equal(got.candidates, want.candidates)
    torch.testing.assert_close(got.q, want.q, rtol=0, atol=1e-6)


@pytest.mark.parametrize("fp64", [True, False], ids=["fp64", "nofp64"])
@pytest.mark.parametrize("trial", range(8))
def test_verify_matches_reference(trial, fp64):
    g = torch.Generator().manual_seed(100 + trial)
    r, gamma, v, k = 3, 4, 37 + 5 * trial, 5
    logits = torch.randn(r, gamma + 1, v, generator=g)
    cand = torch.stack([torch.randperm(v, generator=g)[:k] for _ in range(r * gamma)])
    cand = cand.view(r, gamma, k)
    q = torch.softmax(torch.randn(r, gamma, k, generator=g), -1)
    draft = cand.gather(-1, torch.randint(0, k, (r, gamma, 1), generator=g))[..., 0]
    if trial % 2:  # drafts that the target agrees with, so acceptance runs deep
        draft[:, :3] = logits[:, :3].argmax(-1)
        cand[..., 0] = draft
    sampling = SamplingBatch.build([0.0, 1.0, 0.7], [0, 0, 5], [1.0, 0.9, 1.0])
    noise = BlockNoise.draw(torch.tensor([1, 2, 3]), torch.zeros(3, dtype=torch.long),
                            torch.tensor([trial, 7, 50]), gamma)
    got = verify.verify(logits, draft, cand, q, sampling, noise, check=False, has_fp64=fp64)
    want = ref_ver.verify(logits, draft, cand, q, sampling, noise, check=False, has_fp64=fp64)
    assert torch.equal(got.tokens, want.tokens) and torch.equal(got.accept_len, want.accept_len)
    assert torch.equal(got.bad_q, want.bad_q)


@pytest.mark.parametrize("trial", range(3))
def test_verify_without_fp64_over_many_chunks_and_hard_rows(trial):
    """The float32 formulation chunk by chunk (block_v 32 over V = 401: a double-float carry
    across 13 chunks), with duplicated candidates, residuals that are empty (q covers p), rows
    of zero, subnormal and huge-range mass, a NaN q and uniforms 0 and 1 - 2^-24: the kernel's
    accept lengths, tokens and flags equal the float32 torch ops'."""
    from dflash2rt.kernels.tuning import Tuning

    g = torch.Generator().manual_seed(900 + trial)
    r, gamma, v, k = 6, 3, 401, 4
    logits = torch.randn(r, gamma + 1, v, generator=g) * (1 + 4 * trial)
    logits[1] = -1e4                                     # row 1: every logit tiny after softmax
    logits[1, :, 5 + trial] = 0.0
    cand = torch.randint(0, v, (r, gamma, k), generator=g)
    cand[2, :, 1] = cand[2, :, 0]                        # duplicated candidates
    q = torch.softmax(torch.randn(r, gamma, k, generator=g), -1)
    draft = cand[..., 0].clone()
    p = torch.softmax(logits, -1)
    cand[3] = p[3, :gamma].topk(k, -1).indices           # q ≥ p on p's mass: empty residuals
    q[3] = 1.0
    draft[3] = cand[3, :, 0]
    if trial % 3 == 0:
        q[4, 1, 2] = float("nan")                        # a broken law: flagged, not read
    sampling = SamplingBatch.build([1.0] * r, [0] * r, [1.0] * r)
    noise = BlockNoise.draw(torch.arange(r), torch.zeros(r, dtype=torch.long),
                            torch.arange(r) * 3 + trial, gamma)
    noise.accept[5] = 1.0 - 2.0 ** -24
    noise.residual[5] = 0.0
    noise.bonus[0] = 1.0 - 2.0 ** -24
    tuning = Tuning(block_h=128, block_v=32, num_warps=4)
    got = verify.verify(logits, draft, cand, q, sampling, noise, False, tuning, has_fp64=False)
    want = ref_ver.verify(logits, draft, cand, q, sampling, noise, check=False, has_fp64=False)
    assert torch.equal(got.accept_len, want.accept_len) and torch.equal(got.tokens, want.tokens)
    assert torch.equal(got.bad_q, want.bad_q) and torch.equal(got.bad, want.bad)


@pytest.mark.slow                       # a long run (over 10 s on 2 cores)
def test_engine_on_triton_interpret_equals_cpu(backend):
    from dflash2rt.engine.engine import Engine
    from dflash2rt.engine.request import Request, SamplingParams

    from tiny_models import oracle_pair

    pair = oracle_pair(4, dtype=torch.float32)
    reqs = [Request((1, 2, 3), SamplingParams(max_new_tokens=12, temperature=t, seed=3))
            for t in (0.0, 1.0)]
    # a fixed block: adaptive choices follow each backend's step costs (the interpreter's are
    # another machine's), and at T > 0 other blocks draw other coins
    got, stats = Engine(pair, backend).generate(reqs, block_size=4)
    want, _ = Engine(pair, get_backend("cpu")).generate(reqs, block_size=4)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert stats.backend == "triton-interpret"


def test_bf16_is_refused_on_the_interpreter(backend):
    from dflash2rt.engine.engine import Engine
    from dflash2rt.errors import InvalidInputError

    from tiny_models import oracle_pair

    with pytest.raises(InvalidInputError, match="does not run torch.bfloat16"):
        Engine(oracle_pair(4, dtype=torch.bfloat16), backend)


@pytest.mark.parametrize("ties", [(5, 1029), (1029, 2053), (700, 1500), (1023, 1024, 3000),
                                  (3000,), (0, 1024, 2048)])
def test_verify_greedy_argmax_ties_across_chunk_lanes(ties):
    """The per-lane running maximum: ties in the same lane of different chunks (5 / 1029 with
    1024-token chunks), in different lanes, in the last partial chunk: the lowest id wins."""
    g = torch.Generator().manual_seed(sum(ties))
    v = 3001
    logits = torch.randn(2, 2, v, generator=g).clamp(-4, 4)
    logits[:, 0, list(ties)] = 9.0
    logits[1, 1] = float("-inf")                              # an all −inf bonus row: id 0
    draft = torch.tensor([[ties[0]], [ties[-1]]])
    sampling = SamplingBatch.greedy_batch(2)
    noise = BlockNoise.unused(2, 1, "cpu")
    got = verify.verify(logits, draft, draft.unsqueeze(-1), torch.ones(2, 1, 1), sampling, noise,
                        check=False)
    want = ref_ver.verify(logits, draft, draft.unsqueeze(-1), torch.ones(2, 1, 1), sampling,
                          noise, check=False)
    assert torch.equal(got.tokens, want.tokens) and torch.equal(got.accept_len, want.accept_len)
    assert int(got.tokens[0, 0]) == min(ties)


def _attention_case(seed, r, t, n_kv, group, hd, n_keys, window=None, dtype=torch.float32,
                    max_len=None):
    """q [R, T, nh, hd] and k, v = cache[:, :L] of a longer cache (strided, as the models pass
    them); ragged lens per request; lo = the window start (≤ lens) or 0, hi = causal or block."""
    g = torch.Generator().manual_seed(seed)
    max_len = max_len or n_keys + 7
    q = torch.randn(r, t, n_kv * group, hd, generator=g).to(dtype)
    cache = torch.randn(2, r, max_len, n_kv, hd, generator=g).to(dtype)
    lens = torch.randint(0, n_keys - t + 1, (r,), generator=g)
    lens[0] = n_keys - t                                     # one request at the full length
    pos = lens.view(-1, 1) + torch.arange(t)                 # [R, T]
    if window is None:                                       # target: causal
        lo, hi = torch.zeros_like(pos), pos + 1
    else:                                                    # draft block: window, whole block
        lo = torch.minimum((pos - window + 1).clamp(min=0), lens.view(-1, 1))
        hi = (lens + t).view(-1, 1).expand(r, t)
    return q, cache[0, :, :n_keys], cache[1, :, :n_keys], lo, hi, hd ** -0.5


def _attention64(q, k, v, lo, hi, scale):
    """Float64 loop reference: row (r, j), head h over keys lo <= p < hi of KV head h // G."""
    q, k, v = q.double(), k.double(), v.double()
    r_, t_, nh, _ = q.shape
    group = nh // k.shape[2]
    out = torch.empty_like(q)
    for r in range(r_):
        for j in range(t_):
            a, b = int(lo[r, j]), int(hi[r, j])
            for h in range(nh):
                w = torch.softmax(k[r, a:b, h // group] @ q[r, j, h] * scale, 0)
                out[r, j, h] = w @ v[r, a:b, h // group]
    return out


@pytest.mark.parametrize("t, n_kv, group, hd, n_keys, window", [
    (1, 2, 1, 16, 19, None),         # T = 1 decode, MHA, L prime
    (1, 1, 8, 64, 37, None),         # GQA 8
    (17, 1, 2, 32, 41, None),        # T = 17 causal, GQA 2
    (17, 2, 4, 24, 29, 5),           # draft block, sliding window 5 (lo > 0), hd not a power of 2
    (3, 1, 4, 128, 70, None),        # L above one key tile (64) and not a multiple of it
])
def test_attention_matches_reference(t, n_kv, group, hd, n_keys, window):
    from dflash2rt.kernels import attention
    from dflash2rt.ops.attention import attention as torch_attention

    args = _attention_case(t * 100 + hd, 3, t, n_kv, group, hd, n_keys, window)
    assert not args[1].is_contiguous()                   # a slice of the cache, not a copy
    got = attention.attention(*args)
    assert got.dtype == torch.float32 and got.shape == args[0].shape
    torch.testing.assert_close(got.double(), _attention64(*args), rtol=2e-6, atol=2e-6)
    torch.testing.assert_close(got, torch_attention(*args), rtol=2e-6, atol=2e-6)


def test_attention_float16_and_tiles():
    from dflash2rt.kernels import attention
    from dflash2rt.kernels.tuning import Tuning

    args = _attention_case(7, 2, 5, 2, 2, 20, 33, window=4, dtype=torch.float16)
    want = _attention64(*args)
    got = attention.attention(*args)
    assert got.dtype == torch.float16
    torch.testing.assert_close(got.double(), want, rtol=5e-3, atol=5e-3)
    # tiny tiles: several query tiles (M = 10 rows, 16 per tile) and key tiles of 16
    small = attention.attention(*args, tuning=Tuning(attn_block_m=16, attn_block_n=16))
    torch.testing.assert_close(small.double(), want, rtol=5e-3, atol=5e-3)


def test_attention_reads_exactly_lo_to_hi():
    """Mutation check: a key at lo and at hi - 1 changes the row, a key at hi or below lo (or
    past L in the cache buffer) does not."""
    from dflash2rt.kernels import attention

    r, t, hd, max_len, n_keys = 1, 2, 16, 40, 30
    q = torch.zeros(r, t, 2, hd)
    q[..., 0] = 1.0
    cache = torch.zeros(2, r, max_len, 1, hd)
    k, v = cache[0, :, :n_keys], cache[1, :, :n_keys]
    lo, hi = torch.tensor([[3, 0]]), torch.tensor([[9, 30]])
    base = attention.attention(q, k, v, lo, hi, 1.0)
    for p, row, seen in ((3, 0, True), (8, 0, True), (9, 0, False), (2, 0, False),
                         (0, 1, True), (29, 1, True), (30, 1, False), (35, 1, False)):
        cache.zero_()
        cache[1, 0, p, 0, :] = 1000.0                   # a loud value at key p
        cache[0, 0, p, 0, 0] = 5.0                      # and a loud score
        out = attention.attention(q, k, v, lo, hi, 1.0)
        moved = (out[0, row] - base[0, row]).abs().max().item() > 1.0
        assert moved == seen, f"key {p} for row {row}: seen={moved}, want {seen}"


def test_backend_attention_is_the_kernel(backend):
    args = _attention_case(3, 2, 1, 1, 4, 16, 21)
    assert backend.implementation["attention"] == "triton interpreter"
    torch.testing.assert_close(backend.attention(*args).double(), _attention64(*args),
                               rtol=2e-6, atol=2e-6)
