"""NIC driver: Linux network interface counters, sampled on a steady schedule.

Reads `/sys/class/net/<interface>/statistics/<name>` in a small sampling process
(`collectors/nic_sampler.py`), so the collector's own work never delays a wake-up, and writes
events in the layout of the Pravega Sensor Collector's `NetworkDriver`. An unreadable counter
is reported and not sampled until it can be read again (never a made-up zero).
Delivery guarantee: **at-most-once** into the buffer, exactly-once from it on: the samples of
the batch being filled die with the process on a crash (a clean stop buffers them), because
a counter cannot be read again for a past instant. Details and settings: DRIVERS.md.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from collectors.batch import ColumnBatch, camel_case
from collectors.drivers.base import DriverContext, DriverSettings, OptionsReader
from collectors.errors import DriverError
from collectors.nic_sampler import (
    EXIT_NO_PRIORITY,
    EXIT_UNREADABLE,
    MISSED,
    parse_counter,
    record_format,
)
from pipeline.wording import counted

#: The fastest schedule the sampling process can keep (a wake-up every 100 us); above it
#: every tick would be late and the sampler a busy loop on one core.
MAX_SAMPLES_PER_SEC = 10_000.0
#: A sampling process that has not ended this long after SIGTERM (a counter read that hangs)
#: is killed, so a stop is never held up by it.
STOP_GRACE_SECONDS = 2.0
#: The scheduler slice the sampling process asks for at normal priority, in microseconds, and
#: the range Linux takes (`nic_sampler.request_slice`).
SAMPLER_SLICE_US, SLICE_RANGE_US = 100, (100, 100_000)


@dataclass(frozen=True, slots=True)
class Options:
    interface: str
    statistics: tuple[str, ...]
    samples_per_sec: float
    sysfs_root: Path
    realtime_priority: int
    sampler_slice_us: int


def parse_options(r: OptionsReader) -> Options:
    statistics = r.texts("statistics", ("rx_bytes", "tx_bytes"))
    for name in statistics:
        if not name.replace("_", "").isalnum() or len(set(statistics)) != len(statistics):
            r.fail("statistics", "must name distinct counters such as rx_bytes,tx_bytes")
    interface = r.text("interface")
    if "/" in interface or interface in (".", ".."):
        r.fail("interface", "is not an interface name")
    samples_per_sec = r.number("samples_per_sec", 10.0, positive=True)
    if samples_per_sec > MAX_SAMPLES_PER_SEC:
        problem = f"is more than the sampler can keep up with ({MAX_SAMPLES_PER_SEC:,.0f} a second)"
        r.fail("samples_per_sec", problem, "sample less often")
    return Options(
        interface=interface,
        statistics=statistics,
        samples_per_sec=samples_per_sec,
        sysfs_root=r.path("sysfs_root", "/sys/class/net"),
        realtime_priority=_priority(r),
        sampler_slice_us=_slice(r),
    )


def _priority(r: OptionsReader) -> int:
    priority = r.integer("realtime_priority", 0, minimum=0)
    if priority > 99:
        r.fail("realtime_priority", "must be 0 (off) or a SCHED_FIFO priority from 1 to 99")
    return priority


def _slice(r: OptionsReader) -> int:
    slice_us = r.integer("sampler_slice_us", SAMPLER_SLICE_US, minimum=0)
    low, high = SLICE_RANGE_US
    if slice_us and not low <= slice_us <= high:
        r.fail("sampler_slice_us", f"must be 0 (the kernel's default) or from {low} to {high:_}")
    return slice_us


def create(settings: DriverSettings) -> NicDriver:
    options: Options = settings.options
    stats_dir = options.sysfs_root / options.interface / "statistics"
    if not stats_dir.is_dir():
        found = sorted(p.name for p in options.sysfs_root.glob("*")) or ["none"]
        problem = (
            f"network interface {options.interface!r} not found (no {stats_dir}); "
            f"interfaces here: {', '.join(found)}"
        )
        raise DriverError(settings.name, "nic", problem)
    for name in options.statistics:
        path = stats_dir / name
        try:
            parse_counter(path.read_bytes())
        except (OSError, ValueError) as exc:
            problem = f"cannot read statistic {name!r} of {options.interface} ({path}): {exc}"
            raise DriverError(settings.name, "nic", problem) from None
    return NicDriver(settings, stats_dir)


class NicDriver:
    """Runs the sampling process and batches its records into events."""

    def __init__(self, settings: DriverSettings, stats_dir: Path) -> None:
        self.settings = settings
        self.options: Options = settings.options
        self.stats_dir = stats_dir
        self.priority = self.options.realtime_priority
        self.columns = [camel_case(name) for name in self.options.statistics]
        self.constants = {
            "RemoteAddr": settings.routing_key or "",
            "Interface": self.options.interface,
        }

    def run(self, ctx: DriverContext) -> None:
        batch = ColumnBatch(self.columns, self.constants)
        try:
            while ctx.running:
                error = self._sample(ctx, batch)
                if error is None or not self._wait_for_interface(ctx, error):
                    break
        finally:  # the samples taken so far are buffered even when the sampler failed
            if len(batch):
                ctx.append(batch.take_events(self.settings.routing_key))

    def _sample(self, ctx: DriverContext, batch: ColumnBatch) -> str | None:
        """Run one sampling process until stopped (None) or until a counter cannot be read
        (the reason); `DriverError` when it ends otherwise (the instance restarts the driver
        with backoff)."""
        paths = [str(self.stats_dir / name) for name in self.options.statistics]
        rate, slice_us = self.options.samples_per_sec, self.options.sampler_slice_us
        args = [str(rate), str(self.priority), str(slice_us), *paths]
        process = subprocess.Popen(
            [sys.executable, "-m", "collectors.nic_sampler", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            self._read(ctx, process, batch)
        finally:
            _end(process)
        reason = process.stderr.read().decode(errors="replace").strip()
        if ctx.stop.is_set() or process.returncode == 0:
            return None
        if process.returncode == EXIT_NO_PRIORITY:
            ctx.error("realtime", f"{reason}: sampling at normal priority instead", every=0.0)
            self.priority = 0
            return self._sample(ctx, batch)
        if process.returncode == EXIT_UNREADABLE:
            return f"cannot read the counters of {self.options.interface}: {reason}"
        last_line = reason.splitlines()[-1] if reason else "no message"
        problem = (
            f"the sampling process (collectors/nic_sampler.py) ended with status "
            f"{process.returncode}: {last_line}; restarting it (report this if it repeats)"
        )
        raise DriverError(self.settings.name, "nic", problem)

    def _read(self, ctx: DriverContext, process: subprocess.Popen, batch: ColumnBatch) -> None:
        fmt = record_format(len(self.options.statistics))
        per_event = self.settings.samples_per_event
        fd = process.stdout.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLIN | select.POLLHUP)
        pending = b""
        stopping_since = None
        while True:
            if ctx.stop.is_set() and process.poll() is None:
                stopping_since = stopping_since or time.monotonic()
                if time.monotonic() - stopping_since < STOP_GRACE_SECONDS:
                    process.terminate()  # it exits; we read what it wrote, then EOF
                else:
                    process.kill()  # stuck in a read: what it has not written is lost
            if not poller.poll(250):
                continue
            data = os.read(fd, 1 << 16)
            if not data:
                return
            whole = (len(pending) + len(data)) // fmt.size * fmt.size
            buffer, pending = pending + data, (pending + data)[whole:]
            for timestamp, *values in fmt.iter_unpack(buffer[:whole]):
                if timestamp == MISSED:
                    ctx.error("pace", f"fell behind: {counted(values[0], 'sample')} not taken")
                else:
                    batch.add(timestamp, values)
            while len(batch) >= per_event:
                ctx.append(batch.detach(per_event).take_events(self.settings.routing_key))

    def _wait_for_interface(self, ctx: DriverContext, error: str) -> bool:
        """The interface went away: say so, and go on once its counters can be read again."""
        ctx.error("read", f"{error}; no samples until it is back", every=0.0)
        while ctx.wait(1.0):
            try:
                for name in self.options.statistics:
                    parse_counter((self.stats_dir / name).read_bytes())
            except (OSError, ValueError):
                continue
            ctx.log.warning("interface %s is back: sampling again", self.options.interface)
            return True
        return False


def _end(process: subprocess.Popen) -> None:
    """Stop the sampling process (SIGTERM, then SIGKILL after the grace period) and reap it."""
    if process.poll() is None:
        process.terminate()
    try:
        process.wait(STOP_GRACE_SECONDS)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
