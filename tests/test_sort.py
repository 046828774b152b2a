"""ops.sort.sort_desc_stable: the same tensors as torch's stable descending sort, bit for bit."""

import pytest
import torch

from dflash2rt.ops.sampling import target_probs
from dflash2rt.ops.sort import sort_desc_stable


def _rows(kind: str, shape, g: torch.Generator) -> torch.Tensor:
    if kind == "normal":
        return torch.randn(shape, generator=g) * 4
    if kind == "ties":                          # few distinct values: long tie groups
        return torch.randint(-3, 3, shape, generator=g).float() / 2
    if kind == "signed_zeros":                  # -0.0 and +0.0 compare equal: ties by index
        x = torch.randint(0, 2, shape, generator=g).float() - 0.5
        z = torch.where(torch.rand(shape, generator=g) < 0.5, -0.0, 0.0)
        return torch.where(torch.rand(shape, generator=g) < 0.6, z, x)
    if kind == "infinities":
        x = torch.randn(shape, generator=g)
        x[torch.rand(shape, generator=g) < 0.3] = float("-inf")
        x[torch.rand(shape, generator=g) < 0.05] = float("inf")
        return x
    if kind == "extremes":                      # subnormals, float32 max, huge magnitudes
        vals = torch.tensor([1e-45, -1e-45, 3.4028235e38, -3.4028235e38, 1e-38, -1e-38, 0.0,
                             1.0, -1.0, 2.0, -2.0])
        return vals[torch.randint(0, len(vals), shape, generator=g)]
    raise ValueError(kind)


@pytest.mark.parametrize("kind", ["normal", "ties", "signed_zeros", "infinities", "extremes"])
@pytest.mark.parametrize("shape", [(1, 1, 1), (2, 3, 7), (1, 9, 2048), (3, 130)])
def test_matches_torch_stable_sort_bit_for_bit(kind, shape):
    g = torch.Generator().manual_seed(hash((kind, shape)) % 2**31)
    for _ in range(3):
        x = _rows(kind, shape, g)
        want_v, want_i = torch.sort(x, dim=-1, descending=True, stable=True)
        got_v, got_i = sort_desc_stable(x)
        assert torch.equal(got_i, want_i)
        assert torch.equal(got_v.view(torch.int32), want_v.view(torch.int32))   # signs of zeros


def test_strided_input_and_other_dtypes_take_the_same_order():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 2, 50, generator=g).transpose(0, 1)[..., ::2]       # not contiguous
    assert all(torch.equal(a, b) for a, b in zip(sort_desc_stable(x),
                                                 torch.sort(x, dim=-1, descending=True,
                                                            stable=True)))
    d = x.double()                                                         # torch.sort path
    assert all(torch.equal(a, b) for a, b in zip(sort_desc_stable(d),
                                                 torch.sort(d, dim=-1, descending=True,
                                                            stable=True)))


def test_nan_rows_still_give_a_permutation():
    x = torch.randn(2, 16)
    x[1, 3] = float("nan")
    _, idx = sort_desc_stable(x)
    assert torch.equal(idx.sort(dim=-1).values, torch.arange(16).expand(2, 16))


def test_target_probs_top_p_unchanged_by_the_sort(monkeypatch):
    """target_probs with top-p rows gives the same law as with torch.sort, bit for bit."""
    import dflash2rt.ops.sampling as sampling
    g = torch.Generator().manual_seed(7)
    logits = torch.randint(-4, 4, (3, 5, 300), generator=g).float() / 3   # many ties
    temp = torch.tensor([0.7, 1.0, 0.0])
    top_k = torch.tensor([0, 40, 5])
    top_p = torch.tensor([0.95, 0.5, 0.8])
    got = target_probs(logits, temp, top_k, top_p)
    monkeypatch.setattr(sampling, "sort_desc_stable", lambda x: torch.sort(
        x, dim=-1, descending=True, stable=True))
    want = target_probs(logits, temp, top_k, top_p)
    assert torch.equal(got, want)


@pytest.mark.parametrize("case", ["float64", "bfloat16", "float16", "requires_grad", "empty"])
def test_the_torch_sort_path_keeps_ties_in_index_order(case):
    """Inputs the NumPy keys do not take (other dtypes, autograd, no element) go to
    ``torch.sort``, still stable: long tie groups come out by ascending index."""
    g = torch.Generator().manual_seed(5)
    x = torch.randint(-3, 3, (4, 3000), generator=g).float() / 2
    if case == "empty":
        x = x[:, :0]
    elif case == "requires_grad":
        x = x.requires_grad_()
    else:
        x = x.to(getattr(torch, case))
    values, idx = sort_desc_stable(x)
    assert values.dtype == x.dtype and idx.shape == x.shape
    for row_v, row_i, row in zip(values.tolist(), idx.tolist(), x.tolist()):
        assert row_i == sorted(range(len(row)), key=lambda i: (-row[i], i))
        assert row_v == [row[i] for i in row_i]


@pytest.mark.parametrize("shape", [(1, 1), (3, 1), (2, 5), (4, 2048)])
def test_cpu_float32_rows_take_the_key_sort_not_torch_sort(monkeypatch, shape):
    """The fast path is what CPU float32 rows get, one element per row included."""
    x = torch.randn(shape, generator=torch.Generator().manual_seed(3))
    want = torch.sort(x, dim=-1, descending=True, stable=True)

    def refused(*a, **k):
        raise AssertionError("torch.sort called for a CPU float32 row")
    monkeypatch.setattr(torch, "sort", refused)
    vals, idx = sort_desc_stable(x)
    assert torch.equal(vals, want.values) and torch.equal(idx, want.indices)


@pytest.mark.parametrize("make", [lambda: torch.zeros(0, 4), lambda: torch.zeros(3, 0),
                                  lambda: torch.randn(2, 5, dtype=torch.float64),
                                  lambda: torch.randn(2, 5).requires_grad_()])
def test_empty_other_dtype_and_autograd_rows_take_torch_sort(monkeypatch, make):
    x = make()
    want = torch.sort(x, dim=-1, descending=True, stable=True)
    calls = []
    real = torch.sort

    def counted(*a, **k):
        calls.append(a[0].shape)
        return real(*a, **k)
    monkeypatch.setattr(torch, "sort", counted)
    vals, idx = sort_desc_stable(x)
    assert calls == [x.shape]
    assert torch.equal(vals, want.values) and torch.equal(idx, want.indices)
