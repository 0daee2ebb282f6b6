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


#: What moving a damaged buffer aside costs, said by every error that suggests it.
MOVE_ASIDE_COST = (
    "what it still held is then lost (events not yet sent, transactions awaiting a decision) "
    "and the driver starts from nothing: a generator numbers from 0 again and the files "
    "driver takes the files left in place again, so the stream may receive samples it "
    "already holds a second time"
)

#: What to do about a damaged cursor row: the driver cannot tell where its source stands.
CURSOR_HINT = (
    "the driver cannot tell where to resume without it. Stop the collector and restore "
    f"the row (from a backup), or move the buffer aside to start afresh: {MOVE_ASIDE_COST}"
)


class BufferDamaged(CollectorError):
    """The buffer file is damaged (bytes overwritten, truncated, emptied, or its write-ahead
    log lost): starting on it could send events twice or drop them, so it is refused."""

    def __init__(self, path: Path, problem: str) -> None:
        self.path, self.problem = path, problem
        msg = (
            f"buffer {path} is damaged: {problem}; the collector will not start on it. "
            f"Keep it for inspection (`sqlite3 {path.name} .recover` may save its events) and "
            f"move it aside with its -wal and -shm files to start afresh: {MOVE_ASIDE_COST}"
        )
        super().__init__(msg)


class BufferBusy(CollectorError):
    """A process other than a collector (an sqlite3 shell, a backup tool) holds a lock on
    the buffer file for longer than the collector waits."""

    def __init__(self, path: Path, waited_seconds: float) -> None:
        self.path, self.waited_seconds = path, waited_seconds
        msg = (
            f"buffer {path}: locked by another process for over {waited_seconds:.0f}s (not a "
            "collector: an sqlite3 shell or a backup holding a transaction open?); find it "
            f"(`fuser {path}`) and end its transaction; nothing was written meanwhile"
        )
        super().__init__(msg)


class CursorUnreadable(CollectorError):
    """A driver's stored position (a row of the buffer's `cursor` table) cannot be used: it
    is damaged, or written by a newer collector."""

    def __init__(self, path: Path, cursor: str, problem: str, hint: str) -> None:
        self.path, self.cursor, self.problem, self.hint = path, cursor, problem, hint
        msg = f"buffer {path}: the driver's cursor {cursor!r} {problem}; {hint}"
        super().__init__(msg)


class InstanceRunning(CollectorError):
    """An offline action on an instance's buffer (`sluice collect resolve`) while a
    collector runs it."""

    def __init__(self, instance: str, path: Path, action: str) -> None:
        self.instance, self.path, self.action = instance, path, action
        msg = (
            f"instance {instance}: a running collector holds its buffer {path}; stop it "
            f"first, then run `{action}` again (the sender must not use the buffer meanwhile)"
        )
        super().__init__(msg)
