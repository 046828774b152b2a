"""Every float tolerance of the suite, per op × dtype, with the reason for each loosening.

This module is the single owner (docs/design.md §5). The base row of a dtype is what an op
computing in that dtype with a handful of roundings meets; an entry in ``LOOSENED`` may only
widen it and must say why. Tolerances are keyed by op and dtype, never by backend: a backend
cannot relax its own (the suite never reads tolerances from a backend or a plugin). Integers
(tokens, accept lengths, candidate ids, flags) and the uniforms (bit-exact by design) are
compared exactly and have no entry here.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType


@dataclass(frozen=True)
class Tol:
    atol: float
    rtol: float
    reason: str = ""


BASE = MappingProxyType({
    "float64": Tol(1e-12, 1e-12, "float64 on both sides: only summation order differs"),
    "float32": Tol(2e-6, 2e-6, "float32 unit roundoff 6e-8 times a few dozen roundings"),
    "bfloat16": Tol(2e-6, 2e-6, "bf16 inputs are exact in float32; ops that compute in float32 "
                    "meet the float32 row"),
})

_F32_CONTRACT = ("the op returns float32 by contract (docs/design.md §1: probabilities and q are "
                 "float32) whatever the input dtype, so float64 inputs meet the float32 row")
_BF16_ACCUM = ("the conv works in the input dtype (ops/conv.py): it rounds base+δ, each tap's "
               "product and the sum to bf16 (2^-8 relative each; a kernel may keep the sum in "
               "fp32); with Tk ≤ 7 taps of |w·x| ≲ 4 that is ≲ 3·7·4·2^-8 ≈ 0.33 worst case, "
               "≈ 0.06 in practice")
_BF16_ATTN = ("attention returns q's dtype: the output is rounded to bf16 (2^-9 relative, ≲ 0.008 "
              "for |out| ≲ 4), and flash-style kernels (and torch's CPU SDPA) round the softmax "
              "weights to bf16 before P·V (2^-9 relative each, so ≲ 2^-9·max|v| ≈ 0.008 for "
              "|v| ≲ 4); 0.0081 measured on the CPU torch op")
_STEP32 = ("a float32 model forward (2-3 decoder layers, RMSNorm, softmax attention, SwiGLU) "
           "accumulates ~1e-6 relative per layer; logits of magnitude ≲ 10 drift ≲ 1e-4")

LOOSENED = MappingProxyType({
    ("select.q", "float64"): Tol(2e-6, 2e-6, _F32_CONTRACT),
    ("target_probs", "float64"): Tol(2e-6, 2e-6, _F32_CONTRACT),
    ("unary_scores", "float64"): Tol(2e-6, 2e-6, _F32_CONTRACT),
    ("conv_prepare", "bfloat16"): Tol(0.1, 0.05, _BF16_ACCUM),
    ("conv_finish", "bfloat16"): Tol(0.1, 0.05, _BF16_ACCUM),
    ("attention", "bfloat16"): Tol(0.02, 0.01, _BF16_ATTN),
    ("spec_step.hidden", "float64"): Tol(1e-10, 1e-10, "float64 model forward: ~50 dependent "
                                         "reductions of length ≤ 72 in another order"),
    ("spec_step.logits", "float64"): Tol(1e-10, 1e-10, "as spec_step.hidden, through the head"),
    ("spec_step.q", "float64"): Tol(2e-6, 2e-6, _F32_CONTRACT),
    ("spec_step.hidden", "float32"): Tol(1e-4, 1e-4, _STEP32),
    ("spec_step.logits", "float32"): Tol(2e-4, 1e-4, _STEP32),
    ("spec_step.q", "float32"): Tol(1e-4, 1e-4, _STEP32 + "; q = softmax of those scores"),
})

# Noise of a decision margin: a float64 reference decision whose margin (top-2 gap of logits,
# distance of u to a CDF breakpoint, |u·q − p|) is below this may flip on a correct backend.
DECISION_NOISE = MappingProxyType({
    "float64": Tol(1e-9, 1e-9, "float64 model drift (spec_step.logits) with 10x headroom"),
    "float32": Tol(1e-3, 1e-4, "float32 model drift (spec_step.logits) with 10x headroom"),
    "bfloat16": Tol(0.25, 0.02, "bf16 model forward: 8-bit mantissa over every matmul"),
})


def tolerance(op: str, dtype: str) -> Tol:
    """The tolerance of output ``op`` (e.g. "select.q", "conv_prepare") at ``dtype``."""
    return LOOSENED.get((op, dtype)) or LOOSENED.get((op.split(".")[0], dtype)) or BASE[dtype]


def decision_noise(dtype: str, scale: float = 1.0) -> float:
    tol = DECISION_NOISE[dtype]
    return tol.atol + tol.rtol * abs(scale)
