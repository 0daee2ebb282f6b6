"""Accelerometer driver at the edges: nonsense scales, a device that is not a device, a writer
that leaves in the middle of a record, a device that goes away and comes back."""

from __future__ import annotations

import os
import re
import time

import pytest

from collectors.buffer import Buffer
from collectors.errors import DriverError
from collectors.service import create_driver

from .conftest import read_payloads, wait_for
from .test_accelerometer import accel_config, record, write_fifo


@pytest.fixture
def sysfs(tmp_path):
    directory = tmp_path / "iio_device3"
    directory.mkdir()
    for axis in "xyz":
        (directory / f"in_accel_{axis}_scale").write_text("0.5\n")
    return directory


def times(store_dir) -> list[int]:
    return [t for p in read_payloads(store_dir, "lab/accel") for t in p["TimestampNanos"]]


def stamp(i: int) -> int:
    return 1_700_000_000_000_000_000 + i * 1_000_000


@pytest.mark.parametrize("text", ["nan\n", "inf\n", "-inf\n", "0\n", "-0.5\n", "1e999\n"])
def test_a_scale_that_is_not_a_finite_positive_number_is_refused(make_config, fifo, sysfs, text):
    # NaN or infinity made every sample null in the JSON (msgspec writes them as null)
    (sysfs / "in_accel_z_scale").write_text(text)
    config = accel_config(make_config, fifo, sysfs)
    with pytest.raises(
        DriverError,
        match=re.escape(f"the z scale in {sysfs / 'in_accel_z_scale'} is "),
    ) as caught:
        create_driver(config.instances[0])
    assert "not a finite number greater than 0: point sysfs_dir at" in str(caught.value)


def test_a_directory_as_the_device_is_refused(make_config, sysfs, tmp_path):
    # a directory opens, then every read failed with EISDIR, once a second, for ever
    config = accel_config(make_config, tmp_path, sysfs)
    with pytest.raises(
        DriverError,
        match=re.escape(f"device file {tmp_path} is not a character device, a FIFO or a file"),
    ):
        create_driver(config.instances[0])


def test_an_incomplete_record_of_a_writer_that_left_is_quarantined(
    make_config, service, store_dir, fifo, sysfs
):
    # The first writer dies 7 bytes into a record. Those bytes were joined to the next
    # writer's, shifting every one of its records by 7 bytes: garbage values, silently.
    config = accel_config(make_config, fifo, sysfs, samples_per_event=10)
    running = service(config)
    torn = record(20)[:7]
    write_fifo(fifo, b"".join(record(i) for i in range(20)) + torn, pieces=3)
    time.sleep(0.3)
    write_fifo(fifo, b"".join(record(i) for i in range(30, 50)), pieces=2)
    wait_for(lambda: len(times(store_dir)) >= 40, timeout=15)
    assert running.stop() == 0
    assert times(store_dir) == [stamp(i) for i in [*range(20), *range(30, 50)]]
    buffer = Buffer(config.instances[0].buffer_file, 10)
    rows = buffer.conn.execute("SELECT source, reason, payload FROM quarantine").fetchall()
    buffer.close()
    assert rows == [
        (
            f"accelerometer {fifo}",
            "7 bytes of an incomplete 16-byte record: "
            "the stream ended (a writer left, or the device failed)",
            torn,
        )
    ]


def test_a_device_that_goes_away_and_comes_back_loses_nothing_read(
    make_config, service, store_dir, fifo, sysfs
):
    # The FIFO (or a USB device node) vanished: reopening it raised, the records read but
    # not yet a whole event were lost with the traceback, and the driver restarted.
    config = accel_config(make_config, fifo, sysfs, samples_per_event=40)
    running = service(config)
    write_fifo(fifo, b"".join(record(i) for i in range(10)), pieces=1)  # < one event
    fifo.unlink()
    buffer = Buffer(config.instances[0].buffer_file, 10)

    def open_errors() -> list[str]:
        query = "SELECT message FROM errors WHERE source = 'accelerometer.open'"
        return [m for (m,) in buffer.conn.execute(query)]

    wait_for(lambda: bool(open_errors()), timeout=15)
    os.mkfifo(fifo)
    write_fifo(fifo, b"".join(record(i) for i in range(10, 20)), pieces=1)
    time.sleep(0.5)
    assert running.stop() == 0
    assert times(store_dir) == [stamp(i) for i in range(20)]
    assert open_errors()[0].startswith(f"cannot open {fifo}: [Errno 2] No such file")
    assert open_errors()[0].endswith("; no samples until it can be")
    assert buffer.conn.execute("SELECT count(*) FROM errors").fetchone() == (1,)
    buffer.close()
