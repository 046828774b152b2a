"""A backend whose conv, selector walk and verification run as the shared Triton kernels."""

from __future__ import annotations

import torch

from ..backend import TorchOpsBackend
from . import conv, selector, verify
from .tuning import DEFAULT, Tuning


class KernelBackend(TorchOpsBackend):
    """Top-K, logit processing and the draft/target forwards stay torch; the DFlash2 ops are
    Triton kernels launched with the vendor's ``tuning``."""

    def __init__(self, name: str, device: torch.device | str, dtypes: tuple[torch.dtype, ...],
                 tuning: Tuning = DEFAULT) -> None:
        super().__init__(name, device, dtypes)
        self.tuning = tuning

    def conv_prepare(self, x, base, delta, block_size):
        return conv.conv_prepare(x, base, delta, block_size, self.tuning)

    def conv_finish(self, h, a, base, delta, block_size):
        return conv.conv_finish(h, a, base, delta, block_size, self.tuning)

    def select(self, logits, proj, anchor, pred_codebook, succ_codebook, params, sampling, u_walk):
        return selector.select(logits, proj, anchor, pred_codebook, succ_codebook, params,
                               sampling, u_walk, self.tuning)

    def verify(self, logits, draft, candidates, q, sampling, noise, check=True):
        return verify.verify(logits, draft, candidates, q, sampling, noise, check, self.tuning)
