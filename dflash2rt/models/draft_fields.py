"""The fields every draft layout shares, read the same way by the native reader
(``draft_config.py``) and the speculators one (``speculators_config.py``): the two architecture
names, integer fields that refuse booleans and floats, and attention per draft layer. A
``sliding_attention`` layer sees the last ``sliding_window`` keys (when ``use_sliding_window``,
as transformers resolves Qwen3 configs); a layer is causal within the block when ``is_causal``
says so, or, without ``is_causal``, when it is a sliding layer (the z-lab reference's rule); a
speculators draft's sliding layers are causal unless ``sliding_window_non_causal``;
full-attention layers are non-causal.
"""

from __future__ import annotations

import math
from typing import Any

from dflash2rt.errors import CheckpointError

ARCH_V2, ARCH_V1 = "DFlash2DraftModel", "DFlashDraftModel"
# The sliding-window keys a draft handles itself (not passed on to its Qwen3 decoder config).
SLIDING_KEYS = ("use_sliding_window", "sliding_window", "max_window_layers", "layer_types")


def int_field(d: dict[str, Any], key: str, where: str = "dflash_config.") -> int:
    """``d[key]``, an integer (``where``: the key's place, for the message)."""
    v = d[key]
    if not isinstance(v, int) or isinstance(v, bool):
        raise CheckpointError(f"{where}{key} must be an integer, got {v!r}")
    return v


def layer_ids(value: Any) -> tuple[int, ...]:
    """``dflash_config.target_layer_ids``: a list of integers."""
    if not isinstance(value, (list, tuple)):
        raise CheckpointError(f"dflash_config.target_layer_ids must be a list of layer "
                              f"indices, got {value!r}")
    return tuple(int_field({"target_layer_ids": i}, "target_layer_ids") for i in value)


def int_or(d: dict[str, Any], key: str, default: int, where: str = "dflash_config.") -> int:
    """``d[key]`` as an integer (``default`` when absent)."""
    return int_field({key: d.get(key, default)}, key, where)


def float_or(d: dict[str, Any], key: str, default: float | None,
             where: str = "dflash_config.") -> float | None:
    """``d[key]`` as a finite number (``default`` when absent; None only where the default is
    None)."""
    v = d.get(key, default)
    if v is None and default is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise CheckpointError(f"{where}{key} must be a finite number, got {v!r}")
    return float(v)


def layer_types(d: dict[str, Any], layers: int) -> list[str]:
    """``layer_types`` as written, else as transformers' Qwen3Config derives it (sliding from
    ``max_window_layers`` on when ``use_sliding_window`` and a ``sliding_window`` that is not
    null)."""
    types = d.get("layer_types")
    if types is None:
        start = d.get("max_window_layers", 28)
        if not isinstance(start, int) or isinstance(start, bool) or start < 0:
            raise CheckpointError(f"max_window_layers must be an integer >= 0, got {start!r}")
        slide = bool(d.get("use_sliding_window", False)) \
            and d.get("sliding_window", 4096) is not None
        types = ["sliding_attention" if slide and i >= start else "full_attention"
                 for i in range(layers)]
    if not isinstance(types, list) or len(types) != layers or any(
            t not in ("sliding_attention", "full_attention") for t in types):
        raise CheckpointError(f"layer_types must list {layers} of sliding_attention/full_attention")
    return types


def layer_windows(d: dict[str, Any], layers: int) -> tuple[int | None, ...]:
    """Each layer's sliding window (None: full attention)."""
    types = layer_types(d, layers)
    window = d.get("sliding_window", 4096)
    if not d.get("use_sliding_window", False) or window is None:   # transformers: no window
        return (None,) * layers
    if not isinstance(window, int) or isinstance(window, bool) or window < 1:
        raise CheckpointError(f"sliding_window must be a positive integer, got {window!r}")
    return tuple(window if t == "sliding_attention" else None for t in types)


def layer_causal(d: dict[str, Any], layers: int) -> tuple[bool, ...]:
    """The z-lab reference: ``is_causal`` for every layer when given, else causal exactly on the
    sliding-attention layers."""
    if d.get("is_causal") is not None:
        return (bool(d["is_causal"]),) * layers
    return tuple(t == "sliding_attention" for t in layer_types(d, layers))
