"""Compare a backend's output with the float64 reference: shape, then dtype, then values.

Floats within the owner's tolerance (``tolerances``), integers and flags exactly. A failure says
which level, op, dtype and sample (with its seed and input shapes) and lists the worst indices.
Every comparison is recorded (max abs / rel error against its tolerance) for the reports.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .tolerances import Tol, tolerance


class ConformanceFailure(AssertionError):
    """A backend result that differs from the reference beyond what the suite allows."""


@dataclass
class Context:
    """Where a comparison happens; printed at the head of every failure message."""

    level: str
    op: str
    dtype: str
    sample: str
    seed: int | None = None
    shapes: dict[str, str] = field(default_factory=dict)

    def head(self) -> str:
        seed = "" if self.seed is None else f" seed={self.seed}"
        shapes = ", ".join(f"{k} {v}" for k, v in self.shapes.items())
        return (f"[{self.level} {self.op} case={self.sample} dtype={self.dtype}{seed}]"
                + (f" inputs: {shapes}" if shapes else ""))


def _np(x) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().cpu()
        x = x.double() if x.is_floating_point() else x
        return x.numpy()
    return np.asarray(x)


def _worst(mask_bad: np.ndarray, err: np.ndarray, got, want, n: int = 5) -> str:
    idx = np.argwhere(mask_bad)
    order = np.argsort(-err[mask_bad], kind="stable")[:n]
    return "; ".join(f"{tuple(int(i) for i in idx[o])}: got {got[tuple(idx[o])]!r}, "
                     f"want {want[tuple(idx[o])]!r}" for o in order)


def check(ctx: Context, name: str, got, want, *, kind: str = "float", tol: Tol | None = None,
          dtype=None, rows: np.ndarray | None = None, recorder=None) -> None:
    """kind: "float" (tolerance), "exact" (integers / flags / bit-exact floats).
    ``dtype`` (a torch dtype) is the dtype ``got`` must have; ``rows`` masks the leading axis."""
    if dtype is not None and getattr(got, "dtype", dtype) != dtype:
        raise ConformanceFailure(f"{ctx.head()}\n  {name}: dtype {got.dtype}, expected {dtype}")
    g, w = _np(got), np.asarray(want)
    if g.shape != w.shape:
        raise ConformanceFailure(f"{ctx.head()}\n  {name}: shape {g.shape}, expected {w.shape}")
    if rows is not None:
        g, w = g[rows], w[rows]
    op = f"{ctx.op}.{name}"
    if kind == "exact":
        bad = g != w
        if recorder is not None:
            recorder.record_exact(ctx, op, int(bad.sum()), int(g.size))
        if bad.any():
            raise ConformanceFailure(
                f"{ctx.head()}\n  {name}: {int(bad.sum())} of {g.size} entries differ (exact "
                f"comparison); worst: {_worst(bad, bad.astype(float), g, w)}")
        return
    tol = tol or tolerance(op, ctx.dtype)
    g64, w64 = g.astype(np.float64), w.astype(np.float64)
    same_nonfinite = (~np.isfinite(w64)) & (g64 == w64)
    with np.errstate(invalid="ignore"):
        err = np.where(same_nonfinite, 0.0, np.abs(g64 - w64))
    err = np.where(np.isnan(err), np.inf, err)
    big = np.isfinite(w64) & (np.abs(w64) > tol.atol)          # relative error where meaningful
    rel = np.where(big, err / np.where(big, np.abs(w64), 1.0), 0.0)
    bad = err > tol.atol + tol.rtol * np.where(np.isfinite(w64), np.abs(w64), 0)
    if recorder is not None:
        recorder.record_float(ctx, op, float(err.max(initial=0.0)), float(rel.max(initial=0.0)),
                              tol, not bad.any())
    if bad.any():
        raise ConformanceFailure(
            f"{ctx.head()}\n  {name}: {int(bad.sum())} of {g.size} elements outside "
            f"atol={tol.atol:g} rtol={tol.rtol:g} ({tol.reason}); max abs err "
            f"{err.max():.3g}, max rel err {rel.max():.3g}; worst: {_worst(bad, err, g, w)}")
