"""L1: every op spec on the backend vs the float64 reference on identical (rounded) inputs, and
every error input raises the stated dflash2rt error."""

from __future__ import annotations

import builtins
import re

import pytest

from dflash2rt_conformance import harness, specs
from dflash2rt_conformance.harness import DTYPES
from dflash2rt_conformance.known_issues import KNOWN

pytestmark = pytest.mark.dflash2rt_level("L1")


def _params():
    out = []
    for spec, dtype, sample in specs.cases():
        marks = [pytest.mark.dflash2rt_exhaustive] if sample.tier == "exhaustive" else []
        if (spec.name, sample.name) in KNOWN:
            exc, reason = KNOWN[(spec.name, sample.name)]
            marks.append(pytest.mark.xfail(raises=getattr(builtins, exc), strict=False,
                                           reason=reason))
        out.append(pytest.param(spec, dtype, sample, marks=marks,
                                id=f"{spec.name}-{dtype}-{sample.name}"))
    return out


@pytest.mark.parametrize("spec,dtype,sample", _params())
def test_op(spec, dtype, sample, backend, results):
    if DTYPES[dtype] not in backend.dtypes:
        pytest.skip(f"backend {backend.name} does not declare {dtype}")
    harness.run_sample(spec, sample, dtype, backend, results)


@pytest.mark.parametrize("spec,err", [pytest.param(s, e, id=f"{s.name}-{e.name}")
                                      for s, e in specs.error_cases()])
def test_error_input(spec, err, backend):
    call = err.build(backend.device)
    with pytest.raises(err.error) as info:
        call(backend)
    assert re.search(err.match, str(info.value)), \
        f"[L1 {spec.name} error={err.name}] raised {type(info.value).__name__} but the " \
        f"message {str(info.value)!r} does not say {err.match!r}"
