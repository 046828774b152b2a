"""The OpSpec / ErrorInput dataclasses (PyTorch OpInfo style) the op specs are written in."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

ALL = ("float32", "float64", "bfloat16")


@dataclass(frozen=True)
class ErrorInput:
    """A call (built for a device) that must raise ``error`` with a message matching ``match``."""

    name: str
    build: Callable[[torch.device], Callable[[object], object]]
    error: type
    match: str


@dataclass(frozen=True)
class OpSpec:
    """name; kind "backend" (a Backend method) or "device" (a dflash2rt.ops function on the
    backend's device); dtypes where meaningful; samples() → [Sample] (tier small/exhaustive);
    make(sample, dtype) → {name: In}; reference(float64 inputs) → {output: ndarray, "_rows":
    mask, optionally "_rows_<output>": that output's own mask}; call(backend, torch inputs) → {output: tensor}; outputs {name: (kind, dtype)} with
    kind "float" (tolerances) or "exact" and dtype a torch dtype, "x" (the test dtype) or None;
    row_masked: outputs compared only on rows the reference keeps (e.g. not NaN-flagged)."""

    name: str
    kind: str
    dtypes: tuple[str, ...]
    samples: Callable[[], list]
    make: Callable
    reference: Callable[[dict], dict]
    call: Callable[[object, dict], dict]
    outputs: dict
    row_masked: frozenset = frozenset()
    errors: Callable[[], list] = list
    doc: str = ""
