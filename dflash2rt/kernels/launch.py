"""Every kernel launch goes through ``launch``: compile keys recorded, or launches collected."""

from __future__ import annotations

import contextlib
import inspect
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Iterator, Sequence

import torch

# Triton compiles one binary per compile key: the constexpr values, each pointer's dtype, each
# specialized int's class (the value 1 becomes a constant, a multiple of 16 gets a divisibility
# attribute, 32- or 64-bit), each pointer's 16-byte alignment, and the launch options
# (``num_warps``, ``enable_fp_fusion``). ``compile_key`` reproduces that from a launch's
# arguments as Triton's ``specialize_impl`` does (NVIDIA's rules; an argument a kernel lists in
# ``do_not_specialize`` keeps only its type, one in ``do_not_specialize_on_alignment`` no
# attribute), so the keys a run launches can be counted on any machine, the interpreter
# included (``recording``). ``collecting`` turns this thread's launches into records that do not
# run: the wrappers then return their unwritten outputs, which is what a shape-only trace of a
# step needs (``engine.precompile``). ``warm_up`` compiles collected launches on a thread pool.
# No triton import here: the engine uses this module whatever the backend.

OPTIONS = ("num_warps", "num_stages", "enable_fp_fusion")    # launch options in a compile key
COMPILE_THREADS = max(1, min(8, os.cpu_count() or 1))         # compiles run side by side
Key = tuple                    # (kernel name, per-argument classes, options)
# Triton's names of the pointer element types (``*fp32`` ...)
_TYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16",
          torch.float64: "fp64", torch.int64: "i64", torch.int32: "i32", torch.int16: "i16",
          torch.int8: "i8", torch.uint8: "u8", torch.bool: "u1"}


def bytes_of(flags: torch.Tensor) -> torch.Tensor:
    """A bool tensor as the int8 0 / 1 a kernel reads (a view: no launch); other dtypes cast."""
    return flags.view(torch.int8) if flags.dtype == torch.bool else flags.to(torch.int8)


def kernel_name(kernel: Any) -> str:
    """``module.function`` of a ``@triton.jit`` kernel (compiled or interpreted)."""
    fn = getattr(kernel, "fn", kernel)
    return f"{fn.__module__.rsplit('.', 1)[-1]}.{fn.__name__}"


def _jit_option(kernel: Any, name: str) -> tuple:
    """A ``triton.jit`` option of ``kernel`` (the interpreter keeps them in ``kwargs``)."""
    got = getattr(kernel, name, None)
    if got is None:
        got = (getattr(kernel, "kwargs", None) or {}).get(name)
    return tuple(got or ())


def _params(kernel: Any) -> list[tuple[str, bool, bool, bool]]:
    """(name, constexpr, specialized, alignment specialized) per parameter of ``kernel``."""
    cached = getattr(kernel, "_dflash2rt_params", None)
    if cached is not None:
        return cached
    fn = getattr(kernel, "fn", kernel)
    dns = _jit_option(kernel, "do_not_specialize")
    dna = _jit_option(kernel, "do_not_specialize_on_alignment")
    out = []
    for i, p in enumerate(inspect.signature(fn).parameters.values()):
        out.append((p.name, "constexpr" in str(p.annotation), i not in dns and p.name not in dns,
                    i not in dna and p.name not in dna))
    try:
        kernel._dflash2rt_params = out
    except AttributeError:                              # a plain function (tests)
        pass
    return out


def aligned(t: torch.Tensor) -> bool:
    """Whether the tensor's first element is 16-byte aligned, taking its allocation as aligned
    (device allocators align to far more): the storage offset decides. Works for shape-only
    (meta / fake) tensors too."""
    return t.storage_offset() * t.element_size() % 16 == 0


def arg_class(value: Any, specialize: bool = True, align: bool = True) -> tuple:
    """Triton's specialization of one non-constexpr argument: (type, attribute); ``align``
    False: no divisibility / alignment attribute (``do_not_specialize_on_alignment``)."""
    specialize_d = specialize and align
    if value is None:
        return ("constexpr", None)
    if isinstance(value, bool):
        return ("u1", None)
    if isinstance(value, int):
        if specialize and value == 1:
            return ("constexpr", 1)
        kind = "i32" if -2**31 <= value < 2**31 else "u64" if value >= 2**63 else "i64"
        return (kind, "D" if specialize_d and value % 16 == 0 else None)
    if isinstance(value, float):
        return ("fp32", None)
    if isinstance(value, torch.Tensor):
        return (f"*{_TYPES.get(value.dtype, value.dtype)}",
                "D" if specialize_d and aligned(value) else None)
    if isinstance(value, Pointer):
        return (f"*{_TYPES.get(value.dtype, value.dtype)}",
                "D" if specialize_d and value.ptr % 16 == 0 else None)
    raise TypeError(f"no compile key for a kernel argument of type {type(value).__name__}")


def compile_key(kernel: Any, args: tuple, kw: dict[str, Any]) -> Key:
    """The compile key of ``kernel[grid](*args, **kw)`` (module docstring)."""
    params = _params(kernel)
    classes = []
    for i, (name, const, spec, align) in enumerate(params):
        value = args[i] if i < len(args) else kw[name]
        classes.append(("constexpr", value) if const else arg_class(value, spec, align))
    options = tuple(sorted((k, v) for k, v in kw.items() if k in OPTIONS))
    return (kernel_name(kernel), tuple(classes), options)


