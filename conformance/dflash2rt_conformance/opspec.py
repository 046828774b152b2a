"""The OpSpec / ErrorInput dataclasses (PyTorch OpInfo style) the op specs are written in.

Every field is a keyword (``kw_only``): a spec reads as a table of named fields, e.g.
``OpSpec(name="noise", kind="backend", dtypes=("float32",), samples=noise_samples, ...)``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from dflash2rt.ops.batch import SamplingBatch

ALL_DTYPES = ("float32", "float64", "bfloat16")


@dataclass(frozen=True, kw_only=True)
class ErrorInput:
    """A call (built for a device) that must raise ``error`` with a message matching ``match``."""

    name: str
    build: Callable[[torch.device], Callable[[object], object]]
    error: type
    match: str


@dataclass(frozen=True, kw_only=True)
class OpSpec:
    """One op under test.

    - ``kind``: "backend" (a Backend method) or "device" (a dflash2rt.ops function run on the
      backend's device); ``dtypes``: the test dtypes where meaningful;
    - ``samples()`` → [Sample] (tier "small" or "exhaustive");
    - ``make_inputs(sample, dtype)`` → {name: Arg} (``harness.Arg``);
    - ``reference(float64 inputs)`` → {output: ndarray, "_rows": mask, optionally
      "_rows_<output>": that output's own mask};
    - ``call(backend, torch inputs)`` → {output: tensor};
    - ``outputs``: {name: (kind, dtype)}, kind "float" (tolerances) or "exact", dtype a torch
      dtype, "x" (the test dtype) or None;
    - ``row_masked``: outputs compared only on rows the reference keeps (e.g. not NaN-flagged);
    - ``errors()`` → [ErrorInput] that must raise.

    A spec of error inputs only leaves ``samples`` … ``outputs`` out."""

    name: str
    kind: str
    dtypes: tuple[str, ...]
    samples: Callable[[], list] = list
    make_inputs: Callable | None = None
    reference: Callable[[dict], dict] | None = None
    call: Callable[[object, dict], dict] | None = None
    outputs: dict = field(default_factory=dict)
    row_masked: frozenset = frozenset()
    errors: Callable[[], list] = list
    doc: str = ""


def sampling_batch(inputs: dict, device) -> SamplingBatch:
    """The SamplingBatch of a spec's "temps" / "top_k" / "top_p" inputs (filters off if absent)."""
    r = len(inputs["temps"])
    return SamplingBatch.build(inputs["temps"], inputs.get("top_k") or [0] * r,
                               inputs.get("top_p") or [1.0] * r, device)
