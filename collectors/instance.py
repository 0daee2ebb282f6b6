"""One running instance: a driver thread and a sender thread around one SQLite buffer.

The driver appends batches to the buffer through its `InstanceContext` (the runtime side of
`drivers/base.py`); the sender drains the buffer into the stream (`sender.py`). They share
the buffer file and a condition that wakes the sender when data arrives and a blocked driver
when room is made. An exclusive lock on `<buffer>.lock` refuses a second process on the same
buffer (two senders could send a batch twice). A driver that raises is logged, recorded for
`sluice collect status` and restarted with backoff: one bad read never stops the service.

A buffer records the instance and stream it belongs to (`meta`), and another instance, or
this one pointed at another stream while the buffer still holds data, is refused
(`BufferOwned`): its events would be committed to the wrong stream. A driver that reports
its source's connection (`set_connected`) has it recorded for `sluice collect status`.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from collectors.buffer import Appended, Buffer, Held, TxnHook, WriteTurns
from collectors.buffer.schema import CursorState, PendingEvent
from collectors.drivers.base import Driver
from collectors.errors import BufferLocked, BufferOwned, BufferUnusable, CollectorError
from collectors.sender import Sender
from collectors.settings import InstanceSettings
from pipeline.config import FileModes
from pipeline.failpoints import Failpoints
from pipeline.streams import StreamStore, open_store

log = logging.getLogger(__name__)

#: `sluice collect status` (and so every metrics scrape) tells whether an instance runs by
#: taking a shared lock on its lock file for a moment: a start-up that meets one waits this
#: long before it decides that another collector owns the buffer.
LOCK_PATIENCE_SECONDS = 1.0


class InstanceContext:
    """What the instance gives its driver: `drivers.base.DriverContext`, implemented over the
    driver thread's own connection to the buffer."""

    def __init__(
        self,
        settings: InstanceSettings,
        buffer: Buffer,
        stop: threading.Event,
        failpoints: Failpoints,
    ) -> None:
        self.settings = settings
        self.buffer = buffer
        self.stop = stop
        self.failpoints = failpoints
        self.log = logging.getLogger(f"collectors.{settings.driver}.{settings.name}")
        self._last_error: dict[str, float] = {}
        self._connected: bool | None = None

    @property
    def running(self) -> bool:
        return not self.stop.is_set()

    def wait(self, seconds: float) -> bool:
        """Sleep up to `seconds`; False if the instance is stopping."""
        return not self.stop.wait(seconds)

    def append(
        self,
        events: Sequence[PendingEvent],
        cursor: CursorState | None = None,
        hook: TxnHook | None = None,
    ) -> Appended:
        """Store events (with the driver's cursor and extra SQL) in one durable commit."""
        result = self.buffer.append(events, cursor, hook, stop=self.stop)
        self.failpoints.hit("driver.after_append")
        return result

    def cursor(self, name: str) -> CursorState | None:
        return self.buffer.cursor(name)

    def error(self, source: str, message: str, every: float = 10.0) -> None:
        """Log and record a driver problem (at most once per `every` seconds per source)."""
        now = time.monotonic()
        if now - self._last_error.get(source, -every) < every:
            return
        self._last_error[source] = now
        self.log.error("%s: %s", source, message)
        self.buffer.record_error(f"{self.settings.driver}.{source}", message)

    def set_connected(self, connected: bool, detail: str = "") -> None:
        """Record whether the driver reaches its source (kept in the buffer's meta, shown by
        `sluice collect status`); written only when it changes."""
        if connected is self._connected:
            return
        if connected:
            self.log.info("connected: %s", detail)
        elif self._connected:
            self.log.warning("disconnected: %s", detail)
        self._connected = connected
        self.buffer.set_meta(
            {
                "driver_connected": "1" if connected else "0",
                "driver_detail": detail,
                "driver_since_ns": str(time.time_ns()),
                "driver_since_mono_ns": str(time.monotonic_ns()),  # for status's durations
            }
        )


#: A failed driver is restarted after this many seconds, twice as many after each failure in
#: a row, at most `RESTART_LONGEST`; a driver that ran that long before failing starts over.
RESTART_FIRST = 1.0
RESTART_LONGEST = 60.0


