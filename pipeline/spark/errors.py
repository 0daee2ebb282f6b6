"""Typed errors of the `sluice` Spark data sources, and of the Spark Connect server and its
clients (`connect.py`, `session.py`)."""

from __future__ import annotations

import re
from pathlib import Path

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


def without_token(text: str) -> str:
    """`text` with the value of every `token=` of a Spark Connect URL in it blanked."""
    return re.sub(r"(token=)[^;/\s'\"]*", r"\1…", text)


class SparkLost(SparkUnreachable):
    """The Spark Connect server a session is attached to stopped answering in the middle of
    the session's work (killed, stopped, restarted)."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        msg = (
            f"the Spark Connect server at {self.address} stopped answering (killed, stopped or "
            "restarted): run the job again, it goes on from its checkpoint (on a local Spark "
            "if no server runs: `sluice spark status`)"
        )
        self.args = (msg,)


class ServerError(SluiceError):
    """The Spark Connect server could not be started, or is not the one expected."""

    def __init__(self, problem: str, log: Path | None = None) -> None:
        self.problem, self.log = problem, log
        msg = f"Spark Connect server: {problem}" + (f"; see {log}" if log else "")
        super().__init__(msg)


class PortTaken(ServerError):
    """The port a server is to listen on is another program's."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        super().__init__(
            f"{host}:{port} is taken by another program: choose another port (`sluice spark "
            "start --port`), or leave the port out for a free one"
        )


class StateFileDamaged(ServerError):
    """`$SLUICE_HOME/spark/connect.json` is not a state file Sluice wrote."""

    def __init__(self, path: Path, reason: str) -> None:
        self.path, self.reason = path, reason
        super().__init__(
            f"the state file {path} is damaged ({reason}): `sluice spark stop` stops the "
            "server of this SLUICE_HOME, if one runs, and removes the file"
        )