@dataclass(frozen=True)
class Pointer:
    """A pointer argument for a warm-up, as Triton's specialization reads one: its dtype, an
    address with the tensor's alignment, and the byte size of its storage (``ptr_range``:
    AMD's buffer-op attribute asks whether it fits in 2 GiB)."""

    dtype: torch.dtype
    ptr: int
    nbytes: int = 0

    def data_ptr(self) -> int:
        return self.ptr

    def ptr_range(self) -> int:
        return self.nbytes


def warm_form(value: Any) -> Any:
    """A launch argument as ``JITFunction.warmup`` takes it: a tensor becomes a ``Pointer``
    (its storage offset's bytes as the address, the allocation taken as aligned); everything
    else stays."""
    if not isinstance(value, torch.Tensor):
        return value
    return Pointer(value.dtype, value.storage_offset() * value.element_size(),
                   value.untyped_storage().nbytes())


@dataclass(frozen=True)
class Launch:
    """One launch as a compile plan holds it: the kernel, its compile key, and the positional
    and keyword arguments a warm-up compiles it from (``warm_form``)."""

    kernel: Any = field(repr=False, compare=False)
    key: Key
    args: tuple = field(repr=False, compare=False)
    kwargs: dict = field(repr=False, compare=False)

    @property
    def name(self) -> str:
        return self.key[0]

    def constexprs(self) -> dict[str, Any]:
        return {p[0]: c[1] for p, c in zip(_params(self.kernel), self.key[1]) if p[1]}


class Launches:
    """The distinct compile keys launched (or collected) per kernel, with a warm-up form each."""

    def __init__(self) -> None:
        self.by_key: dict[Key, Launch] = {}
        self.count = 0
        self.calls: dict[str, int] = {}          # kernel name → launches (not distinct keys)
        self._lock = threading.Lock()

    def add(self, kernel: Any, args: tuple, kw: dict[str, Any]) -> None:
        key = compile_key(kernel, args, kw)
        with self._lock:
            self.count += 1
            self.calls[key[0]] = self.calls.get(key[0], 0) + 1
            if key not in self.by_key:
                self.by_key[key] = Launch(kernel, key, tuple(warm_form(a) for a in args),
                                          dict(kw))

    def keys(self) -> set[Key]:
        return set(self.by_key)

    def variants(self, name: str, **constexprs: Any) -> list[Launch]:
        """The distinct launches of kernel ``name`` ("selector._walk_kernel") whose constexprs
        include ``constexprs`` (e.g. ``MARKED=True``)."""
        return [x for x in self.by_key.values() if x.name == name
                and all(x.constexprs().get(k) == v for k, v in constexprs.items())]

    def per_kernel(self) -> dict[str, int]:
        """kernel name → distinct compile keys."""
        out: dict[str, int] = {}
        for key in self.by_key:
            out[key[0]] = out.get(key[0], 0) + 1
        return dict(sorted(out.items()))


_recorders: list[Launches] = []          # every launch of every thread is added to these
_local = threading.local()               # .collect: this thread's collecting Launches, if any


class Collected(Exception):
    """Raised by a launch under ``collecting(stop=True)``: the launch is recorded, the wrapper
    ends there."""


@contextlib.contextmanager
def recording() -> Iterator[Launches]:
    """Record the compile key of every launch (they still run) until the block ends."""
    rec = Launches()
    _recorders.append(rec)
    try:
        yield rec
    finally:
        _recorders.remove(rec)


@contextlib.contextmanager
def collecting(stop: bool = False) -> Iterator[Launches]:
    """This thread's launches are collected and do not run (``stop``: each one raises
    ``Collected`` after it is collected, ending its wrapper)."""
    was = getattr(_local, "collect", None)
    rec = Launches()
    _local.collect = (rec, stop)
    try:
        yield rec
    finally:
        _local.collect = was


def is_collecting() -> bool:
    """Whether this thread's launches are being collected (a shape-only trace runs)."""
    return getattr(_local, "collect", None) is not None


def launch(kernel: Any, grid: tuple, *args: Any, **kw: Any) -> None:
    """``kernel[grid](*args, **kw)``, recorded where ``recording`` is active; under
    ``collecting`` only collected (neither run nor recorded)."""
    collect = getattr(_local, "collect", None)
    if collect is not None:
        collect[0].add(kernel, args, kw)
        if collect[1]:
            raise Collected
        return
    for rec in _recorders:
        rec.add(kernel, args, kw)
    kernel[grid](*args, **kw)


def warm_up(launches: Sequence[Launch], guard: Callable[[], ContextManager],
            threads: int) -> dict[Key, str]:
    """Compile every launch's variant into Triton's in-process cache (``JITFunction.warmup``:
    compiled, not run), on a pool of ``threads`` (Triton's compiler leaves the interpreter lock
    for most of a compile), each under ``guard()`` (the device made current: the cache is the
    current device's) → why each variant that failed to compile failed (it then compiles when
    first launched)."""
    def one(x: Launch) -> None:
        with guard():
            x.kernel.warmup(*x.args, grid=(1,), **x.kwargs)

    failed: dict[Key, str] = {}
    with ThreadPoolExecutor(max(1, min(threads, len(launches)))) as pool:
        for x, done in [(x, pool.submit(one, x)) for x in launches]:
            try:
                done.result()
            except Exception as exc:  # noqa: BLE001 - each failure is reported by the caller
                failed[x.key] = f"{type(exc).__name__}: {exc}"[:600]
    return failed
