"""A backend whose conv, selector walk, verification and attention run as the shared Triton
kernels, the watermark's keyed walk and residual / bonus draws included.

On a device without float64 (``has_fp64=False``: Intel Arc A-series) the sampled select / verify,
whose kernels compute in tl.float64, run the float32 formulation of the torch ops instead
(``dflash2rt.ops.exact32``), reported as a standing fallback; greedy batches stay on the kernels.
There a watermarked batch goes to the torch ops, which raise (the keyed draws need float64).
"""

from __future__ import annotations

import torch

from ..backend import TORCH_OPS, TRITON_INTERPRETER, TRITON_KERNEL, TorchOpsBackend
from ..ops import selector as ops_selector, verify as ops_verify
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
        if not has_fp64:
            self.report_fallback("no float64 on this device: sampled select / verify run the "
                                 "float32 torch ops (exact acceptance; the kernels use float64)")

    @property
    def implementation(self) -> dict[str, str]:
        """The conv, the selector walk, verification and attention are kernels (top-K and logit
        processing inside ``select`` / ``verify`` stay torch); the noise is drawn by torch
        ops. The watermark's keyed walk and residual / bonus draws run in the select / verify
        kernels (its block contexts and keyed acceptance coins are torch ops); without float64
        they are the torch ops, which raise."""
        return {"conv_prepare": built_as(conv), "conv_finish": built_as(conv),
                "select": built_as(selector), "verify": built_as(verify), "noise": TORCH_OPS,
                "attention": built_as(attention),
                "watermark": built_as(watermark) if self.has_fp64 else TORCH_OPS}

    def conv_prepare(self, x, base, delta, block_size):
        return conv.conv_prepare(x, base, delta, block_size, self.tuning)

    def conv_finish(self, h, a, base, delta, block_size):
        return conv.conv_finish(h, a, base, delta, block_size, self.tuning)

    def select(self, logits, proj, anchor, pred_codebook, succ_codebook, params, sampling, u_walk):
        if sampling.any_sampled and not self.has_fp64:
            return ops_selector.select(logits, proj, anchor, pred_codebook, succ_codebook,
                                       params, sampling, u_walk, has_fp64=False)
        return selector.select(logits, proj, anchor, pred_codebook, succ_codebook, params,
                               sampling, u_walk, self.tuning)

    def verify(self, logits, draft, candidates, q, sampling, noise, check=True):
        if sampling.any_sampled and not self.has_fp64:
            return ops_verify.verify(logits, draft, candidates, q, sampling, noise, check,
                                     has_fp64=False)
        return verify.verify(logits, draft, candidates, q, sampling, noise, check, self.tuning)

    def select_marked(self, wm, logits, proj, anchor, pred_codebook, succ_codebook, params,
                      sampling, u_walk):
        if not self.has_fp64:
            return super().select_marked(wm, logits, proj, anchor, pred_codebook,
                                         succ_codebook, params, sampling, u_walk)
        return selector.select(logits, proj, anchor, pred_codebook, succ_codebook, params,
                               sampling, u_walk, self.tuning, wm=wm)

    def verify_marked(self, wm, logits, sel, sampling, noise):
        if not self.has_fp64:
            return super().verify_marked(wm, logits, sel, sampling, noise)
        marks = wm.marks(sel.draft)                    # contexts, freshness, keyed coins: torch
        return verify.verify(logits, sel.draft, sel.candidates, sel.q, sampling,
                             marks.noise(noise), False, self.tuning, marks=marks)

    def attention(self, q, k, v, lo, hi, scale):
        return attention.attention(q, k, v, lo, hi, scale, self.tuning)
