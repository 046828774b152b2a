"""The counter-based generator: known answers, batch independence, range, stream separation."""

from __future__ import annotations

import torch

from dflash2rt.ops.batch import BlockNoise
from dflash2rt.ops.rng import (Stream, bits_to_uniform, philox4x32, philox_np, philox_words,
                               random_bits, uniform_words, uniforms)


def _t(*vals):
    return tuple(torch.tensor([v], dtype=torch.int64) for v in vals)


def test_philox_known_answers():
    # Random123 kat_vectors, philox4x32_10.
    cases = [
        ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
        ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
        ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
         (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
    ]
    for ctr, key, want in cases:
        got = tuple(int(x) for x in philox4x32(_t(*ctr), _t(*key)))
        assert got == want
        got = tuple(int(x[0]) for x in philox_np(tuple(t.numpy() for t in _t(*ctr)),
                                                 tuple(t.numpy() for t in _t(*key))))
        assert got == want


def test_numpy_and_tensor_paths_agree():
    g = torch.Generator().manual_seed(0)
    ctr = tuple(torch.randint(0, 2**32, (5000,), generator=g) for _ in range(4))
    key = tuple(torch.randint(0, 2**32, (5000,), generator=g) for _ in range(2))
    fast = philox_np(tuple(c.numpy() for c in ctr), tuple(k.numpy() for k in key))
    limbs = philox4x32(ctr, key)
    for a, b in zip(fast, limbs):
        assert (a.astype("int64") == b.numpy()).all()


def test_uniform_words_equal_the_limb_path_bit_for_bit(monkeypatch):
    """The CPU NumPy pass of ``uniform_words`` gives the limb path's uniforms (what every other
    device computes) for every stream, over seeds up to 2^63, request keys with high bits set
    (the calibration key), and positions past 2^32."""
    g = torch.Generator().manual_seed(3)
    seed = torch.randint(0, 2**63 - 1, (40, 1), generator=g)
    req = torch.randint(0, 2**62, (40, 1), generator=g) | (1 << 62)
    pos = torch.randint(0, 2**40, (40, 9), generator=g)
    got = uniform_words(seed, req, pos)
    assert got.shape == (4, 40, 9) and got.dtype == torch.float32
    limbs = torch.stack([bits_to_uniform(w) for w in philox4x32(
        (pos & 0xFFFFFFFF, (pos >> 32) & 0xFFFFFFFF, (req & 0xFFFFFFFF).expand(40, 9),
         torch.zeros_like(pos)), ((seed & 0xFFFFFFFF).expand(40, 9),
                                  ((seed >> 32) & 0xFFFFFFFF).expand(40, 9)))])
    assert torch.equal(got.view(torch.int32), limbs.view(torch.int32))
    words = torch.stack([bits_to_uniform(w) for w in philox_words(seed, req, pos)])
    assert torch.equal(got, words)
    for stream in Stream:
        assert torch.equal(uniforms(seed, req, pos, stream), got[stream])


def test_same_key_same_uniform_regardless_of_batch_composition_and_order():
    seeds = torch.tensor([7, 7, 123, 2**40 + 5])
    reqs = torch.tensor([0, 1, 0, 9])
    pos = torch.tensor([[3, 4, 5], [3, 4, 5], [100, 101, 102], [2**33, 2**33 + 1, 2**33 + 2]])
    full = uniforms(seeds.view(-1, 1), reqs.view(-1, 1), pos, Stream.ACCEPT)
    perm = torch.tensor([2, 0, 3, 1])
    shuffled = uniforms(seeds[perm].view(-1, 1), reqs[perm].view(-1, 1), pos[perm], Stream.ACCEPT)
    assert torch.equal(shuffled, full[perm])
    alone = uniforms(seeds[2:3].view(-1, 1), reqs[2:3].view(-1, 1), pos[2:3], Stream.ACCEPT)
    assert torch.equal(alone, full[2:3])
    assert not torch.equal(full[0], full[1])  # request id separates equal seeds


def test_block_noise_is_keyed_by_absolute_position():
    seed, req = torch.tensor([5, 5]), torch.tensor([1, 1])
    a = BlockNoise.draw(seed, req, torch.tensor([10, 12]), gamma=4)
    # Row 1 starts two positions later: its slots 0..1 are row 0's slots 2..3.
    assert torch.equal(a.accept[1, :2], a.accept[0, 2:])
    assert torch.equal(a.walk[1, :2], a.walk[0, 2:])
    streams = [a.walk, a.accept, a.residual]
    for i in range(3):
        for j in range(i + 1, 3):
            assert not torch.equal(streams[i], streams[j])
    # The bonus of row 0 decides position 15 = row 1's slot 2 position: same block, other word.
    assert float(a.bonus[0]) == float(uniforms(seed[0], req[0], torch.tensor(15), Stream.BONUS))
    assert float(a.accept[1, 2]) == float(uniforms(seed[0], req[0], torch.tensor(15),
                                                   Stream.ACCEPT))


def test_uniforms_are_open_interval_exact_float32():
    assert float(bits_to_uniform(torch.tensor(0))) == 2.0 ** -24
    assert float(bits_to_uniform(torch.tensor(2**32 - 1))) == 1 - 2.0 ** -24
    u = uniforms(torch.tensor(1), torch.tensor(0), torch.arange(200_000), Stream.WALK)
    assert u.dtype == torch.float32 and bool((u > 0).all()) and bool((u < 1).all())
    k = u.double() * 2**24
    assert torch.equal(k, torch.round(k)) and bool((k.long() % 2 == 1).all())
    assert abs(float(u.double().mean()) - 0.5) < 0.005
    bits = random_bits(torch.tensor(1), torch.tensor(0), torch.arange(4096), Stream.BONUS)
    assert bool((bits >= 0).all()) and bool((bits < 2**32).all())


def test_the_four_streams_are_the_four_words_of_one_block():
    """At one (seed, request, position) walk, accept, residual and bonus are words 0, 1, 2, 3
    of its Philox block: four different draws, none shared between draft and verification (a
    residual draw equal to the bonus draw of a block ending at the same position would couple
    them)."""
    seed, req = torch.tensor([9, 9]), torch.tensor([4, 4])
    a = BlockNoise.draw(seed, req, torch.tensor([20, 22]), gamma=4)   # row 0's bonus: pos 25
    words = uniform_words(seed[0], req[0], torch.tensor(25))          # [4]
    at_25 = [a.walk[1, 2], a.accept[1, 2], a.residual[1, 2]]         # row 1's slot 2: pos 25
    assert [float(w) for w in words] == [float(x) for x in at_25] + [float(a.bonus[0])]
    assert len({float(w) for w in words}) == 4
    assert [s.value for s in (Stream.WALK, Stream.ACCEPT, Stream.RESIDUAL, Stream.BONUS)] == \
        [0, 1, 2, 3]
