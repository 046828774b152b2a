"""A backend whose conv, selector walk, verification and attention run as the shared Triton
kernels, the watermark's keyed walk and residual / bonus draws included: given the watermark's
draw source (``watermark.generate.KeyedDraws``), select and verify launch the same kernels
with its keyed inputs. On a device without float64 (``has_fp64=False``: Intel Arc A-series)
every op still runs its kernel, compiled with ``FP64=False`` (the float32 formulation of the
sampled paths, ``kernels.exact32``); only the keyed draws need float64, and a keyed draw source
there raises ``WatermarkUnsupportedError`` (nothing else does).
"""

from __future__ import annotations

import torch

from ..backend import TRITON_INTERPRETER, TRITON_KERNEL, UNSUPPORTED, TorchOpsBackend
from ..errors import InvalidInputError
from ..ops.draws import DrawSource
from ..ops.rng import Stream
from ..watermark.generate import KeyedDraws
from ..watermark.sampler import require_fp64
from . import attention, conv, noise, norm, rope, selector, verify, watermark
from .launch import COMPILE_THREADS, warm_up
from .tuning import DEFAULT, Tuning


def built_as(module) -> str:
    """How Triton built ``module``'s ``@triton.jit`` kernels in this process: for the device, or
    for its host interpreter (``TRITON_INTERPRET=1`` when the module was imported)."""
    kinds = {type(v).__name__ for v in vars(module).values()
             if type(v).__module__.startswith("triton.")}
    return TRITON_INTERPRETER if "InterpretedFunction" in kinds else TRITON_KERNEL


class KernelBackend(TorchOpsBackend):
    """Top-K, logit processing and the draft/target forwards (but their attention) stay torch;
    the DFlash2 ops and the attention over the static cache are Triton kernels launched with
    the vendor's ``tuning``."""

    def __init__(self, name: str, device: torch.device | str, dtypes: tuple[torch.dtype, ...],
                 tuning: Tuning = DEFAULT, has_fp64: bool = True) -> None:
        super().__init__(name, device, dtypes, has_fp64)
        self.tuning = tuning

    @property
    def implementation(self) -> dict[str, str]:
        """The conv, the selector walk, verification, the noise (a step's uniforms, and a
        token's), attention and the models' RMSNorm and attention prologue (q / k norm, rope,
        the cache write) are kernels (top-K and logit processing inside ``select`` /
        ``verify`` stay torch). The watermark's keyed walk and residual /
        bonus draws run in the select / verify kernels (its block contexts and keyed
        acceptance coins are torch ops); without float64 there is no watermark
        (``UNSUPPORTED``: a watermarked batch raises)."""
        return {"conv_prepare": built_as(conv), "conv_finish": built_as(conv),
                "select": built_as(selector), "verify": built_as(verify),
                "noise": built_as(noise), "attention": built_as(attention),
                "rms_norm": built_as(norm), "attention_prologue": built_as(rope),
                "watermark": built_as(watermark) if self.has_fp64 else UNSUPPORTED}

    @property
    def compiles_ahead(self) -> bool:
        """True where the kernels compile for the device (not under the interpreter)."""
        return any(built_as(m) == TRITON_KERNEL for m in (conv, selector, verify, attention))

    def compile_ahead(self, launches):
        """Each launch's variant compiled into Triton's cache for this device, on a thread pool
        (``kernels.launch.warm_up``); nothing under the interpreter."""
        if not self.compiles_ahead or not launches:
            return {}
        return warm_up(launches, self.device_guard, COMPILE_THREADS)

    # Every launch runs under ``device_guard()``: Triton launches on the current device.
    def conv_prepare(self, x, base, delta, block_size):
        with self.device_guard():
            return conv.conv_prepare(x, base, delta, block_size, self.tuning)

    def conv_finish(self, h, a, base, delta, block_size):
        with self.device_guard():
            return conv.conv_finish(h, a, base, delta, block_size, self.tuning)

    def select(self, logits, proj, anchor, pred_codebook, succ_codebook, params, sampling, draws):
        wm = _keyed(draws, self.has_fp64)
        with self.device_guard():
            return selector.select(logits, proj, anchor, pred_codebook, succ_codebook, params,
                                   sampling, draws if wm is None else draws.noise.walk,
                                   self.tuning, wm=None if wm is None else draws.wm,
                                   has_fp64=self.has_fp64)

    def verify(self, logits, draft, candidates, q, sampling, draws, check=True):
        marks = None
        if _keyed(draws, self.has_fp64) is not None:    # contexts, freshness, coins: torch
            draws, marks = draws.verify_draws(draft, self.has_fp64)
        with self.device_guard():
            return verify.verify(logits, draft, candidates, q, sampling, draws, check,
                                 self.tuning, marks=marks, has_fp64=self.has_fp64)

    def attention(self, q, k, v, lo, hi, scale):
        with self.device_guard():
            return attention.attention(q, k, v, lo, hi, scale, self.tuning)

    def noise(self, seed, request, anchor_pos, gamma):
        with self.device_guard():
            return noise.block_noise(seed, request, anchor_pos, gamma)

    def token_uniforms(self, seed, request, position, lead=0):
        with self.device_guard():
            return noise.uniform_words(seed, request, position, 1, lead)[Stream.BONUS, :, 0]

    fuses_model_ops = True            # the models' norms and prologues: the kernels below

    def rms_norm(self, x, weight, eps):
        with self.device_guard():
            return norm.rms_norm(x, weight, eps)

    def attention_prologue(self, q, k, v, q_norm, k_norm, cos, sin, cache_k, cache_v, pos):
        with self.device_guard():
            return rope.attention_prologue(q, k, v, q_norm, k_norm, cos, sin, cache_k, cache_v,
                                           pos)


def _keyed(draws, has_fp64: bool) -> KeyedDraws | None:
    """The watermark's draw source (after the float64 check), None for the ordinary noise;
    another ``DrawSource`` has no kernel here and is refused."""
    if not isinstance(draws, DrawSource):
        return None
    if not isinstance(draws, KeyedDraws):
        raise InvalidInputError(f"the kernels draw with the ordinary noise or the watermark's "
                                f"keyed draws, not {type(draws).__name__}")
    require_fp64(has_fp64)
    return draws
