"""Fixtures of the conformance tests: the backend under test (from the registry), the results
recorder, the quick flag and the L2-L4 sizes. (The JUnit system properties are written with the
verdict at the end of the session: ``session.Recorder``.)"""

from __future__ import annotations

import pytest

from .plugin import STATE, make_state


@pytest.fixture(scope="session")
def conformance(pytestconfig):
    if STATE not in pytestconfig.stash:
        pytestconfig.stash[STATE] = make_state(pytestconfig)
    return pytestconfig.stash[STATE]


@pytest.fixture(scope="session")
def backend(conformance):
    return conformance.backend


@pytest.fixture(scope="session")
def results(conformance):
    return conformance.results


@pytest.fixture(scope="session")
def quick(conformance) -> bool:
    return conformance.quick


@pytest.fixture(scope="session")
def sizes(conformance):
    return conformance.sizes
