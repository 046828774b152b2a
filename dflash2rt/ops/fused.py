"""The models' fusable ops: RMSNorm and the attention prologue (q / k norm, rope, the K/V cache
write). Their reference formulas, and the implementation a decode runs them with: a backend
with kernels for them (``Backend.fuses_model_ops``) sets itself for the decode
(``Backend.run_context`` → ``using``); elsewhere the models run the references below."""

from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Iterator

import torch
import torch.nn.functional as F

from .attention import write_rows

_IMPL: contextvars.ContextVar[Any] = contextvars.ContextVar("dflash2rt_model_ops", default=None)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for half types and float32, float64 for float64 (HF upcasts norms and softmax the same way)."""
    return torch.promote_types(dtype, torch.float32)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., H] / rms(x) * weight [H], computed in ``compute_dtype`` and cast back before the
    weight (Hugging Face's order for half types)."""
    cdt = compute_dtype(x.dtype)
    if cdt == x.dtype == weight.dtype:          # one fused op (float32 / float64)
        return F.rms_norm(x, weight.shape, weight, eps)
    h = x.to(cdt)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """[x1, x2] -> [-x2, x1] over the last dimension (the HF convention)."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [R, T, heads, hd] by cos/sin [R, T, hd]."""
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)  # [R, T, 1, hd]
    return (x * cos) + (rotate_half(x) * sin)


def attention_prologue(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       q_norm: tuple[torch.Tensor, float] | None,
                       k_norm: tuple[torch.Tensor, float] | None, cos: torch.Tensor,
                       sin: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor,
                       pos: torch.Tensor) -> torch.Tensor:
    """The projections q [R, T, nh, hd], k, v [R, T, n_kv, hd] → rotated queries; rotated keys
    and the values written into cache_k / cache_v [R, max_len, n_kv, hd] at pos [R, T].
    ``q_norm`` / ``k_norm``: (weight [hd], eps) of the per-head RMSNorm before rope (Qwen3),
    None without. The models' order: norm, rotate, write."""
    rotated = []
    for x, nrm in ((q, q_norm), (k, k_norm)):
        if nrm is not None:
            x = current().rms_norm(x, *nrm)
        rotated.append(apply_rotary(x, cos, sin))
    write_rows(cache_k, rotated[1], pos)
    write_rows(cache_v, v, pos)
    return rotated[0]


class _Reference:
    """The references, as the implementation outside a decode with kernels."""

    rms_norm = staticmethod(rms_norm)
    attention_prologue = staticmethod(attention_prologue)


REFERENCE = _Reference()


def current() -> Any:
    """What runs the models' fusable ops now: the decode's backend (``using``), else the
    references (an object with ``rms_norm`` and ``attention_prologue``)."""
    return _IMPL.get() or REFERENCE


@contextlib.contextmanager
def using(impl: Any) -> Iterator[None]:
    """The models' fusable ops run ``impl``'s inside (a backend with kernels for them)."""
    token = _IMPL.set(impl)
    try:
        yield
    finally:
        _IMPL.reset(token)
