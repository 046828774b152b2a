"""Top-k per row in one launch: the kernel form of ``ops.selector.topk_lowest_index`` and of
``ops.sampling.bad_rows`` over the same rows.

Each value maps to an int64 key that orders like (value, -index): the float's bits made
monotone (−0.0 taken as +0.0, which compares equal to it) in the high word, the complement of
its index in the low word, so keys are unique and the largest key is the largest value at its
lowest index. Pass i takes the largest key below pass i-1's, over the row in chunks of
``BLOCK_V``; NaN never qualifies (the row is flagged bad, and a row with fewer than k
non-NaN values repeats the last index there). ``BLOCK_N`` rows share a program.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..errors import InvalidInputError
from .launch import launch
from .norm import DTYPES
from .tuning import interpreting

TOPK_TILE = 1024          # vocabulary chunk: a longer row loops
ROWS = 1                  # rows per program on a device (the rows run in parallel)
INTERPRET_ROWS = 64       # under the interpreter (its programs run one after another)


# The row count (requests × slots) changes with the batch and the block: one binary for all.
@triton.jit(do_not_specialize=["N"])
def _topk_kernel(x_ptr, vals_ptr, ids_ptr, bad_ptr, N, V, K,
                 BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)       # [BN]
    live = rows < N
    base = rows * V
    lowest = tl.full([BLOCK_N, BLOCK_V], -9223372036854775807 - 1, tl.int64)
    # The row's flags: a NaN, a +inf, a finite value.
    nan = tl.zeros([BLOCK_N], dtype=tl.int32)
    pinf = tl.zeros([BLOCK_N], dtype=tl.int32)
    fin = tl.zeros([BLOCK_N], dtype=tl.int32)
    for c0 in range(0, V, BLOCK_V):
        cols = c0 + tl.arange(0, BLOCK_V)
        m = live[:, None] & (cols[None, :] < V)
        x = tl.load(x_ptr + base[:, None] + cols[None, :], mask=m, other=0.0).to(tl.float32)
        nan = tl.maximum(nan, tl.max(tl.where(m & (x != x), 1, 0), 1))
        pinf = tl.maximum(pinf, tl.max(tl.where(m & (x == float("inf")), 1, 0), 1))
        fin = tl.maximum(fin, tl.max(tl.where(m & (tl.abs(x) < float("inf")), 1, 0), 1))
    tl.store(bad_ptr + rows, ((nan + pinf + (1 - fin)) > 0).to(tl.int8), mask=live)
    prev = tl.full([BLOCK_N], 9223372036854775807, tl.int64)
    for i in range(0, K):
        best = tl.full([BLOCK_N], -9223372036854775807 - 1, tl.int64)
        for c0 in range(0, V, BLOCK_V):
            cols = c0 + tl.arange(0, BLOCK_V)
            m = live[:, None] & (cols[None, :] < V)
            x = tl.load(x_ptr + base[:, None] + cols[None, :], mask=m, other=0.0).to(tl.float32)
            bits = x.to(tl.int32, bitcast=True)
            bits = tl.where(bits == -2147483647 - 1, 0, bits)              # -0.0 as +0.0
            mono = tl.where(bits >= 0, bits, bits ^ 2147483647)
            key = (mono.to(tl.int64) << 32) + (2147483647 - cols[None, :]).to(tl.int64)
            ok = m & (x == x) & (key < prev[:, None])
            best = tl.maximum(best, tl.max(tl.where(ok, key, lowest), 1))
        low = best - ((best >> 32) << 32)
        col = tl.minimum(2147483647 - low, V - 1)
        val = tl.load(x_ptr + base + col, mask=live, other=0.0).to(tl.float32)
        tl.store(vals_ptr + rows * K + i, val, mask=live)
        tl.store(ids_ptr + rows * K + i, col, mask=live)
        prev = best


def topk(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [..., V] (float32 or a half type) → (values [..., k] float32, ids [..., k] int64, in
    ``topk_lowest_index``'s order and bits; bad [...] int8: 1 where ``bad_rows(x)``)."""
    v = x.shape[-1]
    if x.dtype not in DTYPES or not 1 <= k <= v:
        raise InvalidInputError(f"topk kernel: x [..., V] of one of {[str(d) for d in DTYPES]} "
                                f"and 1 <= k <= V, got {tuple(x.shape)} {x.dtype}, k={k}")
    lead = x.shape[:-1]
    flat = x.reshape(-1, v).contiguous()
    n = flat.shape[0]
    vals = torch.empty(n, k, dtype=torch.float32, device=x.device)
    ids = torch.empty(n, k, dtype=torch.int64, device=x.device)
    bad = torch.empty(n, dtype=torch.int8, device=x.device)
    if n:
        rows = INTERPRET_ROWS if interpreting() else ROWS      # a constant: no batch variants
        launch(_topk_kernel, (triton.cdiv(n, rows),), flat, vals, ids, bad, n, v, k,
               BLOCK_N=rows, BLOCK_V=min(triton.next_power_of_2(v), TOPK_TILE))
    return vals.view(*lead, k), ids.view(*lead, k), bad.view(lead)
