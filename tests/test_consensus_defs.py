"""What tensor-parallel ranks agree on, against distributed/consensus.py's docstrings: the step
hash as BLAKE2b-64 read little-endian by hand and cut to 62 bits, the step check over a fake
all-reduce (MAX of [h, -h] across ranks written out) with its exact message and step count,
and rank 0's broadcast."""

from __future__ import annotations

import hashlib
import random
from types import SimpleNamespace

import pytest
import torch

from dflash2rt.distributed import consensus
from dflash2rt.distributed.consensus import RankZero, StepCheck, broadcast_from_main, digest
from dflash2rt.errors import DistributedError


def _hash(host: list) -> int:
    """BLAKE2b with an 8-byte digest of the rows' repr, bytes read lowest first, top 62 bits
    of the 64 kept."""
    raw = hashlib.blake2b(repr(host).encode(), digest_size=8).digest()
    value = 0
    for i, b in enumerate(raw):
        value += b * 256 ** i
    return value // 4


def test_digest_is_blake2b_little_endian_cut_to_62_bits():
    rng = random.Random(0)
    rows = [[], [[0]], [[1, 2, 3]], [[2, 0, 11, 4], [0, 0, 9, 9]]]
    rows += [[[rng.randrange(-5, 2 ** 32) for _ in range(rng.randrange(1, 6))]
              for _ in range(rng.randrange(1, 4))] for _ in range(300)]
    seen = set()
    for host in rows:
        h = digest(host)
        assert h == _hash(host), host
        assert 0 <= h < 2 ** 62
        seen.add(h)
    assert len(seen) == len({repr(r) for r in rows})
    assert max(h.bit_length() for h in seen) == 62        # all 62 bits are used
    assert digest([[1, 2]]) != digest([[2, 1]]) and digest([[1], [2]]) != digest([[1, 2]])


class _Ranks:
    """A fake host all-reduce for one rank: the others' hashes are given, MAX taken over
    every rank's [h, -h] as gloo would."""

    def __init__(self, monkeypatch, others: list[int], group) -> None:
        self.others, self.group, self.calls = others, group, 0
        monkeypatch.setattr(consensus.dist, "all_reduce", self)

    def __call__(self, both, op=None, group=None):
        assert op == consensus.dist.ReduceOp.MAX and group is self.group
        assert both.dtype == torch.int64 and both.shape == (2,)
        h = int(both[0])
        assert int(both[1]) == -h                          # this rank sends [h, -h]
        self.calls += 1
        for o in self.others:
            both[0] = max(int(both[0]), o)
            both[1] = max(int(both[1]), -o)


HOST = [[2, 0, 11, 4, 7], [0, 1, 9, 9, 9]]


@pytest.mark.parametrize("rank", [0, 1, 2])
def test_step_check_counts_steps_and_names_the_range(monkeypatch, rank):
    group = object()
    check = StepCheck(SimpleNamespace(rank=rank, host_group=group))
    assert check.steps == 0
    same = _Ranks(monkeypatch, [_hash(HOST)] * 2, group)
    check(HOST)
    check(HOST)
    assert check.steps == 2 and same.calls == 2
    other = [list(r) for r in HOST]
    other[1][4] += 1
    lo, hi = sorted([_hash(HOST), _hash(other)])
    _Ranks(monkeypatch, [_hash(HOST), _hash(other)], group)
    with pytest.raises(DistributedError) as e:
        check(HOST)
    assert str(e.value) == (
        f"ranks disagree on the tokens committed at step 2 (rank {rank}'s hash "
        f"{_hash(HOST):#x}, the ranks' range {lo:#x}..{hi:#x}): the ranks' tensors or "
        "decisions differ")
    assert check.steps == 2                                # a failed step is not counted


@pytest.mark.parametrize("mine_is", ["lowest", "highest"])
def test_step_check_fails_whichever_side_this_rank_is_on(monkeypatch, mine_is):
    """This rank's hash the range's minimum, then its maximum: either end differing fails."""
    rows = [[[k, k + 1]] for k in range(20)]
    hashes = sorted((_hash(r), r) for r in rows)
    (low, low_rows), (high, high_rows) = hashes[0], hashes[-1]
    mine, theirs = (low_rows, high) if mine_is == "lowest" else (high_rows, low)
    _Ranks(monkeypatch, [theirs], None)
    with pytest.raises(DistributedError, match=f"range {low:#x}..{high:#x}"):
        StepCheck(SimpleNamespace(rank=1, host_group=None))(mine)


def test_broadcast_and_rank_zero_take_rank_zeros_value(monkeypatch):
    group = object()
    seen = []

    def broadcast_object_list(box, src=None, group=None):
        seen.append((list(box), src, group))
        box[0] = {"block": 8}                              # what rank 0 sent

    monkeypatch.setattr(consensus.dist, "broadcast_object_list", broadcast_object_list)
    tp = SimpleNamespace(rank=1, host_group=group, group="device")
    assert broadcast_from_main(("mine", 1), tp) == {"block": 8}
    assert RankZero(tp)([3, 4]) == {"block": 8}
    assert seen == [([("mine", 1)], 0, group), ([[3, 4]], 0, group)]
