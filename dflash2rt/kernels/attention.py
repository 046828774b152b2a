"""Attention kernel over the static KV cache: per-row key ranges read on the device.

Kernel version of ``dflash2rt.ops.attention.attention``: q [R, T, nh, hd] attends the cache rows
k, v [R, L, n_kv, hd] (``cache[:, :L]``, any strides, never copied); query row (r, j) sees keys
lo[r, j] <= p < hi[r, j]. Flash-attention style: one program per (query-row tile, KV head,
request) holds the tile's queries of every query head of its GQA group (rows m = j * G + g, so
query head h = kv_head * G + g reads KV head h // G, no repeat of K/V), and walks the key tiles
from the tile's smallest lo to its largest hi with an online softmax in float32 (running max,
running sum, float32 accumulator; ``tl.dot`` in the input dtype, IEEE float32 for float32).

The loop bounds are loaded from lo / hi on the device: no host sync, and the grid depends only on
the shapes (R, T, n_kv), never on lengths. So a CUDA / HIP / XPU graph captured once over the
whole static cache (L = max_len) replays with each request reading only its live context: this
replaces context-length buckets. Keys at or past L are never read (a guard against hi > L).

Dtypes: float32, float16 and bfloat16 (what the GPU backends declare); float64 is refused (the
kernel computes in float32, and no kernel backend declares float64). A row with lo >= hi (outside
the contract) gets zeros, not NaN.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..errors import InvalidInputError
from .launch import launch
from .tuning import DEFAULT, Tuning

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_HEAD_DIM = 256
_LOG2E = 1.4426950408889634


# T (query rows) and L (cache rows read) are bounds and offsets that change with the block and
# the context: not specialized, so they cost no compile each.
@triton.jit(do_not_specialize=["T", "L"])
def _attention_kernel(q_ptr, k_ptr, v_ptr, lo_ptr, hi_ptr, out_ptr, T, L, HD, G, qk_scale,
                      sq_r, sq_t, sq_h, sq_d, sk_r, sk_l, sk_h, sk_d,
                      sv_r, sv_l, sv_h, sv_d, so_r, so_t, so_h, so_d,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                      PRECISION: tl.constexpr):
    r = tl.program_id(2).to(tl.int64)                       # 64-bit: a big cache overflows i32
    kvh = tl.program_id(1).to(tl.int64)
    m = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)   # rows (m//G, m%G)
    j = m // G
    head = kvh * G + m % G
    live = j < T
    d = tl.arange(0, BLOCK_D)
    dmask = d < HD
    lo = tl.load(lo_ptr + r * T + j, mask=live, other=2 ** 30).to(tl.int32)   # [BLOCK_M]
    hi = tl.load(hi_ptr + r * T + j, mask=live, other=0).to(tl.int32)
    hi = tl.minimum(hi, L)
    q = tl.load(q_ptr + r * sq_r + j[:, None] * sq_t + head[:, None] * sq_h + d[None, :] * sq_d,
                mask=live[:, None] & dmask[None, :], other=0.0)           # [BLOCK_M, BLOCK_D]
    k_base = k_ptr + r * sk_r + kvh * sk_h
    v_base = v_ptr + r * sv_r + kvh * sv_h
    m_i = tl.full([BLOCK_M], -float("inf"), tl.float32)    # running max (log2 units)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)            # running sum of weights
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    start = (tl.min(lo, 0) // BLOCK_N) * BLOCK_N           # read on the device: live keys only
    end = tl.max(hi, 0)
    for n0 in range(start, end, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)                     # [BLOCK_N] key positions
        nmask = n < end
        kt = tl.load(k_base + n[None, :] * sk_l + d[:, None] * sk_d,
                     mask=nmask[None, :] & dmask[:, None], other=0.0)    # [BLOCK_D, BLOCK_N]
        s = tl.dot(q, kt, input_precision=PRECISION) * qk_scale        # [BLOCK_M, BLOCK_N]
        seen = (n[None, :] >= lo[:, None]) & (n[None, :] < hi[:, None])
        s = tl.where(seen, s, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)   # no key yet: no NaN
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])                   # masked keys: exactly 0
        l_i = l_i * alpha + tl.sum(p, 1)
        vt = tl.load(v_base + n[:, None] * sv_l + d[None, :] * sv_d,
                     mask=nmask[:, None] & dmask[None, :], other=0.0)    # [BLOCK_N, BLOCK_D]
        acc = acc * alpha[:, None] + tl.dot(p.to(vt.dtype), vt, input_precision=PRECISION)
        m_i = m_new
    out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]     # an empty range gives zeros
    tl.store(out_ptr + r * so_r + j[:, None] * so_t + head[:, None] * so_h + d[None, :] * so_d,
             out.to(out_ptr.dtype.element_ty), mask=live[:, None] & dmask[None, :])


def check_attention_args(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lo: torch.Tensor,
                         hi: torch.Tensor) -> tuple[int, int, int, int, int, int]:
    """Shapes and dtypes the kernel runs (no values read: no host sync) → R, T, nh, hd, L, n_kv."""
    if q.dim() != 4 or k.dim() != 4 or k.shape != v.shape or k.shape[0] != q.shape[0] \
            or k.shape[3] != q.shape[3] or k.shape[2] == 0 or q.shape[2] % k.shape[2]:
        raise InvalidInputError(f"attention: incompatible q {tuple(q.shape)}, k "
                                f"{tuple(k.shape)}, v {tuple(v.shape)} (q [R, T, nh, hd], k, v "
                                f"[R, L, n_kv, hd], nh a multiple of n_kv)")
    (r, t, nh, hd), (_, n_keys, n_kv, _) = q.shape, k.shape
    if lo.shape != (r, t) or hi.shape != (r, t):
        raise InvalidInputError(f"attention: lo {tuple(lo.shape)} and hi {tuple(hi.shape)} must "
                                f"be [R, T] = {(r, t)}")
    if q.dtype not in DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        raise InvalidInputError(f"attention kernel: q, k, v must share one of "
                                f"{[str(x) for x in DTYPES]} (it computes in float32), got "
                                f"{q.dtype}, {k.dtype}, {v.dtype}")
    if hd > MAX_HEAD_DIM:
        raise InvalidInputError(f"attention kernel: head dim {hd} > {MAX_HEAD_DIM}")
    return r, t, nh, hd, n_keys, n_kv


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lo: torch.Tensor,
              hi: torch.Tensor, scale: float, tuning: Tuning = DEFAULT) -> torch.Tensor:
    """Kernel version of ``dflash2rt.ops.attention.attention`` (same contract; k, v may be
    strided slices of a larger cache). → [R, T, nh, hd] in q's dtype."""
    r, t, nh, hd, n_keys, n_kv = check_attention_args(q, k, v, lo, hi)
    out = torch.empty(r, t, nh, hd, dtype=q.dtype, device=q.device)
    if out.numel() == 0:
        return out
    group = nh // n_kv
    block_d = max(16, triton.next_power_of_2(hd))
    # tl.dot needs ≥ 16 rows; the tuned tile is capped so q + the accumulator (M × D) and a
    # K or V tile (N × D) stay within registers / shared memory at hd = 256.
    block_m = max(16, min(tuning.attn_block_m, triton.next_power_of_2(t * group),
                          8192 // block_d))
    block_n = max(16, min(tuning.attn_block_n, 8192 // block_d))
    grid = (triton.cdiv(t * group, block_m), n_kv, r)
    launch(
        _attention_kernel, grid,
        q, k, v, lo.to(torch.int64).contiguous(), hi.to(torch.int64).contiguous(), out,
        t, n_keys, hd, group, float(scale) * _LOG2E, *q.stride(), *k.stride(), *v.stride(),
        *out.stride(), BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d, PRECISION="ieee",
        num_warps=tuning.num_warps)
    return out
