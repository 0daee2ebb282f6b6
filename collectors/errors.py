"""Typed errors of the edge collector.

Each carries its context as fields and a message that says what to do next. All derive from
`pipeline.errors.SluiceError`, so `sluice collect` prints any of them as one line and exits 1.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.errors import SluiceError


class CollectorError(SluiceError):
    """Base class of every error the collector raises on purpose."""


class ConfigError(CollectorError, ValueError):
    """A collector setting is missing, unknown or out of range (found at start-up)."""

    def __init__(self, where: str, problem: str, hint: str = "") -> None:
        self.where, self.problem, self.hint = where, problem, hint
        msg = f"collector config: {where}: {problem}"
        if hint:
            msg = f"{msg}; {hint}"
        super().__init__(msg)


class BufferLocked(CollectorError):
    """Another collector process already owns this instance's buffer."""

    def __init__(self, instance: str, path: Path) -> None:
        self.instance, self.path = instance, path
        msg = (
            f"instance {instance}: buffer {path} is in use by another running collector; "
            "stop that one first (two senders on one buffer could send a batch twice)"
        )
        super().__init__(msg)


class BufferSchemaError(CollectorError):
    """The buffer file was written by a newer collector, or is not a collector buffer."""

    def __init__(self, path: Path, found: int, supported: int) -> None:
        self.path, self.found, self.supported = path, found, supported
        msg = (
            f"buffer {path} has schema version {found}, this collector reads up to "
            f"{supported}: run the newer collector, or move the file away to start afresh"
        )
        super().__init__(msg)


class BufferCorrupt(CollectorError):
    """The buffer's own invariants do not hold (a bug or a hand-edited file)."""

    def __init__(self, path: Path, detail: str) -> None:
        self.path, self.detail = path, detail
        msg = (
            f"buffer {path} is inconsistent: {detail}; keep the file for inspection and "
            "report it (nothing was sent for the rows involved)"
        )
        super().__init__(msg)


class DriverError(CollectorError):
    """A driver cannot start: its device, interface, directory or broker is not usable."""

    def __init__(self, instance: str, driver: str, problem: str) -> None:
        self.instance, self.driver, self.problem = instance, driver, problem
        msg = f"instance {instance} ({driver}): {problem}"
        super().__init__(msg)


class BufferUnusable(CollectorError):
    """The buffer file cannot be opened as a collector buffer: its directory is missing, or
    it is not a SQLite database (or is another program's)."""

    def __init__(self, path: Path, problem: str, hint: str) -> None:
        self.path, self.problem, self.hint = path, problem, hint
        msg = f"buffer {path}: {problem}; {hint}"
        super().__init__(msg)


class BufferNotWritable(CollectorError):
    """SQLite cannot write the buffer file: its disk is full or its filesystem read-only.
    The write is rolled back whole; what was buffered before it is kept."""

    def __init__(self, path: Path, reason: str) -> None:
        self.path, self.reason = path, reason
        msg = (
            f"buffer {path}: cannot write ({reason}); free space on its filesystem (or make "
            "it writable): what is buffered is kept, and a running collector goes on by "
            "itself once it can write"
        )
        super().__init__(msg)


class BufferOwned(CollectorError):
    """The buffer file belongs to another instance, or holds events for another stream."""

    def __init__(
        self, path: Path, owner: str, owner_stream: str, instance: str, stream: str
    ) -> None:
        self.path, self.owner, self.owner_stream = path, owner, owner_stream
        self.instance, self.stream = instance, stream
        msg = (
            f"instance {instance} (stream {stream}): buffer {path} belongs to instance "
            f"{owner} (stream {owner_stream}) and still holds its data; run that instance "
            "until it has sent its buffer, or give this one its own buffer_file"
        )
        super().__init__(msg)


class MetricsUnavailable(CollectorError):
    """The metrics endpoint cannot listen where `metrics_address` and `metrics_port` say."""

    def __init__(self, address: str, port: int, reason: str) -> None:
        self.address, self.port, self.reason = address, port, reason
        msg = (
            f"metrics endpoint {address}:{port} cannot listen: {reason}; set another "
            "metrics_port (or metrics_address) in [collector], or stop what holds that port"
        )
        super().__init__(msg)
