"""The sender: one thread per instance that drains the buffer into the stream.

It opens the store lazily and keeps it open; any failure (the store unreachable, a directory
not writable, a Pravega controller down) closes it, is logged and recorded for `sluice collect
status`, and is retried with exponential backoff, while the driver keeps sampling into the
buffer. On reconnect it first resolves recorded transactions, then sends the backlog oldest
first. Delivery guarantee: exactly-once, in order (see `coordinator.py` for why).
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from collections.abc import Callable

from collectors.buffer import Buffer
from collectors.coordinator import TransactionCoordinator
from collectors.errors import CollectorError
from collectors.settings import InstanceSettings
from pipeline.failpoints import Failpoints
from pipeline.streams import StreamStore, StreamStoreError, open_store
from pipeline.wording import counted

log = logging.getLogger(__name__)

BACKOFF_START = 0.25
BACKOFF_MAX = 30.0
HEARTBEAT_SECONDS = 5.0
_EXPECTED = (StreamStoreError, OSError, CollectorError)


class Sender:
    """Runs the two-phase commit in a loop, with reconnects and backoff."""

    def __init__(
        self,
        settings: InstanceSettings,
        buffer: Buffer,
        failpoints: Failpoints,
        store_opener: Callable[[str], StreamStore] = open_store,
    ) -> None:
        self.settings = settings
        self.buffer = buffer
        self.failpoints = failpoints
        self.store_opener = store_opener
        self.store: StreamStore | None = None
        self.coordinator: TransactionCoordinator | None = None
        self._delay = 0.0
        self._last_error = ""
        self._last_error_time = 0.0
        self._last_heartbeat = 0.0
        self._last_send = 0.0
        self._failing_since_ns = self._failing_since_mono_ns = 0

    def run(self, drain: threading.Event, halt: threading.Event) -> None:
        """Send until `halt` is set, or until `drain` is set and the buffer is empty."""
        self.buffer.set_meta(_identity(self.settings))
        while not halt.is_set():
            # Read before the step: an empty queue ends the drain only if it was seen after
            # the drivers had stopped (they stop before `drain` is set), not before their
            # last append.
            draining = drain.is_set()
            try:
                sent = self._step(drain)
            except Exception as exc:
                self._failed(exc)
                halt.wait(self._delay)
                continue
            self._succeeded()
            self._heartbeat()
            if sent:
                continue
            if draining:
                break
            with self.buffer.room:
                self.buffer.room.wait(0.5)
        self._close_store()
        self._heartbeat(force=True, state="stopped")

    def _step(self, drain: threading.Event) -> int:
        coordinator = self._connect()
        coordinator.recover()
        if self._lingering(drain):
            return 0
        sent = coordinator.send_batch()
        if sent:
            self._last_send = time.monotonic()
        return sent

    def _lingering(self, drain: threading.Event) -> bool:
        """With `linger_ms`, wait that long after a send for a fuller batch."""
        linger = self.settings.linger_ms / 1000.0
        if not linger or drain.is_set() or time.monotonic() - self._last_send >= linger:
            return False
        return self.buffer.queued() < self.settings.max_events_per_txn

    def _connect(self) -> TransactionCoordinator:
        if self.coordinator is None:
            store = self.store_opener(self.settings.store)
            self.store = store
            if store.create_stream(self.settings.stream, segments=self.settings.segments):
                self._note_new_stream()
            self.coordinator = TransactionCoordinator(
                store, self.buffer, self.settings, self.failpoints
            )
            self.buffer.set_meta({"txn_protocol": self.coordinator.protocol})
            log.info(
                "%s: connected to %s, sending to %s (%s protocol)",
                self.settings.name,
                self.settings.store,
                self.settings.stream,
                self.coordinator.protocol,
            )
        return self.coordinator

    def _note_new_stream(self) -> None:
        """The stream did not exist, so it was created: if this buffer committed to it
        before, those events are not in it (deleted with it, or in a store since replaced).
        Sending goes on into the new stream, and the loss is logged and shown by status."""
        committed = self.buffer.counters().get("events_committed", 0)
        if not committed:
            return
        note = (
            f"{self.settings.stream} did not exist in {self.settings.store}, so it was created"
            f" again: the {counted(committed, 'event')} this buffer committed to it before are"
            " not in it (the stream was deleted, or the store replaced); new events go to the"
            " new stream"
        )
        log.error("%s: %s", self.settings.name, note)
        self.buffer.record_error("sender", note)

    def _close_store(self) -> None:
        if self.coordinator is not None:
            try:
                self.coordinator.forget_committed()
            except Exception as exc:  # recovery will recommit (a no-op) and forget it
                log.warning(
                    "%s: could not forget a committed transaction: %s", self.settings.name, exc
                )
        store, self.store, self.coordinator = self.store, None, None
        if store is not None:
            try:
                store.close()
            except Exception as exc:
                log.debug("%s: closing the store failed: %s", self.settings.name, exc)

    def _failed(self, exc: Exception) -> None:
        self._close_store()
        if not self._failing_since_ns:  # the monotonic stamp: for status's durations
            self._failing_since_ns, self._failing_since_mono_ns = _stamps()
        self._delay = min(BACKOFF_MAX, max(BACKOFF_START, self._delay * 2))
        self._delay *= random.uniform(0.8, 1.0)
        message = f"{type(exc).__name__}: {exc}"
        if isinstance(exc, _EXPECTED):
            log.warning(
                "%s: sending failed, retrying in %.1fs: %s",
                self.settings.name,
                self._delay,
                message,
            )
        else:
            log.exception(
                "%s: unexpected error while sending, retrying in %.1fs",
                self.settings.name,
                self._delay,
            )
        now = time.monotonic()
        if message != self._last_error or now - self._last_error_time > 60.0:
            self._last_error, self._last_error_time = message, now
            try:
                self.buffer.record_error("sender", message)
            except Exception as record_exc:  # the buffer itself may be the problem
                log.error("%s: cannot record the error: %s", self.settings.name, record_exc)
        self._heartbeat(force=True, state=f"retrying: {message}")

    def _succeeded(self) -> None:
        if self._delay:
            log.info("%s: sending again after a failure", self.settings.name)
            self._delay = 0.0
            self._last_error = ""
            self._failing_since_ns = self._failing_since_mono_ns = 0
            self._heartbeat(force=True)

    def _heartbeat(self, force: bool = False, state: str = "sending") -> None:
        now = time.monotonic()
        if not force and now - self._last_heartbeat < HEARTBEAT_SECONDS:
            return
        self._last_heartbeat = now
        try:
            self.buffer.set_meta(
                {
                    "heartbeat_ns": str(time.time_ns()),
                    "heartbeat_mono_ns": str(time.monotonic_ns()),
                    "sender_state": state,
                    "sender_failing_since_ns": str(self._failing_since_ns or ""),
                    "sender_failing_since_mono_ns": str(self._failing_since_mono_ns or ""),
                    "pid": str(os.getpid()),
                }
            )
        except Exception as exc:
            log.warning("%s: cannot write the heartbeat: %s", self.settings.name, exc)


def _stamps() -> tuple[int, int]:
    """Now by the wall clock (shown) and by the monotonic one (`sluice collect status`
    measures durations by it, so a step of the wall clock does not count)."""
    return time.time_ns(), time.monotonic_ns()


def _identity(settings: InstanceSettings) -> dict[str, str]:
    return {
        "instance": settings.name,
        "driver": settings.driver,
        "stream": settings.stream,
        "store": settings.store,
        "capacity_events": str(settings.capacity_events),
        "started_ns": str(time.time_ns()),
    }
