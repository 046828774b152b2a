"""The registry of declarative op specs (OpInfo style). Add an op: write one ``OpSpec`` (see
``opspec.py``) in ``specs_backend.py`` or ``specs_device.py`` and list it here; the L1 tests
parametrize over every (spec, dtype, sample) and every error input automatically."""

from __future__ import annotations

from .opspec import ErrorInput, OpSpec
from .specs_backend import CONV_FINISH, CONV_PREPARE, NOISE, SELECT, VERIFY
from .specs_device import INVERSE_CDF, SAMPLE_NEXT, SAMPLING_PARAMS, TARGET_PROBS, TOPK, UNARY

SPECS: tuple[OpSpec, ...] = (NOISE, CONV_PREPARE, CONV_FINISH, SELECT, VERIFY, TARGET_PROBS,
                             INVERSE_CDF, TOPK, UNARY, SAMPLE_NEXT, SAMPLING_PARAMS)
BY_NAME = {s.name: s for s in SPECS}

__all__ = ["SPECS", "BY_NAME", "OpSpec", "ErrorInput", "cases", "error_cases"]


def cases() -> list[tuple[OpSpec, str, object]]:
    """Every (spec, dtype, sample) the L1 op test runs (exhaustive samples included)."""
    return [(s, d, smp) for s in SPECS for smp in s.samples() for d in s.dtypes]


def error_cases() -> list[tuple[OpSpec, ErrorInput]]:
    return [(s, e) for s in SPECS for e in s.errors()]
