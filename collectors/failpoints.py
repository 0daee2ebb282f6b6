"""The collector's named crash points (`pipeline/failpoints.py`), from
`$SLUICE_COLLECTOR_FAILPOINTS`: the service reads them once at start-up and passes them down."""

from __future__ import annotations

from pipeline.failpoints import Failpoints

ENV_VAR = "SLUICE_COLLECTOR_FAILPOINTS"


def collector_failpoints() -> Failpoints:
    """The failpoints `$SLUICE_COLLECTOR_FAILPOINTS` names (none when it is not set)."""
    return Failpoints.from_environment(ENV_VAR)
