"""The KV-cache memory check of ``dflash2rt.engine.memory`` against sizes counted anew: bytes
of one cache by hand, the bytes ``make_caches`` asks the device for equal the bytes of the
tensors it then allocates (target K/V, draft K/V and the draft's context-hidden side buffer),
and an allocation failure becomes a ResourceError while any other error passes through."""

from __future__ import annotations

import pytest
import torch

from dflash2rt.engine import memory as engine_memory
from dflash2rt.errors import ResourceError
from dflash2rt.models.kv_cache import KVCache
from dflash2rt.models.pair import ModelPair

from tiny_models import tiny_pair

CPU = torch.device("cpu")
# tiny_pair's sizes: target 3 layers, draft 2 layers; 2 KV heads of 8, hidden 32 in both.
TARGET_BYTES = 3 * 2 * 16 * 2 * 8 * 2 * 8      # layers x 2 slots x 16 rows x heads x dim, K+V, f64
DRAFT_BYTES = 2 * 2 * 16 * 2 * 8 * 2 * 8
SIDE_BYTES = 2 * 16 * 32 * 8                    # 2 slots x 16 rows x hidden, f64


def _nbytes(cache: KVCache) -> int:
    return sum(t.numel() * t.element_size() for t in (*cache.k, *cache.v, *cache.side))


@pytest.fixture
def asked(monkeypatch):
    """The byte counts make_caches passes to the free-memory check (which then passes)."""
    seen = []
    monkeypatch.setattr(engine_memory, "check_fits", lambda need, *a: seen.append(need))
    return seen


@pytest.mark.parametrize("dtype,size", [(torch.float64, 8), (torch.float32, 4),
                                        (torch.bfloat16, 2), (torch.float16, 2)])
def test_cache_bytes_by_hand(dtype, size):
    assert engine_memory.cache_bytes(3, 2, 5, 4, 8, dtype) == 3 * 2 * 5 * 4 * 8 * 2 * size
    assert engine_memory.cache_bytes(1, 1, 1, 1, 1, dtype) == 2 * size        # one K, one V
    assert engine_memory.cache_bytes(7, 1, 1, 1, 1, dtype) == 14 * size


def test_speculative_caches_ask_for_what_they_allocate(asked):
    target, draft = engine_memory.make_caches(tiny_pair(), CPU, 2, 16, True)
    assert asked == [TARGET_BYTES + DRAFT_BYTES + SIDE_BYTES]
    assert (_nbytes(target), _nbytes(draft)) == (TARGET_BYTES, DRAFT_BYTES + SIDE_BYTES)


def test_target_only_caches_ask_for_the_target_alone(asked):
    pair = tiny_pair()
    target, draft = engine_memory.make_caches(pair, CPU, 2, 16, False)
    assert draft is None and asked == [TARGET_BYTES] and _nbytes(target) == TARGET_BYTES
    alone = ModelPair(pair.target, None)                   # no draft at all: never looked at
    target, draft = engine_memory.make_caches(alone, CPU, 2, 16, False)
    assert draft is None and asked[-1] == TARGET_BYTES


def test_the_whole_need_is_checked_against_free_memory(monkeypatch):
    """One byte short of target + draft + side buffer is refused before any allocation."""
    from dflash2rt.models import memory

    need = TARGET_BYTES + DRAFT_BYTES + SIDE_BYTES
    allocated = []
    real = KVCache.empty
    monkeypatch.setattr(KVCache, "empty",
                        lambda *a, **k: allocated.append(a) or real(*a, **k))
    monkeypatch.setattr(memory, "available_bytes", lambda dev: need - 1)
    with pytest.raises(ResourceError, match=r"the KV cache \(2 requests x 16 rows\) needs .*"
                                            r"lower max_new_tokens"):
        engine_memory.make_caches(tiny_pair(), CPU, 2, 16, True)
    assert allocated == []
    monkeypatch.setattr(memory, "available_bytes", lambda dev: need)
    engine_memory.make_caches(tiny_pair(), CPU, 2, 16, True)
    assert len(allocated) == 2                              # target, then draft


@pytest.mark.parametrize("exc", [torch.OutOfMemoryError("CUDA out of memory"), MemoryError(),
                                 RuntimeError("DefaultCPUAllocator: can't allocate memory")])
def test_an_allocation_failure_is_a_resource_error(asked, monkeypatch, exc):
    """1000 slots x 4096 rows: 3 145 728 000 + 2 097 152 000 + 1 048 576 000 bytes (nothing is
    allocated: the allocation is the one that fails)."""
    def fail(*a, **k):
        raise exc
    monkeypatch.setattr(KVCache, "empty", fail)
    with pytest.raises(ResourceError, match=r"^the KV cache \(1000 requests x 4096 rows, "
                                            r"6\.29 GB\) could not be allocated on cpu: ") as info:
        engine_memory.make_caches(tiny_pair(), CPU, 1000, 4096, True)
    assert info.value.__cause__ is exc and asked == [6_291_456_000]


def test_other_runtime_errors_pass_through(asked, monkeypatch):
    exc = RuntimeError("a bug, not a lack of memory")

    def fail(*a, **k):
        raise exc
    monkeypatch.setattr(KVCache, "empty", fail)
    with pytest.raises(RuntimeError) as info:
        engine_memory.make_caches(tiny_pair(), CPU, 2, 16, True)
    assert info.value is exc
