"""Accelerometer driver: the Linux IIO buffer of an ST lng2dm (or any 3-axis IIO device).

Reads 16-byte records (x, y, z as int8, a nanosecond timestamp), scales each axis by the
device's sysfs `in_accel_*_scale` and writes events in the layout of the Pravega Sensor
Collector's `AccelerometerDriver`. Delivery guarantee: **at-most-once** into the buffer,
exactly-once from it on: the records of the batch being filled are lost on a crash (a clean
stop buffers them), because the kernel's IIO buffer cannot be read again.
Details and settings: DRIVERS.md next to this file.
"""

from __future__ import annotations

import errno
import math
import os
import select
import sqlite3
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

from collectors.batch import ColumnBatch
from collectors.drivers.base import DriverContext, DriverSettings, OptionsReader
from collectors.errors import DriverError

RECORD = struct.Struct("<bbb5xq")
RECORD_SIZE = RECORD.size  # 16
READ_SIZE = RECORD_SIZE * 256
AXES = ("x", "y", "z")


@dataclass(frozen=True, slots=True)
class Options:
    device_file: Path
    sysfs_dir: Path


def parse_options(r: OptionsReader) -> Options:
    return Options(device_file=r.path("device_file"), sysfs_dir=r.path("sysfs_dir"))


def create(settings: DriverSettings) -> AccelerometerDriver:
    options: Options = settings.options
    scales = tuple(_scale(settings.name, options.sysfs_dir, axis) for axis in AXES)
    problem = _device_problem(options.device_file)
    if problem:
        raise DriverError(settings.name, "accelerometer", problem)
    return AccelerometerDriver(settings, scales)


def _scale(instance: str, sysfs_dir: Path, axis: str) -> float:
    """`in_accel_<axis>_scale`: a finite number greater than 0 (a NaN or an infinity would
    turn every sample into null in the JSON, a 0 every sample into 0)."""
    path = sysfs_dir / f"in_accel_{axis}_scale"
    try:
        scale = float(path.read_text().split()[0])
    except (OSError, ValueError, IndexError) as exc:
        problem = f"cannot read the {axis} scale from {path}: {exc}"
        raise DriverError(instance, "accelerometer", problem) from None
    if not math.isfinite(scale) or scale <= 0:
        problem = (
            f"the {axis} scale in {path} is {scale!r}, not a finite number greater than 0: "
            "point sysfs_dir at the device's IIO directory (/sys/bus/iio/devices/iio:deviceN)"
        )
        raise DriverError(instance, "accelerometer", problem)
    return scale


def _device_problem(path: Path) -> str | None:
    """Why `path` cannot be read as the device (None if it can): it must exist, be a
    character device, a FIFO or a file, and readable."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return f"device file {path} does not exist"
    except OSError as exc:
        return f"device file {path} cannot be used: {exc}"
    if not (stat.S_ISCHR(mode) or stat.S_ISFIFO(mode) or stat.S_ISREG(mode)):
        return f"device file {path} is not a character device, a FIFO or a file"
    if not os.access(path, os.R_OK):  # not opened here: a FIFO's writer would meet this probe
        return f"device file {path} is not readable by this user: grant it read access"
    return None


class AccelerometerDriver:
    """Reads 16-byte IIO records, scales them, batches them into events."""

    def __init__(self, settings: DriverSettings, scales: tuple[float, ...]) -> None:
        self.settings = settings
        self.options: Options = settings.options
        self.scales = scales
        self.is_file = False  # a regular file (a test's stand-in) is followed, never reopened
        self.constants = {"RemoteAddr": settings.routing_key or ""}

    def run(self, ctx: DriverContext) -> None:
        batch = ColumnBatch(("X", "Y", "Z"), self.constants)
        partial = b""
        fd = self._open(ctx)
        try:
            while fd is not None and ctx.running:
                data = self._read(fd, ctx)
                if data is None:
                    continue
                if not data and self.is_file:  # the file ends here for now
                    ctx.wait(0.05)
                    continue
                if not data:  # the FIFO's writer left, or the device went away
                    partial = self._quarantine(
                        ctx, partial, "the stream ended (a writer left, or the device failed)"
                    )
                    os.close(fd)
                    fd = self._open(ctx) if ctx.wait(0.05) else None
                    continue
                partial = self._decode(partial + data, batch)
                while len(batch) >= self.settings.samples_per_event:
                    taken = batch.detach(self.settings.samples_per_event)
                    ctx.append(taken.take_events(self.settings.routing_key))
        finally:  # what was read is buffered, even when the device went away
            if fd is not None:
                os.close(fd)
            if len(batch):
                ctx.append(batch.take_events(self.settings.routing_key))
            self._quarantine(ctx, partial, "the driver stopped before the rest came")

    def _open(self, ctx: DriverContext) -> int | None:
        """The device, opened without blocking; while it cannot be opened (unplugged, the
        FIFO removed) that is reported and tried again every second. None once stopping."""
        path = self.options.device_file
        failed = False
        while ctx.running:
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
            except OSError as exc:
                failed = True
                ctx.error("open", f"cannot open {path}: {exc}; no samples until it can be")
                ctx.wait(1.0)
                continue
            self.is_file = stat.S_ISREG(os.fstat(fd).st_mode)
            if failed:
                ctx.log.warning("%s can be opened again: reading", path)
            return fd
        return None

    def _read(self, fd: int, ctx: DriverContext) -> bytes | None:
        """Up to READ_SIZE bytes; b"" at end of file (or when the device failed: it is opened
        again); None if nothing came within 0.25 s."""
        poller = select.poll()
        poller.register(fd, select.POLLIN | select.POLLHUP)
        if not poller.poll(250):
            return None
        try:
            return os.read(fd, READ_SIZE)
        except BlockingIOError:
            return None
        except OSError as exc:
            if exc.errno == errno.EINTR:
                return None
            ctx.error("read", f"cannot read {self.options.device_file}: {exc}")
            ctx.wait(1.0)
            return None if self.is_file else b""

    def _quarantine(self, ctx: DriverContext, partial: bytes, why: str) -> bytes:
        """Keep the bytes of an incomplete record in the buffer's quarantine, with the reason
        (joined to the next writer's bytes they would shift every record after them);
        returns b"", the new incomplete tail."""
        if partial:
            device = self.options.device_file
            reason = f"{len(partial)} bytes of an incomplete {RECORD_SIZE}-byte record: {why}"

            def keep(c: sqlite3.Connection) -> None:
                ctx.buffer.quarantine(c, f"accelerometer {device}", reason, partial)

            ctx.append([], hook=keep)
            ctx.log.warning("quarantined %s (%s)", reason, device)
        return b""

    def _decode(self, data: bytes, batch: ColumnBatch) -> bytes:
        """Add every whole record of `data` to `batch`; return the incomplete tail."""
        whole = len(data) - len(data) % RECORD_SIZE
        sx, sy, sz = self.scales
        for x, y, z, timestamp in RECORD.iter_unpack(data[:whole]):
            batch.add(timestamp, (x * sx, y * sy, z * sz))
        return data[whole:]
