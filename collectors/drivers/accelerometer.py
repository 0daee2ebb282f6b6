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
import os
import select
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
    scales = []
    for axis in AXES:
        path = options.sysfs_dir / f"in_accel_{axis}_scale"
        try:
            scales.append(float(path.read_text().split()[0]))
        except (OSError, ValueError, IndexError) as exc:
            problem = f"cannot read the {axis} scale from {path}: {exc}"
            raise DriverError(settings.name, "accelerometer", problem) from None
    if not options.device_file.exists():
        problem = f"device file {options.device_file} does not exist"
        raise DriverError(settings.name, "accelerometer", problem)
    return AccelerometerDriver(settings, tuple(scales))


class AccelerometerDriver:
    """Reads 16-byte IIO records, scales them, batches them into events."""

    def __init__(self, settings: DriverSettings, scales: tuple[float, ...]) -> None:
        self.settings = settings
        self.options: Options = settings.options
        self.scales = scales
        self.is_fifo = stat.S_ISFIFO(os.stat(self.options.device_file).st_mode)
        self.constants = {"RemoteAddr": settings.routing_key or ""}

    def run(self, ctx: DriverContext) -> None:
        batch = ColumnBatch(("X", "Y", "Z"), self.constants)
        partial = b""
        fd = self._open()
        try:
            while ctx.running:
                data = self._read(fd, ctx)
                if data is None:
                    continue
                if not data:  # end of file: the FIFO's writer left, or a file ended
                    fd = self._after_eof(fd, ctx)
                    continue
                partial = self._decode(partial + data, batch)
                while len(batch) >= self.settings.samples_per_event:
                    taken = batch.detach(self.settings.samples_per_event)
                    ctx.append(taken.take_events(self.settings.routing_key))
        finally:
            os.close(fd)
        if len(batch):
            ctx.append(batch.take_events(self.settings.routing_key))
        if partial:
            ctx.log.warning("stopped with %d bytes of an incomplete record", len(partial))

    def _open(self) -> int:
        return os.open(self.options.device_file, os.O_RDONLY | os.O_NONBLOCK)

    def _read(self, fd: int, ctx: DriverContext) -> bytes | None:
        """Up to READ_SIZE bytes; b"" at end of file; None if nothing came within 0.25 s."""
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
            return None

    def _after_eof(self, fd: int, ctx: DriverContext) -> int:
        ctx.wait(0.05)
        if not self.is_fifo:
            return fd
        os.close(fd)
        return self._open()

    def _decode(self, data: bytes, batch: ColumnBatch) -> bytes:
        """Add every whole record of `data` to `batch`; return the incomplete tail."""
        whole = len(data) - len(data) % RECORD_SIZE
        sx, sy, sz = self.scales
        for x, y, z, timestamp in RECORD.iter_unpack(data[:whole]):
            batch.add(timestamp, (x * sx, y * sy, z * sz))
        return data[whole:]
