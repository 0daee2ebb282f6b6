"""Accelerometer driver: 16-byte IIO records through a FIFO, scaled by a fake sysfs directory."""

from __future__ import annotations

import os
import re
import struct
import time

import pytest

from collectors.errors import DriverError
from collectors.service import create_driver

from .conftest import read_payloads

SCALES = (0.5, 0.25, 2.0)


@pytest.fixture
def sysfs(tmp_path):
    directory = tmp_path / "iio_device3"
    directory.mkdir()
    for axis, scale in zip("xyz", SCALES, strict=True):
        (directory / f"in_accel_{axis}_scale").write_text(f"{scale}\n")
    return directory


def record(i: int) -> bytes:
    x, y, z = (i % 100) - 50, -(i % 7), i % 120
    return struct.pack("<bbb5xq", x, y, z, 1_700_000_000_000_000_000 + i * 1_000_000)


def accel_config(make_config, fifo, sysfs, **extra):
    table = {
        "driver": "io.pravega.sensor.collector.accelerometer.AccelerometerDriver",
        "stream": "lab/accel",
        "device_file": str(fifo),
        "sysfs_dir": str(sysfs),
        "samples_per_event": 40,
        "routing_key": "edge-3",
    } | extra
    return make_config({"accel": table})


def write_fifo(path, data: bytes, pieces: int) -> None:
    """One writer session: open, write `data` in `pieces` (splitting records), close."""
    fd = os.open(path, os.O_WRONLY)
    try:
        step = max(1, len(data) // pieces)
        for start in range(0, len(data), step):
            os.write(fd, data[start : start + step])
            time.sleep(0.01)
    finally:
        os.close(fd)


def test_records_from_a_fifo_are_scaled_and_batched(make_config, service, store_dir, fifo, sysfs):
    config = accel_config(make_config, fifo, sysfs)
    running = service(config)
    first = b"".join(record(i) for i in range(100))
    second = b"".join(record(i) for i in range(100, 250))
    write_fifo(fifo, first, pieces=7)  # 7 pieces: records split across writes
    time.sleep(0.3)
    write_fifo(fifo, second, pieces=3)  # a new writer after the first one left
    time.sleep(0.5)
    assert running.stop() == 0
    payloads = read_payloads(store_dir, "lab/accel")
    assert list(payloads[0]) == [
        "TimestampNanos",
        "X",
        "Y",
        "Z",
        "RemoteAddr",
        "LastTimestampFormatted",
    ]
    assert payloads[0]["RemoteAddr"] == "edge-3"
    assert len(payloads[0]["X"]) == 40
    times = [t for p in payloads for t in p["TimestampNanos"]]
    assert times == [1_700_000_000_000_000_000 + i * 1_000_000 for i in range(250)]
    xs = [x for p in payloads for x in p["X"]]
    ys = [y for p in payloads for y in p["Y"]]
    zs = [z for p in payloads for z in p["Z"]]
    assert xs == [((i % 100) - 50) * 0.5 for i in range(250)]
    assert ys == [-(i % 7) * 0.25 for i in range(250)]
    assert zs == [(i % 120) * 2.0 for i in range(250)]


def test_a_missing_scale_or_device_is_a_clear_start_up_error(make_config, fifo, sysfs, tmp_path):
    (sysfs / "in_accel_y_scale").unlink()
    config = accel_config(make_config, fifo, sysfs)
    with pytest.raises(DriverError, match=re.escape("cannot read the y scale from")):
        create_driver(config.instances[0])
    (sysfs / "in_accel_y_scale").write_text("1.0\n")
    config = accel_config(make_config, tmp_path / "nope", sysfs)
    with pytest.raises(DriverError, match=re.escape("device file")):
        create_driver(config.instances[0])
