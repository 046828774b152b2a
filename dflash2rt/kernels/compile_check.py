"""Compile every Triton kernel, as the real wrappers launch it, for GPU targets, without a GPU.

The interpreter (TRITON_INTERPRET=1) runs the kernels' logic but never type-checks them: a
loop-carried value that changes dtype, for one, runs there and fails to compile on a device.
Triton lowers a kernel to a cubin (NVIDIA) or an hsaco (AMD) with no device present, so this
closes that gap. The targets and their tuning are the installed plugins' vendor facts
(``TritonFacts.compile_targets``, asked through the hook ``dflash2rt_gpu_vendors``; Intel declares
none: its targets need pytorch-triton-xpu, which the PyPI triton does not include)::

    TRITON_INTERPRET=0 python -m dflash2rt.kernels.compile_check [--target sm90 ...]

Each case is one of ``kernels.smoke.cases`` run through ``KernelBackend`` (the real wrappers) on
CPU tensors with the kernel swapped for a recorder, so the compiled signature is exactly what
the wrapper launches; the cases a device without float64 launches are compiled again as that
backend launches them ("-nofp64"). Two properties are read off each kernel's Triton IR:
``f64``, the float64 operations in it (none may remain in a "-nofp64" case), and
``narrow_index``, 32-bit multiplies of a value derived from a program id (an offset that
wraps once an index passes 2^31 elements: every kernel widens its program ids first).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from typing import Any, Callable

import torch

from .smoke import DTYPES, cases
from .tuning import Tuning, interpreting

_PTR = {torch.float32: "*fp32", torch.float16: "*fp16", torch.bfloat16: "*bf16",
        torch.float64: "*fp64", torch.int64: "*i64", torch.int32: "*i32", torch.int8: "*i8",
        torch.bool: "*i1"}
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


def vendors() -> tuple[list[Any], list[str]]:
    """The GPU vendor facts the installed plugins declare (hook ``dflash2rt_gpu_vendors`` of each
    entry point of ``dflash2rt.backends``, loaded one at a time), and why any could not be read.
    Core names no plugin: the entry points say which are installed."""
    from importlib import metadata

    found, problems = [], []
    # hookspecs.ENTRY_POINT_GROUP (spelled out: kernels sit in hookspecs' layer, not above it)
    for ep in sorted(metadata.entry_points(group="dflash2rt.backends"), key=lambda e: e.name):
        try:
            hook = getattr(ep.load(), "dflash2rt_gpu_vendors", None)
            found += list(hook()) if hook is not None else []
        except Exception as exc:  # noqa: BLE001 - reported, the other plugins still compile
            problems.append(f"plugin {ep.name}: {type(exc).__name__}: {exc}")
    return found, problems


def targets() -> dict[str, tuple[str, int | str, int, Tuning, str]]:
    """target → (triton backend, arch, warp size, the vendor's tuning for it, the vendor)."""
    out = {}
    for v in vendors()[0]:
        for name, (arch, warp) in v.triton.compile_targets.items():
            out[name] = (v.triton.backend, arch, warp, v.triton.tuning_for(warp), v.name)
    return out


_SSA = re.compile(r"%[\w#]+")
_OP = re.compile(r"^\s*(%[\w#]+(?:\s*,\s*%[\w#]+)*)\s*=\s*([\w.]+)(.*)$")


def f64_ops(ttir: str) -> list[str]:
    """The lines of Triton IR that compute in, or convert to or from, float64."""
    return [line.strip() for line in ttir.splitlines() if "f64" in line and "loc(" in line
            and not line.lstrip().startswith(("tt.func", "#", "}"))]


# Operations an index flows through (integer arithmetic, shape ops); a value chosen by a
# comparison, loaded, reduced or carried by a loop is data, not an index derived from the grid.
_INDEX_OPS = {"arith.addi", "arith.subi", "arith.muli", "arith.divsi", "arith.remsi",
              "arith.extsi", "arith.extui", "arith.trunci", "arith.maxsi", "arith.minsi",
              "tt.splat", "tt.broadcast", "tt.expand_dims", "tt.reshape"}


def narrow_index(ttir: str) -> list[str]:
    """Lines of Triton IR multiplying in 32 bits a value derived from ``tt.get_program_id``
    through integer arithmetic: an index that wraps once it passes 2^31."""
    tainted: set[str] = set()
    out = []
    for line in ttir.splitlines():
        m = _OP.match(line)
        if not m:
            continue
        results, op, rest = _SSA.findall(m.group(1)), m.group(2), m.group(3)
        operands = set(_SSA.findall(rest.split(" loc(")[0]))
        if op == "tt.get_program_id" or (op in _INDEX_OPS and operands & tainted):
            tainted.update(results)
            if op == "arith.muli" and re.search(r":\s*(tensor<[^>]*x)?i32\b", rest):
                out.append(line.strip().split(" loc(")[0])
    return out


def _cases(tuning: Tuning) -> dict[str, tuple[Any, str, Callable[[], Any]]]:
    from . import attention, conv, selector, verify
    from .backend import KernelBackend

    kernel = {"conv_prepare": (conv, "_conv_kernel"), "conv_finish": (conv, "_conv_kernel"),
              "select": (selector, "_walk_kernel"), "verify": (verify, "_verify_kernel"),
              "select_marked": (selector, "_walk_kernel"),
              "verify_marked": (verify, "_verify_kernel"),
              "attention": (attention, "_attention_kernel")}
    out = {}
    for d, dt in DTYPES.items():
        for fp64 in (True, False):
            be = KernelBackend("compile-check", "cpu", (dt,), tuning, has_fp64=fp64)
            for case, (method, make) in cases(dt).items():
                if not fp64 and (method.endswith("_marked") or not case.startswith(
                        ("select", "verify"))):
                    continue         # the same kernels as with float64 (the marked refuse)
                module, name = kernel[method]
                call = lambda b=be, m=method, a=make(): getattr(b, m)(*a)   # noqa: E731
                out[f"{case}-{d}" + ("" if fp64 else "-nofp64")] = (module, name, call)
    return out


def compile_all(chosen: dict[str, tuple[str, int | str, int, Tuning, str]]
                ) -> list[dict[str, Any]]:
    """One row per (case, target): ok, seconds, and the error where compilation failed."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    rows = []
    for t, (backend, arch, warp, tuning, vendor) in chosen.items():
        for case, (module, name, call) in _cases(tuning).items():
            fn, args, kw = _record(module, name, call)
            sig, consts = _signature(fn, args, kw)
            start = time.perf_counter()
            row = {"case": case, "kernel": name, "target": t, "tuning": f"{vendor} warp {warp}"}
            try:
                options = {k: v for k, v in kw.items() if k in ("num_warps", "enable_fp_fusion")}
                out = triton.compile(ASTSource(fn, sig, consts),
                                     target=GPUTarget(backend, arch, warp),
                                     options={"num_warps": 4, **options})
                ok = bool(out.asm.get(BINARY[backend]))
                row.update(ok=ok, error="" if ok else f"no {BINARY[backend]} produced",
                           f64=len(f64_ops(out.asm["ttir"])),
                           narrow_index=narrow_index(out.asm["ttir"]))
            except Exception as exc:  # noqa: BLE001 - each failure is one reported row
                row.update(ok=False, error=f"{type(exc).__name__}: {exc}"[-1500:])
            row["seconds"] = round(time.perf_counter() - start, 2)
            rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    known = targets()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", action="append", choices=list(known),
                    help="GPU target(s) to compile for (default: all)")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = ap.parse_args(argv)
    if interpreting():
        print("compile_check needs TRITON_INTERPRET=0 (the interpreter replaces the compiler)",
              file=sys.stderr)
        return 2
    if not known:
        why = "; ".join(vendors()[1]) or "install dflash2rt-cuda or dflash2rt-rocm"
        print(f"no installed plugin declares compile targets (dflash2rt_gpu_vendors): {why}",
              file=sys.stderr)
        return 2
    rows = compile_all({t: known[t] for t in args.target or known})
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        for r in rows:
            print(f"{'ok  ' if r['ok'] else 'FAIL'} {r['case']:30s} {r['target']:6s} "
                  f"{r['seconds']:6.2f}s {r['tuning']} f64 ops {r.get('f64', '-')}, narrow "
                  f"index {len(r.get('narrow_index', []))} {r['error'][:300]}")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
