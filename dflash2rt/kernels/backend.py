"""A backend whose conv, selector walk, verification and attention run as the shared Triton
kernels, the watermark's keyed walk and residual / bonus draws included.

On a device without float64 (``has_fp64=False``: Intel Arc A-series) every op still runs its
kernel: the select and verify kernels are compiled with ``FP64=False``, the float32 formulation
of their sampled paths (``kernels.exact32``). Only the watermark's keyed draws need float64: a
watermarked batch there raises ``WatermarkUnsupportedError`` (nothing else does).
"""

from __future__ import annotations

import torch

from ..backend import TORCH_OPS, TRITON_INTERPRETER, TRITON_KERNEL, UNSUPPORTED, TorchOpsBackend
from ..watermark.sampler import require_fp64
from . import attention, conv, selector, verify, watermark
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
        """The conv, the selector walk, verification and attention are kernels (top-K and logit
        processing inside ``select`` / ``verify`` stay torch); the noise is drawn by torch
        ops. The watermark's keyed walk and residual / bonus draws run in the select / verify
        kernels (its block contexts and keyed acceptance coins are torch ops); without float64
        there is no watermark (``UNSUPPORTED``: a watermarked batch raises)."""
        return {"conv_prepare": built_as(conv), "conv_finish": built_as(conv),
                "select": built_as(selector), "verify": built_as(verify), "noise": TORCH_OPS,
                "attention": built_as(attention),
                "watermark": built_as(watermark) if self.has_fp64 else UNSUPPORTED}

    # Every launch runs under ``device_guard()``: Triton launches on the current device.
    def conv_prepare(self, x, base, delta, block_size):
        with self.device_guard():
            return conv.conv_prepare(x, base, delta, block_size, self.tuning)

    def conv_finish(self, h, a, base, delta, block_size):
        with self.device_guard():
            return conv.conv_finish(h, a, base, delta, block_size, self.tuning)

    def select(self, logits, proj, anchor, pred_codebook, succ_codebook, params, sampling, u_walk):
        with self.device_guard():
            return selector.select(logits, proj, anchor, pred_codebook, succ_codebook, params,
                                   sampling, u_walk, self.tuning, has_fp64=self.has_fp64)

    def verify(self, logits, draft, candidates, q, sampling, noise, check=True):
        with self.device_guard():
            return verify.verify(logits, draft, candidates, q, sampling, noise, check,
                                 self.tuning, has_fp64=self.has_fp64)

    def select_marked(self, wm, logits, proj, anchor, pred_codebook, succ_codebook, params,
                      sampling, u_walk):
        require_fp64(self.has_fp64)
        with self.device_guard():
            return selector.select(logits, proj, anchor, pred_codebook, succ_codebook, params,
                                   sampling, u_walk, self.tuning, wm=wm)

    def verify_marked(self, wm, logits, sel, sampling, noise):
        require_fp64(self.has_fp64)
        marks = wm.marks(sel.draft, True)              # contexts, freshness, keyed coins: torch
        with self.device_guard():
            return verify.verify(logits, sel.draft, sel.candidates, sel.q, sampling,
                                 marks.noise(noise), False, self.tuning, marks=marks)

    def attention(self, q, k, v, lo, hi, scale):
        with self.device_guard():
            return attention.attention(q, k, v, lo, hi, scale, self.tuning)
