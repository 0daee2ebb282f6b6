"""One running instance: a driver thread and a sender thread around one SQLite buffer.

The driver appends batches to the buffer through its `InstanceContext` (the runtime side of
`drivers/base.py`); the sender drains the buffer into the stream (`sender.py`). They share
the buffer file and a condition that wakes the sender when data arrives and a blocked driver
when room is made. An exclusive lock on `<buffer>.lock` refuses a second process on the same
buffer (two senders could send a batch twice). A driver that raises is logged, recorded for
`sluice collect status` and restarted with backoff: one bad read never stops the service.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence

from collectors.buffer import Appended, Buffer, TxnHook, WriteTurns
from collectors.buffer.schema import CursorState, PendingEvent
from collectors.drivers.base import Driver
from collectors.errors import BufferLocked
from collectors.failpoints import Failpoints
from collectors.sender import Sender
from collectors.settings import InstanceSettings
from pipeline.streams import StreamStore, open_store

log = logging.getLogger(__name__)


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


class Instance:
    """A driver and a sender around one buffer, started and stopped together."""

    def __init__(
        self,
        settings: InstanceSettings,
        driver: Driver,
        failpoints: Failpoints,
        store_opener: Callable[[str], StreamStore] = open_store,
    ) -> None:
        self.settings = settings
        self.driver = driver
        self.failpoints = failpoints
        self.store_opener = store_opener
        self.stop = threading.Event()  # drivers stop sampling
        self.drain = threading.Event()  # the sender stops once the buffer is empty
        self.halt = threading.Event()  # the sender stops now
        self._lock_fd: int | None = None
        self._threads: list[threading.Thread] = []
        self._buffers: list[Buffer] = []

    def start(self) -> None:
        self._lock_fd = _lock(self.settings)
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
            )
            self._buffers.append(buffer)
            return buffer

        ctx = InstanceContext(settings, open_buffer(), self.stop, self.failpoints)
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
        delay = 1.0
        try:
            while not self.stop.is_set():
                try:
                    self.driver.run(ctx)
                    return
                except Exception as exc:
                    log.exception(
                        "%s: driver failed, restarting in %.0fs", self.settings.name, delay
                    )
                    ctx.buffer.record_error(self.settings.driver, f"{type(exc).__name__}: {exc}")
                    self.stop.wait(delay)
                    delay = min(60.0, delay * 2)
        finally:
            ctx.buffer.flush_counters()

    @property
    def driver_running(self) -> bool:
        return len(self._threads) == 2 and self._threads[1].is_alive()

    @property
    def sender_running(self) -> bool:
        return bool(self._threads) and self._threads[0].is_alive()

    def join_driver(self, timeout: float | None = None) -> None:
        if len(self._threads) == 2:
            self._threads[1].join(timeout)

    def join_sender(self, timeout: float | None = None) -> None:
        if self._threads:
            self._threads[0].join(timeout)

    def buffered(self) -> int:
        """Events still held in the buffer."""
        return self._buffers[0].depth() if self._buffers else 0

    def close(self) -> None:
        """Close the buffers and release the lock (after both threads have ended)."""
        for buffer in self._buffers:
            buffer.close()
        self._buffers.clear()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None


def _lock(settings: InstanceSettings) -> int:
    path = settings.buffer_file.with_name(settings.buffer_file.name + ".lock")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise BufferLocked(settings.name, settings.buffer_file) from None
    return fd
