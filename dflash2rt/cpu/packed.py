"""The CPU backend's model pass: float32 linear layers run on oneDNN with weights packed once.

Why: a decode step is a handful of rows through every weight matrix. torch's default CPU
``F.linear`` (MKL sgemm) re-packs the weight on every call for small row counts, so a verify
pass (9 rows) through a large LM head runs several times slower than through a weight packed
once (docs/benchmarks/real-scale.md). oneDNN's packed format is what ``torch.compile``'s CPU
freezing pass uses (``torch.ops.mkldnn._reorder_linear_weight`` / ``_linear_pointwise``).

The pass keeps every module's dense weight (training, ``state_dict``, other devices and the
tied embedding's lookup still read it) and adds a packed copy next to it: the run stats say
how many layers and bytes (``RunStats.model_pass``). A packed layer checks on each call that
its weight is still the one it packed (same storage, same version): an updated weight is
packed again, and calls that need autograd run plain ``F.linear``. Where this torch build has
no oneDNN (or the models are not float32 on the CPU) the pass says so and changes nothing.

One row (a batch-1 target-only step) runs the dense weight through ``F.linear``: MKL's
matrix-vector product reads it faster than oneDNN's packed one, while from 2 rows on packing
pays.
"""

from __future__ import annotations

import os
import types

import torch
import torch.nn.functional as F
from torch import nn

from ..models.memory import GB, available_bytes

PACK_ATTR = "_dflash2rt_onednn"
ENV = "DFLASH2RT_CPU_PACK"      # "0": leave the linears to F.linear (A/B runs, a suspect build)
HEADROOM = 0.5          # pack only when the copies take at most this share of the free memory
# Only weights of at least this many elements (4 MiB in float32) are packed: below it oneDNN's
# per-call cost outweighs the bandwidth it saves (the bundled pair's hidden-192 layers decode
# slower packed; Qwen3-0.6B's smallest projection, 1024 x 1024, gains).
MIN_ELEMENTS = 1 << 20


def unavailable() -> str | None:
    """Why linears are not packed here (``DFLASH2RT_CPU_PACK=0``, or this torch cannot), or
    None when they are."""
    if os.environ.get(ENV, "1") == "0":
        return f"{ENV}=0"
    if not torch.backends.mkldnn.is_available():
        return "this torch build has no oneDNN (mkldnn)"
    for op in ("_reorder_linear_weight", "_linear_pointwise"):
        if not hasattr(torch.ops.mkldnn, op):
            return f"torch.ops.mkldnn.{op} is missing in torch {torch.__version__}"
    return None


def _key(w: torch.Tensor) -> tuple[int, int]:
    return w.data_ptr(), w._version


def _packed(w: torch.Tensor) -> list:
    """[packed copy of w, the key it was packed at]: a layer's (or a stack's) packing slot."""
    w = w.detach()
    return [torch.ops.mkldnn._reorder_linear_weight(w, None), _key(w)]


def _product(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, slot: list
             ) -> torch.Tensor:
    """x through w: one row through the dense weight (see top), more through the packed copy
    in ``slot`` (packed again first when w was updated in place or replaced since)."""
    if x.numel() == x.shape[-1]:
        return F.linear(x, w, bias)
    if slot[1] != _key(w):
        slot[:] = _packed(w)
    bias = None if bias is None else bias.detach()
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), slot[0], bias, "none", [], "")


def _forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    if x.dtype != self.weight.dtype \
            or (torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad)):
        return F.linear(x, self.weight, self.bias)          # a dtype error, or autograd
    return _product(x, self.weight, self.bias, getattr(self, PACK_ATTR))


def _packable(m: nn.Module) -> bool:
    return (type(m) is nn.Linear and m.weight.dtype == torch.float32
            and m.weight.device.type == "cpu" and m.weight.numel() >= max(MIN_ELEMENTS, 1))


def pack_linears(modules: list[nn.Module]) -> str:
    """Pack every float32 CPU ``nn.Linear`` of ``modules`` (once per layer) and give the half
    precision ones 2-D inputs (``flatten_half_linears``) → what it did."""
    flat = flatten_half_linears(modules)
    return _pack(modules) + (f"; {flat} half-precision linears take 2-D inputs" if flat else "")


# Half-precision linears on the CPU: torch's CPU matmul (2.13) serves a 3-D bfloat16 / float16
# input that is a strided slice (a draft block's rows h[:, 1:], the last row of each request
# h[:, -1:]) by expanding the weight over the batch and copying it on every call, which costs
# far more than the product itself for a large weight (float16 alike; float32 and float64 are
# barely affected). So those linears get 2-D inputs (docs/benchmarks/real-scale.md).
FLAT_ATTR = "_dflash2rt_flat"


def _flat_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    if x.dim() <= 2:
        return F.linear(x, self.weight, self.bias)
    return F.linear(x.flatten(0, -2), self.weight, self.bias).view(  # reshape(-1, 0) raises
        *x.shape[:-1], self.weight.shape[0])


