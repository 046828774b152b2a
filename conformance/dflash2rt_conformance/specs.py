"""The registry of declarative op specs (OpInfo style). Add an op: write one ``OpSpec`` (see
``opspec.py``) in a ``specs_*.py`` module and list it here; the L1 tests parametrize over every
(spec, dtype, sample) and every error input automatically."""

from __future__ import annotations

from .opspec import ErrorInput, OpSpec
from .samples import Sample
from .specs_attention import ATTENTION
from .specs_backend import CONV_FINISH, CONV_PREPARE, NOISE, VERIFY
from .specs_device import INVERSE_CDF, SAMPLE_NEXT, SAMPLING_PARAMS, TARGET_PROBS
from .specs_device_selector import TOPK, UNARY
from .specs_select import SELECT
from .specs_watermark import WM_DRAW, WM_ERRORS, WM_NEG_LOG, WM_VALUES

SPECS: tuple[OpSpec, ...] = (NOISE, CONV_PREPARE, CONV_FINISH, SELECT, VERIFY, ATTENTION,
                             TARGET_PROBS, INVERSE_CDF, TOPK, UNARY, SAMPLE_NEXT, SAMPLING_PARAMS,
                             WM_VALUES, WM_NEG_LOG, WM_DRAW, WM_ERRORS)

__all__ = ["SPECS", "OpSpec", "ErrorInput", "cases", "error_cases"]


def cases() -> list[tuple[OpSpec, str, Sample]]:
    """Every (spec, dtype, sample) the L1 op test runs (exhaustive samples included)."""
    return [(s, d, smp) for s in SPECS for smp in s.samples() for d in s.dtypes]


def error_cases() -> list[tuple[OpSpec, ErrorInput]]:
    return [(s, e) for s in SPECS for e in s.errors()]
