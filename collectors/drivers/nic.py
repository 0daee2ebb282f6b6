"""NIC driver: Linux network interface counters at up to 1000 samples/s or more.

Reads `/sys/class/net/<interface>/statistics/<name>` for each configured statistic
(default `rx_bytes,tx_bytes`), paced against the monotonic clock (`pacing.Pacer`), and writes
events exactly as the Pravega Sensor Collector's NetworkDriver does:

    {"TimestampNanos":[...],"RxBytes":[...],"TxBytes":[...],"RemoteAddr":"<host>",
     "Interface":"eth0","LastTimestampFormatted":"2020-12-30T21:29:17.809Z"}

Other statistics add arrays named the same way (`rx_packets` -> `RxPackets`). Timestamps
are wall-clock nanoseconds taken right after each wake-up (the reference truncates them to
milliseconds). A counter that cannot be read is logged and that sample is skipped; the
reference would have stored a 0, which is a wrong value, not a missing one.

Delivery guarantee: **exactly-once from the buffer on**; samples of the batch being filled
(under `samples_per_event`) live in memory and die with the process on a crash (a clean
stop buffers them). A counter cannot be read again for a past instant, so nothing better
is possible for them.

Settings: `interface` (required), `statistics`, `samples_per_sec` (> 0, default 10 as in
the reference), `sysfs_root` (default `/sys/class/net`, for containers that mount the
host's /sys elsewhere).
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from collectors.batch import ColumnBatch, camel_case
from collectors.config import InstanceConfig
from collectors.errors import DriverError
from collectors.instance import DriverContext
from collectors.pacing import Handoff, Pacer
from collectors.settings import SettingsReader


@dataclass(frozen=True, slots=True)
class Options:
    interface: str
    statistics: tuple[str, ...]
    samples_per_sec: float
    sysfs_root: Path


def parse_options(r: SettingsReader) -> Options:
    statistics = r.texts("statistics", ("rx_bytes", "tx_bytes"))
    for name in statistics:
        if not name.replace("_", "").isalnum() or len(set(statistics)) != len(statistics):
            r.fail("statistics", "must name distinct counters such as rx_bytes,tx_bytes")
    interface = r.text("interface")
    if "/" in interface or interface in (".", ".."):
        r.fail("interface", "is not an interface name")
    return Options(
        interface=interface,
        statistics=statistics,
        samples_per_sec=r.number("samples_per_sec", 10.0, positive=True),
        sysfs_root=r.path("sysfs_root", "/sys/class/net"),
    )


def create(config: InstanceConfig) -> NicDriver:
    options: Options = config.options
    stats_dir = options.sysfs_root / options.interface / "statistics"
    if not stats_dir.is_dir():
        found = sorted(p.name for p in options.sysfs_root.glob("*")) or ["none"]
        problem = (
            f"network interface {options.interface!r} not found (no {stats_dir}); "
            f"interfaces here: {', '.join(found)}"
        )
        raise DriverError(config.name, "nic", problem)
    for name in options.statistics:
        path = stats_dir / name
        try:
            int(path.read_text())
        except (OSError, ValueError) as exc:
            problem = f"cannot read statistic {name!r} of {options.interface} ({path}): {exc}"
            raise DriverError(config.name, "nic", problem) from None
    return NicDriver(config, stats_dir)


class NicDriver:
    """Samples counters on a monotonic schedule; a helper thread buffers the batches."""

    def __init__(self, config: InstanceConfig, stats_dir: Path) -> None:
        self.config = config
        self.options: Options = config.options
        self.stats_dir = stats_dir
        self.columns = [camel_case(name) for name in self.options.statistics]
        self.constants = {
            "RemoteAddr": config.routing_key or "",
            "Interface": self.options.interface,
        }

    def run(self, ctx: DriverContext) -> None:
        # Other threads (JSON, the sender) hold the GIL in slices of the switch interval;
        # keep a slice well under one sampling period so a wake-up is not held back.
        rate = self.options.samples_per_sec
        sys.setswitchinterval(min(sys.getswitchinterval(), max(1e-4, 0.2 / rate)))
        handoff: Handoff[ColumnBatch] = Handoff(
            lambda batch: ctx.append(batch.take_events(self.config.routing_key)),
            name=f"{self.config.name}-append",
        )
        batch = ColumnBatch(self.columns, self.constants)
        try:
            fds: list[int] | None = self._open()
            while fds is not None:
                error = self._sample(ctx, fds, handoff, batch)
                _close(fds)
                fds = self._wait_for_interface(ctx, error) if error else None
            if len(batch):
                handoff.put(batch)
        finally:
            handoff.close()

    def _open(self) -> list[int]:
        fds: list[int] = []
        try:
            for name in self.options.statistics:
                fds.append(os.open(self.stats_dir / name, os.O_RDONLY))
        except OSError:
            _close(fds)
            raise
        return fds

    def _sample(
        self, ctx: DriverContext, fds: list[int], handoff: Handoff[ColumnBatch], batch: ColumnBatch
    ) -> str | None:
        """Sample until stopped (None) or until the counters cannot be read (the error)."""
        per_event = self.config.samples_per_event
        pacer = Pacer(1.0 / self.options.samples_per_sec)
        missed = 0
        while pacer.wait(ctx.stop):
            now_ns = time.time_ns()
            try:
                values = [int(os.pread(fd, 32, 0)) for fd in fds]
            except (OSError, ValueError) as exc:
                return f"cannot read the counters of {self.options.interface}: {exc}"
            batch.add(now_ns, values)
            if len(batch) >= per_event:
                handoff.put(batch.detach())
            if pacer.missed != missed:
                ctx.error("pace", f"fell behind: {pacer.missed - missed} samples not taken")
                missed = pacer.missed
        return None

    def _wait_for_interface(self, ctx: DriverContext, error: str) -> list[int] | None:
        """The interface went away: say so, and open its counters again once it is back."""
        ctx.error("read", f"{error}; no samples until it is back", every=0.0)
        while ctx.wait(1.0):
            try:
                fds = self._open()
            except OSError:
                continue
            ctx.log.warning("interface %s is back: sampling again", self.options.interface)
            return fds
        return None


def _close(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)
