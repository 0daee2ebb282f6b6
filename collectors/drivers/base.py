"""The driver contract: all a driver may rely on, and all it imports of the collector's runtime.

A driver module provides `parse_options` and `create` (`DriverModule`); the `Driver` it
creates runs with a `DriverContext`, which `collectors/instance.py` implements. Drivers import
this module (and the helpers `batch`, `tabular`, `nic_sampler`, `errors`), never `instance`,
`sender`, `coordinator` or `service`. It plays the part of the Pravega Sensor Collector's
`DeviceDriver` (https://github.com/pravega/pravega-sensor-collector); DRIVERS.md next to this
file describes each driver.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from collectors.buffer import Appended, TxnHook
from collectors.buffer.schema import CursorState, PendingEvent
from collectors.options import OptionsReader
from pipeline.failpoints import Failpoints

__all__ = [
    "Appended",
    "CursorState",
    "Driver",
    "DriverBuffer",
    "DriverContext",
    "DriverModule",
    "DriverSettings",
    "OptionsReader",
    "PendingEvent",
    "TxnHook",
]


class DriverSettings(Protocol):
    """What a driver reads of its instance's settings (`settings.InstanceSettings`)."""

    @property
    def name(self) -> str: ...
    @property
    def routing_key(self) -> str | None: ...
    @property
    def samples_per_event(self) -> int: ...
    @property
    def buffer_file(self) -> Path: ...
    @property
    def options(self) -> Any:
        """The driver's own frozen `Options`, as its `parse_options` returned them."""


class DriverBuffer(Protocol):
    """What a driver may do to its buffer besides appending: keep its own state tables."""

    @property
    def capacity_events(self) -> int: ...
    @property
    def conn(self) -> sqlite3.Connection:
        """For reading the driver's own tables (never for writing: use `write`)."""

    def write(self, hook: TxnHook) -> None:
        """Run the driver's SQL in one write transaction of the buffer."""

    def add_counters(self, deltas: dict[str, int]) -> None: ...
    def quarantine(self, c: sqlite3.Connection, source: str, reason: str, payload: bytes) -> None:
        """Inside an append `hook`: keep bad input with the reason it was refused."""


class DriverContext(Protocol):
    """What a running driver gets: its settings, a stop flag, and the buffer to append to."""

    @property
    def settings(self) -> DriverSettings: ...
    @property
    def buffer(self) -> DriverBuffer: ...
    @property
    def stop(self) -> threading.Event: ...
    @property
    def failpoints(self) -> Failpoints: ...
    @property
    def log(self) -> logging.Logger: ...
    @property
    def running(self) -> bool: ...

    def wait(self, seconds: float) -> bool:
        """Sleep up to `seconds`; False if the instance is stopping."""

    def append(
        self,
        events: Sequence[PendingEvent],
        cursor: CursorState | None = None,
        hook: TxnHook | None = None,
    ) -> Appended:
        """Store events, with the driver's cursor and `hook` SQL, in one durable commit.

        When the buffer is full, `block` waits for room (STOPPED if the instance stops
        meanwhile: nothing was stored) and `shed` drops the events (SHED)."""

    def cursor(self, name: str) -> CursorState | None:
        """The driver position stored under `name` by an earlier `append`, if any."""

    def error(self, source: str, message: str, every: float = 10.0) -> None:
        """Log and record a problem for `sluice collect status`, at most once per `every`
        seconds per source."""

    def set_connected(self, connected: bool, detail: str = "") -> None:
        """For a driver with a connection to its source (a broker): whether it is up now.
        `sluice collect status` shows it, and its health check fails when it stays down for
        longer than `unhealthy_after_seconds`. Cheap to call often: written on change only."""


class Driver(Protocol):
    def run(self, ctx: DriverContext) -> None:
        """Sample until `ctx.stop` is set (or the source is exhausted), handing batches to
        `ctx.append`. An exception is logged and recorded, and `run` is called again."""


class DriverModule(Protocol):
    """A driver module, as the registry loads it: the options contract and a factory."""

    def parse_options(self, reader: OptionsReader) -> Any:
        """Read and check the driver's own keys into its frozen `Options` (no side effects:
        runs while the whole configuration is validated, before anything starts)."""

    def create(self, settings: DriverSettings) -> Driver:
        """Check the outside world (interface, device, directories, broker) and return a
        driver, or raise `DriverError`."""
