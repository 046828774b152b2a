"""Compile every Triton kernel, as the real wrappers launch it, for GPU targets, without a GPU.

The interpreter (TRITON_INTERPRET=1) runs the kernels' logic but never type-checks them: a
loop-carried value that changes dtype, for one, runs there and fails to compile on a device.
Triton lowers a kernel to a cubin (NVIDIA) or an hsaco (AMD) with no device present, so this
closes that gap, with each vendor plugin's tuning table where that plugin is installed (Intel
targets need pytorch-triton-xpu, which the PyPI triton does not include)::

    TRITON_INTERPRET=0 python -m dflash2rt.kernels.compile_check [--target sm90 ...]

Each case runs the real wrapper (kernels.conv / selector / verify) on small CPU tensors with the
kernel swapped for a recorder, so the compiled signature is exactly what the wrapper launches.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, Callable

import torch

_PTR = {torch.float32: "*fp32", torch.float16: "*fp16", torch.bfloat16: "*bf16",
        torch.float64: "*fp64", torch.int64: "*i64", torch.int32: "*i32", torch.int8: "*i8",
        torch.bool: "*i1"}
# target → (triton backend, arch, warp size, the plugin whose tuning table it compiles with)
TARGETS = {"sm90": ("cuda", 90, 32, "dflash2rt_cuda"), "sm80": ("cuda", 80, 32, "dflash2rt_cuda"),
           "gfx942": ("hip", "gfx942", 64, "dflash2rt_rocm"),
           "gfx90a": ("hip", "gfx90a", 64, "dflash2rt_rocm")}
BINARY = {"cuda": "cubin", "hip": "hsaco"}


class _Launched(Exception):
    """Raised by the recorder instead of launching (the wrapper's outputs stay unwritten)."""


class _Recorder:
    """Stands in for a JITFunction: ``kernel[grid](*args, **kw)`` records the launch."""

    def __init__(self) -> None:
        self.launch: tuple[tuple, dict] | None = None

    def __getitem__(self, grid):
        def launch(*args, **kw):
            self.launch = (args, kw)
            raise _Launched
        return launch


def _signature(fn, args, kw) -> tuple[dict[str, str], dict[str, Any]]:
    sig, consts = {}, {}
    for name, a in zip(fn.arg_names, args):
        if isinstance(a, torch.Tensor):
            sig[name] = _PTR[a.dtype]
        elif isinstance(a, bool):
            sig[name] = "i1"
        elif isinstance(a, int):
            sig[name] = "i32" if -2**31 <= a < 2**31 else "i64"
        else:
            sig[name] = "fp32"
    for name in fn.arg_names[len(args):]:
        sig[name], consts[name] = "constexpr", kw[name]
    return sig, consts


def _record(module, name: str, call: Callable[[], Any]) -> tuple[Any, tuple, dict]:
    fn, rec = getattr(module, name), _Recorder()
    setattr(module, name, rec)
    try:
        call()
    except _Launched:
        pass
    finally:
        setattr(module, name, fn)
    if rec.launch is None:
        raise RuntimeError(f"{module.__name__}.{name} was not launched")
    return fn, *rec.launch


def _tuning(plugin: str):
    """(the plugin's Tuning, its name) when the plugin is installed, else the default."""
    import importlib

    from .tuning import DEFAULT

    try:
        return importlib.import_module(f"{plugin}.plugin").TUNING, plugin
    except ImportError:
        return DEFAULT, f"default ({plugin} not installed)"


def _cases(tuning) -> dict[str, tuple[Any, str, Callable[[], Any]]]:
    from ..ops.batch import BlockNoise, SamplingBatch
    from ..ops.selector import SelectorParams
    from . import conv, selector, verify

    def conv_call(dtype, finish):
        g = torch.Generator().manual_seed(0)
        x, a = (torch.randn(12, 96, generator=g).to(dtype) for _ in range(2))
        base, delta = torch.randn(3, 96).to(dtype), torch.randn(12, 3, 6).to(dtype)
        return (lambda: conv.conv_finish(x, a, base, delta, 4, tuning)) if finish else \
            (lambda: conv.conv_prepare(x, base, delta, 4, tuning))

    def select_call(dtype, sampled):
        r, gamma, v, rank = 2, 5, 64, 8
        sampling = SamplingBatch.build([1.0 if sampled else 0.0, 0.0], [0, 0], [1.0, 1.0])
        args = (torch.randn(r, gamma, v).to(dtype), torch.randn(r, gamma, rank).to(dtype),
                torch.tensor([1, 2]), torch.randn(v, rank).to(dtype),
                torch.randn(v, rank).to(dtype), SelectorParams(4, 0.5, None), sampling,
                torch.rand(r, gamma))
        return lambda: selector.select(*args, tuning=tuning)

    def verify_call(dtype, sampled):
        r, gamma, v, k = 2, 4, 3001, 4     # V above every block_v: the tuned chunk compiles
        cand = torch.arange(r * gamma * k).view(r, gamma, k) % v
        sampling = SamplingBatch.build([0.8 if sampled else 0.0, 0.0], [0, 0], [1.0, 1.0])
        noise = BlockNoise.draw(torch.tensor([1, 2]), torch.zeros(2, dtype=torch.long),
                                torch.tensor([0, 3]), gamma)
        args = (torch.randn(r, gamma + 1, v).to(dtype), cand[..., 0], cand,
                torch.full((r, gamma, k), 1.0 / k), sampling, noise)
        return lambda: verify.verify(*args, check=False, tuning=tuning)

    dts = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    cases = {}
    for d, dt in dts.items():
        for f in ("prepare", "finish"):
            cases[f"conv-{f}-{d}"] = (conv, "_conv_kernel", conv_call(dt, f == "finish"))
        for m in ("greedy", "sampled"):
            cases[f"select-{m}-{d}"] = (selector, "_walk_kernel", select_call(dt, m == "sampled"))
            cases[f"verify-{m}-{d}"] = (verify, "_verify_kernel", verify_call(dt, m == "sampled"))
    return cases


def compile_all(targets: list[str]) -> list[dict[str, Any]]:
    """One row per (case, target): ok, seconds, and the error where compilation failed."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    rows = []
    for t in targets:
        backend, arch, warp, plugin = TARGETS[t]
        tuning, tuned_by = _tuning(plugin)
        for case, (module, name, call) in _cases(tuning).items():
            fn, args, kw = _record(module, name, call)
            sig, consts = _signature(fn, args, kw)
            start = time.perf_counter()
            row = {"case": case, "kernel": name, "target": t, "tuning": tuned_by}
            try:
                out = triton.compile(ASTSource(fn, sig, consts),
                                     target=GPUTarget(backend, arch, warp),
                                     options={"num_warps": kw.get("num_warps", 4)})
                ok = bool(out.asm.get(BINARY[backend]))
                row.update(ok=ok, error="" if ok else f"no {BINARY[backend]} produced")
            except Exception as exc:  # noqa: BLE001 - each failure is one reported row
                row.update(ok=False, error=f"{type(exc).__name__}: {exc}"[-1500:])
            row["seconds"] = round(time.perf_counter() - start, 2)
            rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", action="append", choices=list(TARGETS),
                    help="GPU target(s) to compile for (default: all)")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = ap.parse_args(argv)
    from ..plugin_kit import interpreting

    if interpreting():
        print("compile_check needs TRITON_INTERPRET=0 (the interpreter replaces the compiler)",
              file=sys.stderr)
        return 2
    rows = compile_all(args.target or list(TARGETS))
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        for r in rows:
            print(f"{'ok  ' if r['ok'] else 'FAIL'} {r['case']:24s} {r['target']:6s} "
                  f"{r['seconds']:6.2f}s {r['tuning']} {r['error'][:300]}")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
