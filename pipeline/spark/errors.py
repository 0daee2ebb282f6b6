"""Typed errors of the `sluice` Spark data sources."""

from __future__ import annotations

from pipeline.errors import SluiceError


class SparkSourceError(SluiceError):
    """Base class of the errors the `sluice` data sources raise on purpose."""


class OptionError(SparkSourceError, ValueError):
    """A data source option is missing or has a value that cannot be used."""

    def __init__(self, source: str, option: str, value: str | None, reason: str) -> None:
        self.source, self.option, self.value, self.reason = source, option, value, reason
        shown = "missing" if value is None else f"{value!r}"
        msg = f"{source} option {option} ({shown}): {reason}"
        super().__init__(msg)


class BatchConflict(SparkSourceError):
    """A batch id was recorded before with different contents: two jobs share a state file."""

    def __init__(self, state: str, batch_id: int, reason: str) -> None:
        self.state, self.batch_id, self.reason = state, batch_id, reason
        msg = (
            f"batch {batch_id} in {state}: {reason}; each job needs its own checkpoint "
            "directory (and its own state file next to it)"
        )
        super().__init__(msg)


class SparkUnreachable(SluiceError):
    """The Spark Connect server the settings name does not answer."""

    def __init__(self, url: str) -> None:
        self.address = url.split("/;", maxsplit=1)[0]  # the token stays out of messages
        msg = (
            f"the Spark Connect server at {self.address} does not answer: start it (`sluice"
            " spark start`, `sluice spark status`), or set [spark] remote (SLUICE_SPARK_REMOTE)"
            " to auto, which attaches only to a server that runs, or to local"
        )
        super().__init__(msg)