class Instance:
    """A driver and a sender around one buffer, started and stopped together."""

    def __init__(
        self,
        settings: InstanceSettings,
        driver: Driver,
        failpoints: Failpoints,
        store_opener: Callable[[str], StreamStore] = open_store,
        file_modes: FileModes | None = None,
    ) -> None:
        self.settings = settings
        self.driver = driver
        self.failpoints = failpoints
        self.store_opener = store_opener
        self.file_modes = file_modes or FileModes()
        self.stop = threading.Event()  # drivers stop sampling
        self.drain = threading.Event()  # the sender stops once the buffer is empty
        self.halt = threading.Event()  # the sender stops now
        self._lock_fd: int | None = None
        self._threads: list[threading.Thread] = []
        self._buffers: list[Buffer] = []

    def start(self) -> None:
        """Lock and open the buffer, check that it is this instance's, start both threads."""
        self._lock_fd = lock_buffer(self.settings, self.file_modes.file)
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    def _start(self) -> None:
        room = threading.Condition()
        turns = WriteTurns()
        settings = self.settings

        def open_buffer() -> Buffer:
            buffer = Buffer(
                settings.buffer_file,
                settings.capacity_events,
                settings.when_full,
                room=room,
                failpoints=self.failpoints,
                turns=turns,
                file_mode=self.file_modes.file,
            )
            self._buffers.append(buffer)
            return buffer

        ctx = InstanceContext(settings, open_buffer(), self.stop, self.failpoints)
        _claim(ctx.buffer, settings)
        sender = Sender(settings, open_buffer(), self.failpoints, self.store_opener)
        self._threads = [
            threading.Thread(
                target=sender.run,
                args=(self.drain, self.halt),
                name=f"{settings.name}-sender",
                daemon=True,
            ),
            threading.Thread(
                target=self._run_driver, args=(ctx,), name=f"{settings.name}-driver", daemon=True
            ),
        ]
        for thread in self._threads:
            thread.start()
        log.info(
            "%s: started (%s -> %s, buffer %s)",
            settings.name,
            settings.driver,
            settings.stream,
            settings.buffer_file,
        )

    def _run_driver(self, ctx: InstanceContext) -> None:
        delay = RESTART_FIRST
        try:
            while not self.stop.is_set():
                started = time.monotonic()
                try:
                    self.driver.run(ctx)
                    return
                except Exception as exc:
                    if time.monotonic() - started >= RESTART_LONGEST:
                        delay = RESTART_FIRST  # it ran well for a while: a new failure
                    self._driver_failed(ctx, exc, delay)
                    self.stop.wait(delay)
                    delay = min(RESTART_LONGEST, delay * 2)
        finally:
            ctx.buffer.flush_counters()

    def _driver_failed(self, ctx: InstanceContext, exc: Exception, delay: float) -> None:
        """Log the failure (one line for a collector error, such as a full disk under the
        buffer) and record it for `sluice collect status` if the buffer takes the write."""
        name = self.settings.name
        if isinstance(exc, CollectorError):
            log.error("%s: driver failed, restarting in %.0fs: %s", name, delay, exc)
        else:
            log.exception("%s: driver failed, restarting in %.0fs", name, delay)
        try:
            ctx.buffer.record_error(self.settings.driver, f"{type(exc).__name__}: {exc}")
        except CollectorError as record_exc:  # the buffer itself may be the problem
            log.error("%s: cannot record the driver's error: %s", name, record_exc)

    @property
    def driver_running(self) -> bool:
        return len(self._threads) == 2 and self._threads[1].is_alive()

    @property
    def sender_running(self) -> bool:
        return bool(self._threads) and self._threads[0].is_alive()

    def buffered(self) -> Held:
        """Events still held in the buffer: pending, and doubtful."""
        return self._buffers[0].held() if self._buffers else Held(0, 0)

    def record_stop(self, note: str) -> None:
        """Keep how the last run ended for `sluice collect status` (threads have ended)."""
        if self._buffers:
            self._buffers[0].set_meta({"last_stop": note, "last_stop_ns": str(time.time_ns())})

    def close(self) -> None:
        """Close the buffers and release the lock (after both threads have ended)."""
        for buffer in self._buffers:
            buffer.close()
        self._buffers.clear()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None


def prepare_directory(settings: InstanceSettings, state_dir: Path, modes: FileModes) -> None:
    """Create the state directory (owner-only unless group read is set); a `buffer_file`
    elsewhere must be in a directory that exists (a missing one is often a missing mount)."""
    directory = settings.buffer_file.parent
    if directory.is_dir():
        return
    if directory != state_dir:
        problem = f"its directory {directory} does not exist"
        hint = "create it, or fix buffer_file (only state_dir is created by the collector)"
        raise BufferUnusable(settings.buffer_file, problem, hint)
    try:
        directory.mkdir(mode=modes.directory, parents=True, exist_ok=True)
    except OSError as exc:
        problem = f"its directory {directory} cannot be created ({exc.strerror or exc})"
        raise BufferUnusable(settings.buffer_file, problem, "check state_dir") from None
    if not directory.is_dir():
        problem = f"state_dir {directory} is not a directory"
        raise BufferUnusable(settings.buffer_file, problem, "check state_dir")


def _claim(buffer: Buffer, settings: InstanceSettings) -> None:
    """Record this instance and stream in the buffer, unless it holds another's data."""
    meta = buffer.meta()
    owner, owner_stream = meta.get("instance"), meta.get("stream")
    other = owner is not None and (owner, owner_stream) != (settings.name, settings.stream)
    if other and (owner != settings.name or buffer.depth() or buffer.ledger.txns()):
        path = settings.buffer_file
        raise BufferOwned(path, owner, owner_stream or "?", settings.name, settings.stream)
    if other:
        log.warning(
            "%s: buffer %s was instance %s's for stream %s; it is empty: now %s's",
            settings.name,
            settings.buffer_file,
            owner,
            owner_stream,
            settings.stream,
        )
    identity = {"instance": settings.name, "stream": settings.stream, "store": settings.store}
    buffer.set_meta({**identity, "driver_connected": "", "driver_detail": ""})


def lock_buffer(settings: InstanceSettings, file_mode: int) -> int:
    """Take the instance's lock file (`BufferLocked` if a running collector holds it) and
    return its descriptor: closing it releases the lock."""
    path = settings.buffer_file.with_name(settings.buffer_file.name + ".lock")
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, file_mode)
    except OSError as exc:
        problem = f"its lock file {path} cannot be created ({exc.strerror or exc})"
        raise BufferUnusable(settings.buffer_file, problem, "check buffer_file") from None
    deadline = time.monotonic() + LOCK_PATIENCE_SECONDS
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(fd)
                raise BufferLocked(settings.name, settings.buffer_file) from None
            time.sleep(0.01)
