"""The CPU backend's model pass: float32 linears on oneDNN with packed weights (cpu/packed.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dflash2rt import get_backend
from dflash2rt.cpu import packed
from dflash2rt.engine.engine import Engine
from dflash2rt.engine.request import Request, SamplingParams

from tiny_models import tiny_pair

needs_onednn = pytest.mark.skipif(packed.unavailable() is not None,
                                  reason=f"no oneDNN packing here: {packed.unavailable()}")


@pytest.fixture(autouse=True)
def _pack_small_layers(monkeypatch):
    """The tests' layers are small: pack them anyway (one test checks the size floor)."""
    monkeypatch.setattr(packed, "MIN_ELEMENTS", 0)


def _layers(seed: int = 0) -> list[nn.Linear]:
    torch.manual_seed(seed)
    return [nn.Linear(48, 80), nn.Linear(80, 48, bias=False), nn.Linear(7, 300)]


@needs_onednn
@pytest.mark.parametrize("rows", [(1,), (9,), (2, 9), (3, 1, 5)])
def test_packed_linear_equals_dense_for_any_leading_shape(rows):
    mods = _layers()
    dense = [(m.weight.detach().clone(), None if m.bias is None else m.bias.detach().clone())
             for m in mods]
    assert "oneDNN packed (3 layers" in packed.pack_linears([nn.Sequential(*mods)])
    for m, (w, b) in zip(mods, dense):
        x = torch.randn(*rows, w.shape[1])
        with torch.inference_mode():
            got = m(x)
            strided = m(torch.randn(w.shape[1], *rows).movedim(0, -1))   # non-contiguous input
        torch.testing.assert_close(got, F.linear(x, w, b), rtol=1e-5, atol=1e-5)
        assert got.shape == (*rows, w.shape[0]) and strided.shape == got.shape


@needs_onednn
def test_an_updated_weight_is_packed_again_and_autograd_uses_the_dense_weight():
    m = _layers()[0]
    packed.pack_linears([m])
    x = torch.randn(4, 48)
    with torch.no_grad():
        m.weight.mul_(-3.0)                                    # in place: same storage, new version
    with torch.inference_mode():
        torch.testing.assert_close(m(x), F.linear(x, m.weight, m.bias), rtol=1e-5, atol=1e-5)
    m.weight = nn.Parameter(torch.randn(80, 48))               # replaced
    with torch.inference_mode():
        torch.testing.assert_close(m(x), F.linear(x, m.weight, m.bias), rtol=1e-5, atol=1e-5)
    m(x).sum().backward()
    assert m.weight.grad is not None and torch.equal(m.weight.grad, x.sum(0).expand(80, 48))


def test_nothing_is_packed_without_memory_for_the_copies_or_without_onednn(monkeypatch):
    mods = _layers()
    monkeypatch.setattr(packed, "available_bytes", lambda device: 1000)
    said = packed.pack_linears(mods)
    assert said.startswith("linears: torch F.linear (packing them would take") and "GB" in said
    monkeypatch.setenv("DFLASH2RT_CPU_PACK", "0")
    assert packed.pack_linears(mods) == "linears: torch F.linear (DFLASH2RT_CPU_PACK=0)"
    monkeypatch.delenv("DFLASH2RT_CPU_PACK")
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    assert packed.pack_linears(mods) == "linears: torch F.linear (this torch build has no " \
                                        "oneDNN (mkldnn))"
    assert not any(hasattr(m, packed.PACK_ATTR) for m in mods)
    assert all(m.forward.__func__ is nn.Linear.forward for m in mods)


@needs_onednn
def test_runs_say_what_the_pass_did_and_decode_the_same_tokens():
    """float32 models are packed and say so in every run's stats; greedy tokens equal those of
    the same weights unpacked; float64 models are left alone, and say that too."""
    req = [Request((5, 9, 11, 13), SamplingParams(max_new_tokens=12))]
    plain = tiny_pair("dflash2", block=4, dtype=torch.float32)
    want, _ = Engine(plain, get_backend("cpu-nofp64")).generate(req, spec=False)
    pair = tiny_pair("dflash2", block=4, dtype=torch.float32)
    for _ in range(2):
        outs, stats = Engine(pair, get_backend("cpu")).generate(req, spec=False)
        assert stats.model_pass.startswith("linears: oneDNN packed (")
        assert outs[0].token_ids == want[0].token_ids
    _, stats = Engine(tiny_pair("dflash2", block=4), get_backend("cpu")).generate(req)
    assert stats.model_pass.startswith("linears: torch F.linear (no float32 CPU linear layer of")


def test_layers_below_the_size_floor_stay_on_f_linear(monkeypatch):
    monkeypatch.setattr(packed, "MIN_ELEMENTS", 48 * 80)
    mods = _layers()                                   # 48 x 80, 80 x 48 and 7 x 300 weights
    said = packed.pack_linears([nn.Sequential(*mods)])
    if packed.unavailable() is None:
        assert said.startswith("linears: oneDNN packed (2 layers")
    assert not hasattr(mods[2], packed.PACK_ATTR)
    assert mods[2].forward.__func__ is nn.Linear.forward


@needs_onednn
def test_one_row_reads_the_dense_weight_more_rows_the_packed_one(monkeypatch):
    """A single row (batch-1 decode) is a matrix-vector product, which MKL's F.linear reads
    faster than oneDNN's packed weight; two rows and more run packed. Same values either way."""
    m = _layers()[0]
    packed.pack_linears([m])
    seen = []

    class Spy:
        @staticmethod
        def linear(*a):
            seen.append(a[0].shape)
            return F.linear(*a)

    monkeypatch.setattr(packed, "F", Spy)
    with torch.inference_mode():
        for shape in ((1, 48), (1, 1, 48), (2, 48), (1, 9, 48), (48,)):
            x = torch.randn(*shape)
            torch.testing.assert_close(m(x), F.linear(x, m.weight, m.bias), rtol=1e-5, atol=1e-5)
    assert seen == [(1, 48), (1, 1, 48), (48,)]
