"""A stable descending sort of float32 rows: the order top-p needs, fast on the CPU.

``torch.sort(x, descending=True, stable=True)`` orders by value, ties by lower index. On the
CPU it is several times slower for rows of a vocabulary than NumPy's SIMD sort of int64 keys
(docs/benchmarks/real-scale.md).
Each value becomes one key that carries its index, so the sorted keys give the permutation:

    key = order_bits(value) << 32 | (V - 1 - index)

``order_bits`` maps float32 bit patterns to int32 in value order (-0.0 counts as +0.0, as
comparisons do); sorting the keys ascending and reading them backwards orders by value
descending, then by index ascending — exactly the stable order, so results built on it are
bit-identical to ``torch.sort``'s. NaN rows get some permutation (callers flag such rows).
Other devices, dtypes, autograd, and rows of 2^31 or more take ``torch.sort``.
"""

from __future__ import annotations

import numpy as np
import torch


def sort_desc_stable(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, indices) of ``x`` sorted along the last axis, descending, ties by lower index:
    ``torch.sort(x, dim=-1, descending=True, stable=True)``, the same tensors bit for bit."""
    v = x.shape[-1]
    if x.device.type != "cpu" or x.dtype != torch.float32 or x.requires_grad or v >= 2**31 \
            or x.numel() == 0:
        return torch.sort(x, dim=-1, descending=True, stable=True)
    bits = (x + 0.0).contiguous().view(torch.int32).numpy()          # -0.0 → +0.0
    ordered = np.where(bits >= 0, bits, bits ^ np.int32(0x7FFFFFFF)).astype(np.int64)
    keys = (ordered << 32) | (v - 1 - np.arange(v, dtype=np.int64))
    keys.sort(axis=-1)                                                # ascending, in place
    order = (v - 1) - (keys[..., ::-1] & np.int64(0xFFFFFFFF))
    idx = torch.from_numpy(np.ascontiguousarray(order))
    return x.gather(-1, idx), idx
