"""Run one op spec on one sample: build inputs, round them to the test dtype, call the backend
and the reference on the same values, and compare every output."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .compare import Context, check

DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16}
_FIXED = {"f32": torch.float32, "f64": torch.float64, "i64": torch.int64, "bool": torch.bool}


@dataclass(frozen=True)
class Arg:
    """One input of an op: ``kind`` "x" (a tensor in the dtype under test), a fixed tensor dtype
    ("f32", "f64", "i64", "bool") or "obj" (a Python object passed as is to both sides)."""

    value: Any
    kind: str = "x"


def materialize(inputs: dict[str, Arg], dtype: str, device) -> tuple[dict, dict]:
    """→ (torch inputs on ``device``, reference inputs: the same values as float64 NumPy)."""
    t_in, r_in = {}, {}
    for name, x in inputs.items():
        if x.kind == "obj":
            t_in[name] = r_in[name] = x.value
            continue
        tdt = DTYPES[dtype] if x.kind == "x" else _FIXED[x.kind]
        t = torch.as_tensor(np.asarray(x.value), dtype=torch.float64 if tdt.is_floating_point
                            else None).to(tdt)                  # rounding happens here, once
        r = t.double().numpy() if tdt.is_floating_point else t.numpy()
        t_in[name], r_in[name] = t.to(device), r
    return t_in, r_in


def shapes(inputs: dict[str, Arg], dtype: str) -> dict[str, str]:
    out = {}
    for k, x in inputs.items():
        if x.kind != "obj":
            kind = dtype if x.kind == "x" else x.kind
            out[k] = f"{list(np.shape(x.value))} {kind}"
    return out


def run_sample(spec, sample, dtype: str, backend, recorder, level: str = "L1") -> None:
    """Compare every output of ``spec`` on ``sample`` (raises ConformanceFailure)."""
    inputs = spec.make_inputs(sample, dtype)
    t_in, r_in = materialize(inputs, dtype, backend.device)
    want = spec.reference(r_in)
    with backend.run_context():       # as inside a decode (e.g. float32 path without fp64)
        got = spec.call(backend, t_in)
    ctx = Context(level, spec.name, dtype, sample.name, sample.seed, shapes(inputs, dtype))
    for name, (kind, out_dtype) in spec.outputs.items():
        out_dtype = DTYPES[dtype] if out_dtype == "x" else out_dtype
        rows = want.get(f"_rows_{name}", want.get("_rows"))       # a per-output mask wins
        check(ctx, name, got[name], want[name], kind=kind, dtype=out_dtype,
              rows=rows if name in spec.row_masked else None, recorder=recorder)
    record_large_vocab(recorder, level, spec.name, dtype, sample.name, inputs)


LARGE_VOCAB = 100_000


def record_large_vocab(recorder, level: str, op: str, dtype: str, sample: str,
                       inputs: dict[str, Arg]) -> None:
    """A sample over a real vocabulary size (last axis ≥ LARGE_VOCAB) that ran and matched the
    reference: listed per V as a level metric, so the reports show which large-vocabulary
    cases actually executed (a skipped or failed one is never listed)."""
    v = max((np.shape(x.value)[-1] for x in inputs.values()
             if x.kind != "obj" and np.ndim(x.value) > 0), default=0)
    if v < LARGE_VOCAB or not hasattr(recorder, "metrics"):
        return
    metrics = recorder.metrics.setdefault(level, {})
    key = f"large vocabulary V={v} ran and matched"
    ran = [s for s in metrics.get(key, "").split("; ") if s] + [f"{op} {dtype} {sample}"]
    metrics[key] = "; ".join(ran)