def flatten_half_linears(modules: list[nn.Module]) -> int:
    """Every bfloat16 / float16 CPU ``nn.Linear`` of ``modules`` takes its input as 2-D (rows
    × features; reshaped, then the output viewed back) → how many layers do."""
    n = 0
    for m in (m for model in modules for m in model.modules()):
        if type(m) is nn.Linear and m.weight.device.type == "cpu" \
                and m.weight.dtype in (torch.bfloat16, torch.float16):
            if not hasattr(m, FLAT_ATTR):
                setattr(m, FLAT_ATTR, True)
                m.forward = types.MethodType(_flat_forward, m)
            n += 1
    return n


def _pack(modules: list[nn.Module]) -> str:
    why = unavailable()
    if why is not None:
        return f"linears: torch F.linear ({why})"
    layers = [m for model in modules for m in model.modules() if _packable(m)]
    if not layers:
        return (f"linears: torch F.linear (no float32 CPU linear layer of {MIN_ELEMENTS} or "
                "more weights to pack)")
    nbytes = sum(m.weight.numel() * m.weight.element_size() for m in layers)
    todo = sum(m.weight.numel() * m.weight.element_size() for m in layers
               if not hasattr(m, PACK_ATTR))
    free = available_bytes(torch.device("cpu"))
    if free is not None and todo > HEADROOM * free:
        return (f"linears: torch F.linear (packing them would take {todo / GB:.2f} GB more; "
                f"{free / GB:.2f} GB are available)")
    fused = sum(_fuse(m) for model in modules for m in model.modules())
    for m in layers:
        if not hasattr(m, PACK_ATTR):
            # a stacked layer is packed on its own only if it is called on its own
            setattr(m, PACK_ATTR, [None, None] if getattr(m, PART_ATTR, False)
                    else _packed(m.weight))
            m.forward = types.MethodType(_forward, m)
    return (f"linears: oneDNN packed ({len(layers)} layers, {nbytes / 2**20:.0f} MiB of packed "
            f"weights beside the dense ones; {fused} q/k/v and gate/up groups in one product "
            "each)")


# Fused projections: the q, k, v projections of an attention layer and the gate and up
# projections of an MLP read the same input, so one product over their stacked weights does the
# work of three (two). The stacked weight is the storage and each layer's weight a view of it
# (no copy kept; state_dict, training and the single-layer calls still see the same weights).
FUSE_ATTR = "_dflash2rt_fused"
PART_ATTR = "_dflash2rt_fused_part"     # a layer whose weight is a view of a stacked weight


def _fuse(m: nn.Module) -> bool:
    """Stack ``m``'s projections (an Attention's q/k/v, a SwiGLU's gate/up) when all are
    packable and bias-free; → whether it did (or had)."""
    from ..models.layers import Attention, SwiGLU

    if hasattr(m, FUSE_ATTR):
        return True
    if type(m) is Attention:
        parts, method = (m.q_proj, m.k_proj, m.v_proj), "project_qkv"
    elif type(m) is SwiGLU:
        parts, method = (m.gate_proj, m.up_proj), "gate_up"
    else:
        return False
    if not all(_packable(p) and p.bias is None for p in parts):
        return False
    stacked = torch.cat([p.weight.detach() for p in parts])
    start = 0
    for p in parts:
        n = p.weight.shape[0]
        p.weight.data = stacked[start:start + n]          # a view of the stacked storage
        setattr(p, PART_ATTR, True)
        start += n
    # the parts' weights keep their own version counters (``.data`` set): the stack's slot
    # records theirs too, so an in-place update through a part is packed again
    setattr(m, FUSE_ATTR, (stacked, [*_packed(stacked), _versions(parts)],
                           [p.weight.shape[0] for p in parts]))
    setattr(m, method, types.MethodType(_project_qkv if method == "project_qkv" else _gate_up, m))
    return True


def _stacked(m: nn.Module, parts: tuple[nn.Linear, ...], x: torch.Tensor
             ) -> tuple[torch.Tensor, ...] | None:
    """The parts' outputs for x from one product over the stacked weight, or None when the
    fused path does not apply (autograd, another dtype, a weight replaced since stacking)."""
    stacked, slot, sizes = getattr(m, FUSE_ATTR)
    if (torch.is_grad_enabled() and (x.requires_grad or any(p.weight.requires_grad
                                                            for p in parts))) \
            or x.dtype != stacked.dtype \
            or any(p.weight.untyped_storage().data_ptr() != stacked.untyped_storage().data_ptr()
                   for p in parts):
        return None
    if x.numel() != x.shape[-1] and slot[2:] != [_versions(parts)]:    # one row: dense
        slot[:] = [*_packed(stacked), _versions(parts)]
    return _product(x, stacked, None, slot).split(sizes, dim=-1)


def _versions(parts: tuple[nn.Linear, ...]) -> list[int]:
    return [p.weight._version for p in parts]


def _project_qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    out = _stacked(self, (self.q_proj, self.k_proj, self.v_proj), x)
    if out is None:
        return type(self).project_qkv(self, x, cos, sin)
    q, k, v = out
    return (self.queries(q, cos, sin), *self.keys_values(k, v, cos, sin))


def _gate_up(self, x: torch.Tensor):
    out = _stacked(self, (self.gate_proj, self.up_proj), x)
    return type(self).gate_up(self, x) if out is None else out
