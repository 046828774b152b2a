"""Dual-key Gumbel-max watermarking: keys (``keys``), keyed values bit-exact on every
device (``values``), watermarked draws (``sampler``) and the model-free detector (``detect``)."""

from .detect import DEFAULT_CONTEXT_WIDTH, Detection, detect, token_evidence
from .keys import SubKey, WatermarkKey, WatermarkKeyError

__all__ = ["WatermarkKey", "WatermarkKeyError", "SubKey", "Detection", "detect", "token_evidence",
           "DEFAULT_CONTEXT_WIDTH"]
