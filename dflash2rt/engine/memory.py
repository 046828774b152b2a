"""Memory the KV caches need, checked against what the device has before anything is allocated."""

from __future__ import annotations

import torch

from ..errors import ResourceError
from ..models.kv_cache import KVCache
from ..models.memory import check_fits
from ..models.pair import ModelPair


def cache_bytes(layers: int, batch: int, rows: int, kv_heads: int, head_dim: int,
                dtype: torch.dtype) -> int:
    """Bytes of one KVCache: K and V [batch, rows, kv_heads, head_dim] per layer."""
    return layers * batch * rows * kv_heads * head_dim * 2 * torch.empty((), dtype=dtype).element_size()


def make_caches(pair: ModelPair, dev: torch.device, capacity: int, max_len: int, spec: bool
                ) -> tuple[KVCache, KVCache | None]:
    """Target (and draft) caches of ``capacity`` slots × ``max_len`` rows, after checking
    that they fit in the device's free memory (ResourceError, nothing allocated, if not)."""
    a = pair.target.cfg
    need = cache_bytes(a.num_hidden_layers, capacity, max_len, a.num_key_value_heads,
                       a.head_dim, pair.dtype)
    if spec:
        d = pair.draft.cfg.arch
        need += cache_bytes(d.num_hidden_layers, capacity, max_len, d.num_key_value_heads,
                            d.head_dim, pair.dtype)
        need += capacity * max_len * d.hidden_size * torch.empty((), dtype=pair.dtype).element_size()
    check_fits(need, dev, f"the KV cache ({capacity} requests x {max_len} rows)",
               "max_new_tokens, the prompt length, the number of prompts or block_size")
    try:
        target = KVCache.empty(a.num_hidden_layers, capacity, max_len,
                               a.num_key_value_heads, a.head_dim, pair.dtype, dev)
        return target, \
            pair.draft.empty_cache(capacity, max_len, pair.dtype, dev) if spec else None
    except (RuntimeError, MemoryError) as exc:     # where free memory could not be read
        if not isinstance(exc, (torch.OutOfMemoryError, MemoryError)) \
                and "allocate" not in str(exc):
            raise
        raise ResourceError(f"the KV cache ({capacity} requests x {max_len} rows, "
                            f"{need / 1e9:.2f} GB) could not be allocated on {dev}: {exc}; "
                            "lower max_new_tokens or the number of prompts") from exc
