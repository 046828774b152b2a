"""Compile every Triton kernel, as the real wrappers launch it, for GPU targets, without a GPU.

The interpreter (TRITON_INTERPRET=1) runs the kernels' logic but never type-checks them: a
loop-carried value that changes dtype, for one, runs there and fails to compile on a device.
Triton lowers a kernel to a cubin (NVIDIA), an hsaco (AMD) or a SPIR-V module (Intel) with no
device present, so this closes that gap. The targets and their tuning are the installed plugins'
vendor facts (``TritonFacts.compile_targets``, asked through the hook ``dflash2rt_gpu_vendors``).
A target compiles only where the installed Triton has a compiler for its backend: the PyPI
triton has NVIDIA's and AMD's, Intel's targets need Intel's Triton (triton-xpu or
pytorch-triton-xpu, in its own environment: backends/xpu/compile_env.sh); the others are listed
as unavailable, with the reason::

    TRITON_INTERPRET=0 python -m dflash2rt.kernels.compile_check [--target sm90 ...]

Each case is one of ``kernels.smoke.cases`` run through ``KernelBackend`` (the real wrappers) on
CPU tensors with its launch collected instead of run (``kernels.launch.collecting``), so the
compiled signature is exactly what the wrapper launches. A target whose device properties say it
has no float64 (Intel's ``has_fp64``) compiles the cases as a backend without float64 runs them:
a case the wrapper then runs as torch ops (or refuses) launches no kernel and is reported
skipped, and a SPIR-V module that declares the Float64 capability fails (such a device cannot
build it).

On a target with float64 the cases a device without float64 launches are compiled too, as that
backend launches them ("-nofp64"). Two properties are read off each kernel's Triton IR: ``f64``,
the float64 operations in it (none may remain in a case compiled without float64), and
``narrow_index``, 32-bit multiplies of a value derived from a program id (an offset that wraps
once an index passes 2^31 elements: every kernel widens its program ids first).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import struct
import sys
import time
from typing import Any, Callable, Mapping

import torch

from .launch import Pointer, collecting
from .smoke import DTYPES, cases
from .tuning import Tuning, interpreting

_PTR = {torch.float32: "*fp32", torch.float16: "*fp16", torch.bfloat16: "*bf16",
        torch.float64: "*fp64", torch.int64: "*i64", torch.int32: "*i32", torch.int8: "*i8",
        torch.bool: "*i1"}
BINARY = {"cuda": "cubin", "hip": "hsaco", "xpu": "spv"}
_SPIRV_MAGIC, _OP_CAPABILITY, _OP_MEMORY_MODEL, _CAP_FLOAT64 = 0x07230203, 17, 14, 10


def _signature(fn, args, kw) -> tuple[dict[str, str], dict[str, Any]]:
    """Triton's signature of a collected launch (``launch.Launch``: tensors as ``Pointer``s),
    and its constexprs."""
    sig, consts = {}, {}
    for name, a in zip(fn.arg_names, args):
        if isinstance(a, Pointer):
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


def _record(module, name: str, call: Callable[[], Any]) -> tuple[Any, tuple, dict] | str:
    """(kernel, args, kwargs) of ``call``'s launch of ``module.name`` (every launch collected,
    none run: an op may launch several kernels), or why it was not launched."""
    why = "the backend ran the op as torch ops"
    with collecting() as got:
        try:
            call()
        except Exception as exc:  # noqa: BLE001 - the op refused: reported as the reason
            why = f"the op raised {type(exc).__name__}: {exc}"
    want = f"{module.__name__.rsplit('.', 1)[-1]}.{name}"
    ones = [x for x in got.by_key.values() if x.name == want]
    if not ones:
        return f"{module.__name__}.{name} was not launched: {why}"[:1500]
    return ones[0].kernel, ones[0].args, ones[0].kwargs


def has_fp64(arch: Any) -> bool:
    """Whether a target computes in float64: Intel's targets are device-property dicts
    (``has_fp64``, as torch.xpu reports it); NVIDIA's and AMD's all do."""
    return bool(arch.get("has_fp64", True)) if isinstance(arch, Mapping) else True


def spirv_capabilities(spv: bytes) -> set[int]:
    """The capabilities (OpCapability operands) a SPIR-V module declares."""
    words = struct.unpack(f"<{len(spv) // 4}I", spv[:len(spv) // 4 * 4])
    if words and words[0] != _SPIRV_MAGIC:       # big-endian module
        words = struct.unpack(f">{len(spv) // 4}I", spv[:len(spv) // 4 * 4])
    if len(words) < 5 or words[0] != _SPIRV_MAGIC:
        raise ValueError("not a SPIR-V module")
    caps, i = set(), 5                           # after the 5-word header
    while i < len(words):
        count, op = words[i] >> 16, words[i] & 0xFFFF
        if op == _OP_MEMORY_MODEL or count == 0:  # capabilities all come before it
            break
        if op == _OP_CAPABILITY:
            caps.add(words[i + 1])
        i += count
    return caps


def available(backend: str, arch: Any, warp: int) -> str:
    """Why the installed Triton cannot compile for this target; "" when it can."""
    import triton
    from triton.backends import backends
    from triton.backends.compiler import GPUTarget

    target = GPUTarget(backend, arch, warp)
    if any(b.compiler.supports_target(target) for b in backends.values()):
        return ""
    return (f"the installed Triton {triton.__version__} has no compiler for {backend!r} (it "
            f"has {', '.join(sorted(backends)) or 'none'})")


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


def targets() -> dict[str, tuple[str, Any, int, Tuning, str]]:
    """target → (triton backend, arch (Intel: a device-property dict), warp size, the vendor's
    tuning for it, the vendor)."""
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


def _cases(tuning: Tuning, fp64: bool = True
           ) -> dict[str, tuple[Any, str, Callable[[], Any]]]:
    """Every smoke case per dtype, as a backend with (or without) float64 launches it; with
    float64 also the "-nofp64" cases (the sampled select / verify kernels compiled as a device
    without float64 runs them)."""
    from .backend import KernelBackend

    kernels = launched_kernels()
    out = {}
    for d, dt in DTYPES.items():
        for variant in (fp64, False) if fp64 else (False,):
            be = KernelBackend("compile-check", "cpu", (dt,), tuning, has_fp64=variant)
            extra = variant != fp64                  # the "-nofp64" cases of a float64 target
            for case, (method, make) in cases(dt).items():
                if extra and case.split("-")[1] != "sampled":
                    continue         # the same kernels as with float64 (watermarked: refused)
                call = lambda b=be, m=method, a=make(): getattr(b, m)(*a)   # noqa: E731
                for module, name in kernels[method]:
                    out[(f"{case}-{d}" + ("-nofp64" if extra else ""), name)] = \
                        (module, name, call)
    return out


def launched_kernels() -> dict[str, list[tuple[Any, str]]]:
    """Backend op → the kernels (module, name) one call of it launches."""
    from . import attention, conv, noise, norm, rope, selector, topk, verify

    return {"conv_prepare": [(conv, "_conv_kernel")], "conv_finish": [(conv, "_conv_kernel")],
            "select": [(topk, "_topk_kernel"), (selector, "_walk_kernel")],
            "verify": [(verify, "_verify_kernel")],
            "attention": [(attention, "_attention_kernel")],
            "noise": [(noise, "_noise_kernel")], "token_uniforms": [(noise, "_noise_kernel")],
            "rms_norm": [(norm, "_rms_norm_kernel")],
            "attention_prologue": [(rope, "_prologue_kernel")]}


def compile_all(chosen: dict[str, tuple[str, Any, int, Tuning, str]]
                ) -> list[dict[str, Any]]:
    """One row per (case, target): ok, seconds, the error where compilation failed, why a case
    was skipped (``skipped``: no kernel runs it on a target without float64), and whether the
    binary computes in float64 (``float64``: read from a SPIR-V module's capabilities; None
    where the binary does not say)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if any(backend == "xpu" for backend, *_ in chosen.values()):
        # Intel's Triton builds a C++ helper (arch_parser.c, which includes sycl.hpp) when it
        # makes its compiler; without an Intel device it builds it with $CC (gcc by default),
        # which does not link the C++ runtime, and loading the helper then fails on an
        # undefined libstdc++ symbol.
        os.environ.setdefault("CC", shutil.which("g++") or shutil.which("clang++") or "c++")
    rows = []
    for t, (backend, arch, warp, tuning, vendor) in chosen.items():
        fp64 = has_fp64(arch)
        for (case, _), (module, name, call) in _cases(tuning, fp64).items():
            row: dict[str, Any] = {"case": case, "kernel": name, "target": t,
                                   "tuning": f"{vendor} warp {warp}", "skipped": "",
                                   "float64": None}
            launch = _record(module, name, call)
            if isinstance(launch, str):          # no kernel: fine only without float64
                row.update(ok=not fp64, error="" if not fp64 else launch, seconds=0.0,
                           skipped=launch if not fp64 else "")
                rows.append(row)
                continue
            fn, args, kw = launch
            sig, consts = _signature(fn, args, kw)
            start = time.perf_counter()
            try:
                options = {k: v for k, v in kw.items() if k in ("num_warps", "enable_fp_fusion")}
                if backend == "xpu":             # sub-group size: the target's "warp"
                    options["threads_per_warp"] = warp
                out = triton.compile(ASTSource(fn, sig, consts),
                                     target=GPUTarget(backend, arch, warp),
                                     options={"num_warps": 4, **options})
                binary = out.asm.get(BINARY[backend])
                error = "" if binary else f"no {BINARY[backend]} produced"
                row.update(f64=len(f64_ops(out.asm["ttir"])),
                           narrow_index=narrow_index(out.asm["ttir"]))
                if row["f64"] and (not fp64 or case.endswith("-nofp64")):
                    error = f"{row['f64']} float64 operation(s) in a kernel without float64"
                if binary and BINARY[backend] == "spv":
                    row["float64"] = _CAP_FLOAT64 in spirv_capabilities(binary)
                    if row["float64"] and not fp64:
                        error = ("the SPIR-V module declares the Float64 capability: a device "
                                 "without float64 (has_fp64 False) cannot build it")
                row.update(ok=not error, error=error)
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
        why = "; ".join(vendors()[1]) or "install dflash2rt-cuda, dflash2rt-rocm or dflash2rt-xpu"
        print(f"no installed plugin declares compile targets (dflash2rt_gpu_vendors): {why}",
              file=sys.stderr)
        return 2
    brings = {v.name: v.triton.distribution for v in vendors()[0]}
    unavailable = {t: f"{why}: {vendor} targets need the Triton of {brings[vendor]}"
                   for t, (backend, arch, warp, _, vendor) in known.items()
                   if (why := available(backend, arch, warp))}
    wanted = args.target or list(known)
    for t in wanted:
        if t in unavailable:
            print(f"not compiled for {t}: {unavailable[t]}", file=sys.stderr)
    asked = [t for t in wanted if t not in unavailable]
    if not asked or (args.target and len(asked) < len(wanted)):   # a named target is required
        return 2
    rows = compile_all({t: known[t] for t in asked})
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        for r in rows:
            state = "FAIL" if not r["ok"] else "skip" if r["skipped"] else "ok  "
            print(f"{state} {r['case']:30s} {r['target']:6s} {r['seconds']:6.2f}s {r['tuning']} "
                  f"f64 ops {r.get('f64', '-')}, narrow index {len(r.get('narrow_index', []))} "
                  f"{(r['error'] or r['skipped'])[:300]}")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
