"""Decoder building blocks shared by the target and draft models: RMSNorm, SwiGLU MLP, GQA attention."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dflash2rt.errors import InvalidInputError
from dflash2rt.models.rope import apply_rotary


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for half types and float32, float64 for float64 (HF upcasts norms and softmax the same way)."""
    return torch.promote_types(dtype, torch.float32)


class RMSNorm(nn.Module):
    """x / rms(x) * weight over the last dimension, computed in `compute_dtype` and cast back."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cdt = compute_dtype(x.dtype)
        if cdt == x.dtype == self.weight.dtype:   # one fused op (float32 / float64)
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        h = x.to(cdt)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x))."""

    def __init__(self, hidden: int, intermediate: int, bias: bool = False) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=bias)
        self.up_proj = nn.Linear(hidden, intermediate, bias=bias)
        self.down_proj = nn.Linear(intermediate, hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """[R, T, n_kv, hd] -> [R, T, n_kv * n_rep, hd]; query head h reads kv head h // n_rep (HF order)."""
    if n_rep == 1:
        return x
    r, t, n_kv, hd = x.shape
    return x[:, :, :, None, :].expand(r, t, n_kv, n_rep, hd).reshape(r, t, n_kv * n_rep, hd)


def attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float | None = None
) -> torch.Tensor:
    """softmax(q k^T * scale) v over keys where mask is True.

    q [R, Tq, nh, hd], k/v [R, Tk, n_kv, hd] (nh a multiple of n_kv), mask bool broadcastable to
    [R, Tq, Tk]. Matmuls run in the input dtype, the softmax in `compute_dtype`. A query row whose mask
    is all False gets a finite (uniform) average instead of NaN, so it cannot poison other rows.
    Returns [R, Tq, nh, hd].
    """
    nh, n_kv = q.shape[2], k.shape[2]
    if nh % n_kv or k.shape != v.shape or q.shape[-1] != k.shape[-1]:
        raise InvalidInputError(f"attend: incompatible q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if mask.dtype != torch.bool:
        raise InvalidInputError(f"attend: mask must be bool, got {mask.dtype}")
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    k, v = repeat_kv(k, nh // n_kv), repeat_kv(v, nh // n_kv)  # [R, Tk, nh, hd]
    scores = torch.matmul(q.transpose(1, 2), k.permute(0, 2, 3, 1)) * scale  # [R, nh, Tq, Tk]
    scores = scores.masked_fill(~mask.unsqueeze(-3), torch.finfo(scores.dtype).min)
    probs = torch.softmax(scores, dim=-1, dtype=compute_dtype(scores.dtype)).to(q.dtype)  # [R, nh, Tq, Tk]
    return torch.matmul(probs, v.transpose(1, 2)).transpose(1, 2)  # [R, Tq, nh, hd]


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
        q = self.q_proj(x).unflatten(-1, (self.n_heads, self.head_dim))  # [R, T, nh, hd]
        if self.q_norm is not None:
            q = self.q_norm(q)
        return apply_rotary(q, cos, sin)

    def project_kv(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x [R, T, H] -> rotated keys, values [R, T, n_kv, hd] (what a KV cache stores)."""
        k = self.k_proj(x).unflatten(-1, (self.n_kv_heads, self.head_dim))  # [R, T, n_kv, hd]
        if self.k_norm is not None:
            k = self.k_norm(k)
        v = self.v_proj(x).unflatten(-1, (self.n_kv_heads, self.head_dim))  # [R, T, n_kv, hd]
        return apply_rotary(k, cos, sin), v

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        past_k: torch.Tensor,
        past_v: torch.Tensor,
        mask: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Attend the T new rows to [past ; new] keys under `mask` [R, T, P + T].

        Returns (output [R, T, H], new keys, new values [R, T, n_kv, hd]).
        """
        q = self.project_q(x, cos, sin)  # [R, T, nh, hd]
        k, v = self.project_kv(x, cos, sin)  # [R, T, n_kv, hd]
        keys = torch.cat((past_k, k), dim=1)  # [R, P + T, n_kv, hd]
        values = torch.cat((past_v, v), dim=1)  # [R, P + T, n_kv, hd]
        out = attend(q, keys, values, mask, self.scale)  # [R, T, nh, hd]
        return self.o_proj(out.flatten(-2)), k, v
