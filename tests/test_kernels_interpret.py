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
from dflash2rt.registry import Registry

pytest.importorskip("triton", reason="triton is not installed (pip install 'dflash2rt[triton]')")
if not interpreting():
    pytest.skip("TRITON_INTERPRET is off in this process (a GPU is present, see conftest.py): the "
                "kernels run on the device there, through the conformance suite",
                allow_module_level=True)
from dflash2rt.kernels import conv, selector, verify  # noqa: E402


@pytest.fixture(scope="module")
def backend():
    reg = Registry.discover()
    if not reg.probe("triton-interpret").available:
        pytest.skip(f"triton-interpret unavailable: {reg.probe('triton-interpret').reason}")
    return reg.select("triton-interpret").backend


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


@pytest.mark.parametrize("trial", range(6))
def test_selector_walk_matches_reference(trial):
    logits, proj, anchor, a, b, u = _select_inputs(trial)
    params = ref_sel.SelectorParams(1 + trial, 0.5, 3.0 if trial % 2 else None)
    sampling = SamplingBatch.build([0.0, 1.0, 0.6], [0, 0, 0], [1.0, 1.0, 1.0])
    got = selector.select(logits, proj, anchor, a, b, params, sampling, u)
    want = ref_sel.select(logits, proj, anchor, a, b, params, sampling, u)
    assert torch.equal(got.draft, want.draft) and torch.equal(got.candidates, want.candidates)
    torch.testing.assert_close(got.q, want.q, rtol=0, atol=1e-6)


@pytest.mark.parametrize("trial", range(8))
def test_verify_matches_reference(trial):
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
    got = verify.verify(logits, draft, cand, q, sampling, noise, check=False)
    want = ref_ver.verify(logits, draft, cand, q, sampling, noise, check=False)
    assert torch.equal(got.tokens, want.tokens) and torch.equal(got.accept_len, want.accept_len)
    assert torch.equal(got.bad_q, want.bad_q)


def test_engine_on_triton_interpret_equals_cpu(backend):
    from dflash2rt.engine.engine import Engine
    from dflash2rt.engine.request import Request, SamplingParams

    from tiny_models import oracle_pair

    pair = oracle_pair(4, dtype=torch.float32)
    reqs = [Request((1, 2, 3), SamplingParams(max_new_tokens=12, temperature=t, seed=3))
            for t in (0.0, 1.0)]
    got, stats = Engine(pair, backend).generate(reqs)
    want, _ = Engine(pair, get_backend("cpu")).generate(reqs)
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
