"""Compile-ahead on a simulated sm90 device, no GPU: every launch must find its binary."""

from __future__ import annotations

# Run with TRITON_INTERPRET=0 (tests/test_compile_ahead.py does). A stand-in Triton driver makes
# the current target ``cuda`` sm90, so ``JITFunction.warmup`` compiles real binaries into
# Triton's in-process cache; nothing is ever launched. The engine's backend is the Triton
# ``KernelBackend`` on the CPU with a graph adapter that "captures" by running the step, whose ops
# compute with the torch ops; each op first runs its kernel wrapper with the launch collected
# (``kernels.launch.collecting``), and the launch's key is computed by Triton's own binder from
# the real arguments, as a launch would, and looked up in the cache the engine's compile-ahead
# filled. Prints each call's stats and "hits N misses M"; exits 1 on a miss.

import sys

import torch
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.runtime import driver
from triton.runtime.jit import compute_cache_key

from dflash2rt.api import resolve_model
from dflash2rt.backend import TorchOpsBackend
from dflash2rt.engine.engine import Engine
from dflash2rt.engine.request import Request, SamplingParams
from dflash2rt.kernels import launch as L
from dflash2rt.kernels.backend import KernelBackend
from dflash2rt.watermark import WatermarkKey
from fake_graphs import Rerun


class SimDriver:
    """The active driver's face Triton's JIT asks of: device 0, stream 0, target sm90."""

    target = GPUTarget("cuda", 90, 32)

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return self.target

    def get_active_torch_device(self):
        return torch.device("cpu")


found = {"hits": 0, "misses": []}


def triton_key_cached(kernel, args, kw) -> bool:
    """Whether the binary a launch of ``kernel`` with these arguments needs is compiled (the
    key as ``JITFunction.run`` computes it)."""
    kw = dict(kw)
    kw["debug"] = kw.get("debug", kernel.debug) or knobs.runtime.debug
    kw["instrumentation_mode"] = knobs.compilation.instrumentation_mode
    if hasattr(knobs.compilation, "fpsan_homomorphic_casts"):
        kw["fpsan_homomorphic_casts"] = knobs.compilation.fpsan_homomorphic_casts
    caches = kernel.device_caches[0]
    _, spec, options = caches[-1](*args, **kw)
    return compute_cache_key(caches[1], spec, options) in caches[0]


class Checked(KernelBackend):
    """Each op: its kernel launches (all of them: select launches two) checked against the
    cache, its result from the torch ops, whose own calls of fusable ops (the reference
    prologue's norms) are torch ops too (in the compile-ahead's trace, the kernel wrapper
    alone: its launches are collected there)."""

    inside = 0

    def _op(self, name, *a, **k):
        impl = TorchOpsBackend.attention if name == "attention" else getattr(TorchOpsBackend,
                                                                             name)
        if self.inside:
            return impl(self, *a, **k)
        if L.is_collecting():
            return getattr(KernelBackend, name)(self, *a, **k)
        with L.collecting() as got:
            getattr(KernelBackend, name)(self, *a, **k)
        for kernel, args, kw in getattr(got, "raw", []):
            if triton_key_cached(kernel, args, kw):
                found["hits"] += 1
            else:
                found["misses"].append(L.compile_key(kernel, args, kw))
        self.inside += 1
        try:
            return impl(self, *a, **k)
        finally:
            self.inside -= 1

    def conv_prepare(self, *a, **k):
        return self._op("conv_prepare", *a, **k)

    def conv_finish(self, *a, **k):
        return self._op("conv_finish", *a, **k)

    def select(self, *a, **k):
        return self._op("select", *a, **k)

    def verify(self, *a, **k):
        return self._op("verify", *a, **k)

    def attention(self, *a, **k):
        return self._op("attention", *a, **k)

    def noise(self, *a, **k):
        return self._op("noise", *a, **k)

    def token_uniforms(self, *a, **k):
        return self._op("token_uniforms", *a, **k)

    def rms_norm(self, *a, **k):
        return self._op("rms_norm", *a, **k)

    def attention_prologue(self, *a, **k):
        return self._op("attention_prologue", *a, **k)


def main() -> int:
    driver.set_active(SimDriver())
    raw_add = L.Launches.add

    def add(self, kernel, args, kw):                     # keep the real arguments too
        self.__dict__.setdefault("raw", []).append((kernel, args, kw))
        raw_add(self, kernel, args, kw)
    L.Launches.add = add
    pair = resolve_model("stdlib-code", "cpu", torch.float32)
    backend = Checked("sim-sm90", "cpu", (torch.float32,))
    backend.graph_adapter = Rerun()
    key = WatermarkKey(bytes(range(32)))
    prompts = ("def parse(self, text):\n", "import os\n", "class Node:\n")
    with Engine(pair, backend) as engine:
        for temps, block, mark in (((1.0, 0.7, 0.0), None, True), ((0.0, 0.0), None, False),
                                   ((1.0, 0.0), 5, False), ((0.7,), 2, True)):
            reqs = [Request(tuple(pair.tokenizer.encode(p)),
                            SamplingParams(max_new_tokens=10, temperature=t, seed=i))
                    for i, (p, t) in enumerate(zip(prompts, temps))]
            _, st = engine.generate(reqs, block_size=block, watermark=key if mark else None)
            print(f"temperatures {temps} block {block} watermark {mark}: blocks "
                  f"{sorted(st.block_sizes)} compile_s {st.compile_s:.2f} compile_variants "
                  f"{st.compile_variants} capture_s {st.capture_s:.2f} fallbacks {st.fallbacks}")
    print(f"hits {found['hits']} misses {len(found['misses'])}")
    for miss in sorted(set(found["misses"]), key=str)[:10]:
        print("missed", miss[0], [c for c in miss[1] if c[0] == "constexpr"])
    return 1 if found["misses"] or not found["hits"] else 0


if __name__ == "__main__":
    sys.exit(main())
