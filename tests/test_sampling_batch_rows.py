"""``SamplingBatch`` and ``BlockNoise`` against their definitions: each parameter list's length
checked alone, the host facts (``any_sampled``, ``top_k_max``, ``top_p_rows``, whether min-p is
staged) computed anew from the rows in every position, the greedy batch as rows of the default
parameters, the placeholder noise with the shapes and domain of drawn noise, and both frozen (a
batch shared between steps and graph inputs cannot have a field rebound)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from dflash2rt.ops.batch import BlockNoise, SamplingBatch
from dflash2rt.ops.rng import Stream, uniforms

BELOW_1 = float(np.nextafter(np.float32(1), np.float32(0)))   # the largest float32 below 1


def _lists(r: int) -> dict[str, list]:
    return {"temperature": [0.5 + i for i in range(r)], "top_k": [i for i in range(r)],
            "top_p": [1.0] * r, "min_p": [0.1] * r}


@pytest.mark.parametrize("field", ["temperature", "top_k", "top_p", "min_p"])
@pytest.mark.parametrize("delta", [-1, 1])
def test_a_parameter_list_of_another_length_alone_is_refused(field, delta):
    args = _lists(3)
    args[field] = _lists(3 + delta)[field]
    min_p = args["min_p"] if field == "min_p" else None      # the one list that is wrong
    with pytest.raises(ValueError):
        SamplingBatch.build(args["temperature"], args["top_k"], args["top_p"], min_p=min_p)


def test_lists_of_one_length_are_accepted():
    for r in (0, 1, 3):
        a = _lists(r)
        s = SamplingBatch.build(a["temperature"], a["top_k"], a["top_p"], min_p=a["min_p"])
        assert s.temperature.shape == s.top_k.shape == s.top_p.shape == (r,)


@pytest.mark.parametrize("min_p, staged", [
    (None, False), ([0.0, 0.0, 0.0], False), ([0.0, 0.0, 0.2], True), ([0.3, 0.0, 0.0], True),
    ([1e-6, 1e-6, 1e-6], True),
])
def test_min_p_is_staged_exactly_when_some_row_has_it(min_p, staged):
    extra = torch.tensor([7, 8, 9])
    s, also = SamplingBatch.build_with([1.0, 0.0, 0.7], [0, 0, 3], [1.0, 0.9, 1.0],
                                       min_p=min_p, also=[extra])
    assert (s.min_p is not None) == staged
    if staged:
        assert s.min_p.dtype == torch.float32
        assert s.min_p.tolist() == [float(np.float32(m)) for m in min_p]
    assert len(also) == 1 and also[0].tolist() == [7, 8, 9]
    assert s.temperature.tolist() == [1.0, 0.0, pytest.approx(0.7)]


def _greedy_mixes():
    """Every batch of up to 4 rows, each greedy or sampled."""
    for r in range(5):
        for mask in range(2 ** r):
            yield [(mask >> i) & 1 for i in range(r)]


def test_any_sampled_and_greedy_are_the_rows_own():
    for sampled in _greedy_mixes():
        temps = [0.25 * (1 + i) if on else 0.0 for i, on in enumerate(sampled)]
        s = SamplingBatch.build(temps, [0] * len(temps), [1.0] * len(temps))
        assert s.any_sampled == (sum(sampled) > 0), sampled
        assert s.greedy.tolist() == [not on for on in sampled], sampled


@pytest.mark.parametrize("top_k, want", [
    ([], 0), ([0], 0), ([0, 0, 0], 0), ([5], 5), ([0, 3, 0], 3), ([9, 0, 4], 9),
    ([1, 2, 30], 30), ([2**40, 7], 2**40),
])
def test_top_k_max_is_the_largest_top_k_and_zero_when_no_row_truncates(top_k, want):
    r = len(top_k)
    s = SamplingBatch.build([1.0] * r, top_k, [1.0] * r)
    assert s.top_k_max == want
    assert s.top_k.tolist() == top_k


def test_top_p_rows_are_the_rows_whose_float32_top_p_is_below_one_in_any_order():
    values = [1.0, BELOW_1, 1.0 - 1e-9, 0.5, 1e-6]     # 1 - 1e-9 is 1.0 in float32
    below = [False, True, False, True, True]
    for perm in ([0, 1, 2, 3, 4], [4, 3, 2, 1, 0], [2, 0, 4, 1, 3], [1, 2, 0, 4, 3]):
        s = SamplingBatch.build([1.0] * 5, [0] * 5, [values[i] for i in perm])
        assert s.top_p_rows == tuple(j for j, i in enumerate(perm) if below[i]), perm


@pytest.mark.parametrize("r", [0, 1, 3])
def test_the_greedy_batch_is_r_rows_of_the_default_parameters(r):
    s = SamplingBatch.greedy_batch(r)
    assert s.temperature.tolist() == [0.0] * r and s.temperature.dtype == torch.float32
    assert s.top_k.tolist() == [0] * r and s.top_k.dtype == torch.int64
    assert s.top_p.tolist() == [1.0] * r and s.top_p.dtype == torch.float32
    assert s.greedy.tolist() == [True] * r
    assert s.any_sampled is False and s.top_k_max == 0 and s.top_p_rows == ()
    assert s.min_p is None


@pytest.mark.parametrize("r, gamma", [(1, 1), (2, 1), (1, 3), (3, 4), (4, 2), (5, 7)])
def test_placeholder_noise_has_the_shapes_and_domain_of_drawn_noise(r, gamma):
    z = torch.zeros(r, dtype=torch.int64)
    drawn, unused = BlockNoise.draw(z, z, z, gamma), BlockNoise.unused(r, gamma, "cpu")
    for name in ("walk", "accept", "residual", "bonus"):
        a, b = getattr(drawn, name), getattr(unused, name)
        assert b.shape == a.shape and b.dtype == a.dtype == torch.float32, name
        assert b.is_contiguous(), name
        assert bool(((b > 0) & (b < 1)).all()), f"{name}: a uniform lies in (0, 1)"
    assert unused.walk.shape == (r, gamma) and unused.bonus.shape == (r,)


@pytest.mark.parametrize("gamma", [1, 3])
def test_drawn_noise_is_keyed_by_each_row_s_absolute_positions(gamma):
    """Slot e of row i decides position anchor_i + 1 + e, the bonus position anchor_i + 1 + γ:
    each compared with that (seed, request, position)'s uniform, rows with different keys."""
    seed, req, anchor = torch.tensor([3, 11, 3]), torch.tensor([0, 2, 5]), torch.tensor([0, 9, 4])
    noise = BlockNoise.draw(seed, req, anchor, gamma)
    streams = {Stream.WALK: noise.walk, Stream.ACCEPT: noise.accept,
               Stream.RESIDUAL: noise.residual}
    for i in range(3):
        for e in range(gamma):
            at = torch.tensor(int(anchor[i]) + 1 + e)
            for stream, got in streams.items():
                want = uniforms(seed[i], req[i], at, stream)
                assert float(got[i, e]) == float(want), (i, e, stream)
        at = torch.tensor(int(anchor[i]) + 1 + gamma)
        assert float(noise.bonus[i]) == float(uniforms(seed[i], req[i], at, Stream.BONUS))


def test_batches_and_noise_are_frozen():
    s = SamplingBatch.build([1.0, 0.0], [3, 0], [0.5, 1.0])
    z = torch.zeros(2, dtype=torch.int64)
    for obj, name in ((s, "any_sampled"), (s, "top_p_rows"), (s.take([1]), "top_k_max"),
                      (BlockNoise.draw(z, z, z, 2), "bonus"),
                      (BlockNoise.unused(2, 2, "cpu"), "walk")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(obj, name, None)
