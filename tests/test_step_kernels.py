"""The step's noise and RMSNorm kernels (interpreter) against ``ops.rng`` and ``ops.fused``."""

from __future__ import annotations

import pytest
import torch

from dflash2rt.errors import InvalidInputError
from dflash2rt.models.layers import RMSNorm
from dflash2rt.ops import fused as ref_norm
from dflash2rt.ops import rng
from dflash2rt.ops.batch import BlockNoise, SamplingBatch
from dflash2rt.ops.verify import sample_next
from dflash2rt.plugin_kit import interpreting
from dflash2rt.registry import Registry

from backends import available

pytest.importorskip("triton", reason="triton is not installed (pip install 'dflash2rt[triton]')")
if not interpreting():
    pytest.skip("TRITON_INTERPRET is off in this process (a GPU is present, see conftest.py): the "
                "kernels run on the device there, through the conformance suite",
                allow_module_level=True)
from dflash2rt.kernels import noise, norm  # noqa: E402
from dflash2rt.kernels.launch import recording  # noqa: E402


@pytest.fixture(scope="module")
def backend():
    return available()


def _keys(r: int, seed: int = 0):
    """seed [R] (negative ones, 0, -1 and 2^63 - 1 among them), request [R] with high bits set,
    positions [R] past 2^32 and at 2^32 - 2 (a block then crosses 2^32)."""
    g = torch.Generator().manual_seed(seed)
    s = torch.randint(-2**63, 2**63 - 1, (r,), generator=g, dtype=torch.int64)
    s[:3] = torch.tensor([0, -1, 2**63 - 1])
    req = torch.randint(0, 2**62, (r,), generator=g) | (1 << 62)
    req[0] = -3
    pos = torch.randint(0, 2**40, (r,), generator=g)
    pos[1] = 2**32 - 2
    return s, req, pos


def _limbs(seed, req, pos):
    """The four words' uniforms by the int64 limb path (what ops.rng runs off the CPU)."""
    m = 0xFFFFFFFF
    seed, req = seed.view(-1, 1).expand_as(pos), req.view(-1, 1).expand_as(pos)
    words = rng.philox4x32((pos & m, (pos >> 32) & m, req & m, torch.zeros_like(pos)),
                           (seed & m, (seed >> 32) & m))
    return torch.stack([rng.bits_to_uniform(w) for w in words])


@pytest.mark.parametrize("n, lead", [(1, 0), (9, 1), (70, 3)])
def test_noise_kernel_equals_philox_bit_for_bit(n, lead):
    """n positions from first + lead, over one tile, and over three (70 = 32 + 32 + 6)."""
    seed, req, first = _keys(11)
    got = noise.uniform_words(seed, req, first, n, lead)                 # [4, R, n]
    pos = first.view(-1, 1) + lead + torch.arange(n)
    assert torch.equal(got, rng.uniform_words(seed.view(-1, 1), req.view(-1, 1), pos))
    assert torch.equal(got, _limbs(seed, req, pos))


def test_backend_noise_and_token_uniforms_are_one_launch_each(backend):
    seed, req, anchor = _keys(5, seed=1)
    with recording() as rec:
        got = backend.noise(seed, req, anchor, 7)
        tok = backend.token_uniforms(seed, req, anchor, lead=1)
    want = BlockNoise.draw(seed, req, anchor, 7)
    for f in ("walk", "accept", "residual", "bonus"):
        assert torch.equal(getattr(got, f), getattr(want, f)), f
    assert torch.equal(tok, rng.uniforms(seed, req, anchor + 1, rng.Stream.BONUS))
    assert rec.count == 2 and set(rec.per_kernel()) == {"noise._noise_kernel"}
    assert backend.implementation["noise"] == "triton interpreter"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("shape", [(3, 192), (2, 5, 3, 64), (4, 1000)])
def test_rms_norm_kernel_matches_the_reference(dtype, shape):
    g = torch.Generator().manual_seed(shape[-1])
    x = (3 * torch.randn(*shape, generator=g)).to(dtype)
    w = torch.randn(shape[-1], generator=g).to(dtype)
    got, want = norm.rms_norm(x, w, 1e-6), ref_norm.rms_norm(x, w, 1e-6)
    assert got.dtype == want.dtype and got.shape == want.shape
    # float32: the mean's summation order differs; float16: one rounding of the result apart
    tol = dict(rtol=2e-6, atol=2e-6) if dtype == torch.float32 else dict(rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(got, want, **tol)


def test_rms_norm_kernel_past_its_channel_tile(monkeypatch):
    """52 channels in tiles of 16: both passes loop over four tiles, the last partial; the
    largest value sits in the last tile."""
    monkeypatch.setattr(norm, "NORM_TILE", 16)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(3, 52, generator=g)
    x[:, 50] = 40.0
    w = torch.randn(52, generator=g)
    with recording() as rec:
        got = norm.rms_norm(x, w, 1e-6)
    torch.testing.assert_close(got, ref_norm.rms_norm(x, w, 1e-6), rtol=2e-6, atol=2e-6)
    (launch,) = rec.by_key.values()
    assert launch.constexprs()["BLOCK_H"] == 16


def test_rms_norm_kernel_refuses_a_weight_of_another_dtype():
    with pytest.raises(InvalidInputError, match="rms_norm kernel"):
        norm.rms_norm(torch.zeros(2, 8), torch.zeros(8, dtype=torch.float16), 1e-6)


def test_models_norm_with_the_backend_kernel_inside_its_run_context(backend):
    """RMSNorm modules run the backend's kernel inside ``run_context`` (the decode), the torch
    reference outside; the CPU backend keeps the reference inside too."""
    layer = RMSNorm(96, 1e-6)
    x = torch.randn(4, 96)
    with recording() as rec:
        outside = layer(x)
        with backend.run_context():
            inside = layer(x)
        with Registry.discover().select("cpu").backend.run_context():
            cpu = layer(x)
    assert rec.per_kernel() == {"norm._rms_norm_kernel": 1} and rec.count == 1
    assert torch.equal(outside, cpu)
    torch.testing.assert_close(inside, outside, rtol=2e-6, atol=2e-6)


def test_an_all_greedy_batch_samples_without_uniforms():
    logits = torch.tensor([[0.0, 2.0, 1.0], [3.0, 0.0, 3.0]])
    token, bad = sample_next(logits, SamplingBatch.greedy_batch(2), None)
    assert token.tolist() == [1, 0] and not bad.any()
    sampled = SamplingBatch.build([1.0, 0.0], [0, 0], [1.0, 1.0])
    with pytest.raises(InvalidInputError, match="needs uniforms"):
        sample_next(logits, sampled, None)
