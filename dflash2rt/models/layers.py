"""Decoder building blocks shared by the target and draft models: RMSNorm, SwiGLU MLP, GQA attention."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dflash2rt.ops import fused
from dflash2rt.ops.attention import AttentionFn, attend, attention, write_rows
from dflash2rt.ops.fused import apply_rotary


class RMSNorm(nn.Module):
    """x / rms(x) * weight over the last dimension, computed in `compute_dtype` and cast back
    (``ops.fused.rms_norm``; inside a decode on a backend with kernels for it, its kernel)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fused.current().rms_norm(x, self.weight, self.eps)


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x))."""

    def __init__(self, hidden: int, intermediate: int, bias: bool = False) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=bias)
        self.up_proj = nn.Linear(hidden, intermediate, bias=bias)
        self.down_proj = nn.Linear(intermediate, hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x)
        return self.down_proj(F.silu(gate) * up)

    def gate_up(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(gate(x), up(x)); a backend's model pass may compute both in one product
        (``cpu/packed.py``)."""
        return self.gate_proj(x), self.up_proj(x)


class Attention(nn.Module):
    """q/k/v/o projections with GQA; optional per-head q/k RMSNorm before rope (Qwen3)."""

    def __init__(
        self, hidden: int, n_heads: int, n_kv_heads: int, head_dim: int, bias: bool, qk_norm_eps: float | None
    ) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, head_dim
        self.scale = head_dim**-0.5
        self.q_proj = nn.Linear(hidden, n_heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden, n_kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, n_kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(n_heads * head_dim, hidden, bias=bias)
        self.q_norm = RMSNorm(head_dim, qk_norm_eps) if qk_norm_eps is not None else None
        self.k_norm = RMSNorm(head_dim, qk_norm_eps) if qk_norm_eps is not None else None

    def project_q(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x [R, T, H] -> rotated queries [R, T, nh, hd]."""
        return self.queries(self.q_proj(x), cos, sin)

    def project_kv(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x [R, T, H] -> rotated keys, values [R, T, n_kv, hd] (what a KV cache stores)."""
        return self.keys_values(self.k_proj(x), self.v_proj(x), cos, sin)

    def project_qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(project_q, *project_kv) of the same x; a backend's model pass may compute the three
        projections in one product (``cpu/packed.py``)."""
        return (self.project_q(x, cos, sin), *self.project_kv(x, cos, sin))

    def queries(self, q: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """q_proj's output [R, T, nh·hd] -> rotated queries [R, T, nh, hd]."""
        q = q.unflatten(-1, (self.n_heads, self.head_dim))  # [R, T, nh, hd]
        if self.q_norm is not None:
            q = self.q_norm(q)
        return apply_rotary(q, cos, sin)

    def keys_values(self, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """k_proj's and v_proj's outputs -> rotated keys, values [R, T, n_kv, hd]."""
        k = k.unflatten(-1, (self.n_kv_heads, self.head_dim))  # [R, T, n_kv, hd]
        if self.k_norm is not None:
            k = self.k_norm(k)
        return apply_rotary(k, cos, sin), v.unflatten(-1, (self.n_kv_heads, self.head_dim))

    def write_kv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 cache_k: torch.Tensor, cache_v: torch.Tensor, write_pos: torch.Tensor) -> None:
        """``project_kv`` of x [R, T, H] written into the caches [R, max_len, n_kv, hd] at
        write_pos [R, T], every row: the attention prologue without query heads (one kernel
        under a kernel backend's ``run_context``)."""
        shape = (self.n_kv_heads, self.head_dim)
        k, v = self.k_proj(x).unflatten(-1, shape), self.v_proj(x).unflatten(-1, shape)
        norm = None if self.k_norm is None else (self.k_norm.weight, self.k_norm.eps)
        fused.current().attention_prologue(k[:, :, :0], k, v, None, norm, cos, sin, cache_k,
                                           cache_v, write_pos)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        past_k: torch.Tensor,
        past_v: torch.Tensor,
        mask: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Attend the T new rows to [past ; new] keys under `mask` [R, T, P + T] (training and
        references: any mask; the runtime uses ``forward_cached``).

        Returns (output [R, T, H], new keys, new values [R, T, n_kv, hd]).
        """
        q, k, v = self.project_qkv(x, cos, sin)  # [R, T, nh, hd], [R, T, n_kv, hd] x 2
        keys = torch.cat((past_k, k), dim=1)  # [R, P + T, n_kv, hd]
        values = torch.cat((past_v, v), dim=1)  # [R, P + T, n_kv, hd]
        out = attend(q, keys, values, mask, self.scale)  # [R, T, nh, hd]
        return self.o_proj(out.flatten(-2)), k, v

    def forward_cached(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache_k: torch.Tensor,
        cache_v: torch.Tensor,
        write_pos: torch.Tensor,
        lo: torch.Tensor,
        hi: torch.Tensor,
        n_keys: int,
        attn: AttentionFn = attention,
    ) -> torch.Tensor:
        """Write the T new rows' K/V into the cache buffers [R, max_len, n_kv, hd] at
        ``write_pos`` [R, T], then attend over the cache's first ``n_keys`` rows: row (r, j)
        sees keys lo[r, j] <= p < hi[r, j] (no copy of the context, GQA inside ``attn``).
        → output [R, T, H]."""
        impl = fused.current()
        if impl is fused.REFERENCE:
            q, k, v = self.project_qkv(x, cos, sin)  # [R, T, nh, hd], [R, T, n_kv, hd] x 2
            write_rows(cache_k, k, write_pos)
            write_rows(cache_v, v, write_pos)
        else:                                     # norm, rope and writes: the backend's kernel
            shape = (self.n_heads, self.head_dim), (self.n_kv_heads, self.head_dim)
            norms = [None if n is None else (n.weight, n.eps) for n in (self.q_norm, self.k_norm)]
            q = impl.attention_prologue(
                self.q_proj(x).unflatten(-1, shape[0]), self.k_proj(x).unflatten(-1, shape[1]),
                self.v_proj(x).unflatten(-1, shape[1]), *norms, cos, sin, cache_k, cache_v,
                write_pos)                        # [R, T, nh, hd]
        out = attn(q, cache_k[:, :n_keys], cache_v[:, :n_keys], lo, hi, self.scale)
        return self.o_proj(out.flatten(-2))
