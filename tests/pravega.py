"""The Pravega cluster the suites may run against: SLUICE_TEST_PRAVEGA=tcp://host:9090.

No Pravega server can run on the development machine or in CI; tests parametrized with
`pravega_backend()` run when the variable names one (docker/README.md shows how to start the
compose deployment's) and skip with that reason otherwise.
"""

from __future__ import annotations

import os

import pytest

VARIABLE = "SLUICE_TEST_PRAVEGA"


def pravega_backend(what: str):
    """A `pravega` parameter that skips unless SLUICE_TEST_PRAVEGA names a cluster."""
    return pytest.param(
        "pravega",
        marks=pytest.mark.skipif(
            not os.environ.get(VARIABLE),
            reason=f"set {VARIABLE}=tcp://host:9090 to run {what} against Pravega",
        ),
    )


def pravega_uri() -> str:
    return os.environ[VARIABLE]
