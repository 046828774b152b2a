"""The cpu-nofp64 backend as the registry lists and selects it, where a sweep found classes the
other tests let through: it says it has no float64, is opt-in (``auto`` never picks it, with
the opt-in reason) at the lowest priority, and is available everywhere; and the float64 guard on
an op whose only float64 tensor is its result. Expected rows written out by hand."""

from __future__ import annotations

import pytest
import torch

from dflash2rt.cpu.nofp64 import Float64Error, Float64Forbidden
from dflash2rt.registry import Registry


@pytest.fixture(scope="module")
def registry():
    return Registry.discover()


def test_the_backends_row_says_no_float64_opt_in_lowest_priority(registry):
    row = next(s for s in registry.statuses() if s.name == "cpu-nofp64")
    assert (row.available, row.reason, row.device, row.priority, row.opt_in, row.fp64,
            row.dtypes) == (True, "", "cpu (float64 forbidden)", 0, True, False,
                            ("float32", "bfloat16"))
    assert row.kernels == "torch eager ops, float32 formulation of the sampled path"


def test_auto_skips_it_as_opt_in_and_naming_it_builds_it(registry):
    skipped = dict(registry.select("auto").skipped)
    assert skipped["cpu-nofp64"] == "opt-in backend, used only when named"
    sel = registry.select("cpu-nofp64")
    assert (sel.name, sel.how, sel.backend.name, sel.backend.has_fp64) == \
        ("cpu-nofp64", "explicit", "cpu-nofp64", False)
    assert sel.backend.dtypes == (torch.float32, torch.bfloat16)


def test_a_float64_result_of_integer_inputs_is_refused_by_the_output_check():
    """``view(float64)`` of int64 bits: no float64 input and no dtype keyword, only the result."""
    bits = torch.zeros(2, dtype=torch.int64)
    with Float64Forbidden():
        assert bits.view(torch.int32).dtype == torch.int32         # a reinterpretation is fine
        with pytest.raises(Float64Error, match="float64 tensor output on a device without"):
            bits.view(torch.float64)
