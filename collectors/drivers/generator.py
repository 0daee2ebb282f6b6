"""Generator driver: a synthetic sensor at a chosen rate, numbering every sample.

Each sample carries `Sequence` (0, 1, 2, ... across restarts), its time and a `Value` that is
a pure function of the sequence number (`Sequence * 37 % 1000`), so tests and benchmarks
can check that the stream holds every sample exactly once, in order:

    {"TimestampNanos":[...],"Sequence":[...],"Value":[...],"Sensor":"gen1",
     "RemoteAddr":"host","LastTimestampFormatted":"..."}

Delivery guarantee: **exactly-once**. The next sequence number is stored in the buffer in the
same SQLite commit as the events that used the previous ones, so after a crash the generator
resumes exactly where the buffer ends: a batch lost with the process is generated again with
the same numbers (new timestamps), and nothing stored is generated twice.

Settings: `samples_per_sec` (> 0; a very high rate means "as fast as the buffer takes
them"), `max_samples` (stop after this many in total; default: run forever), `sensor` (the
`Sensor` field; default the instance name).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from collectors.batch import columns_to_events
from collectors.buffer import Appended
from collectors.config import InstanceConfig
from collectors.instance import DriverContext
from collectors.pacing import Pacer
from collectors.settings import SettingsReader
from collectors.state import CursorState

CURSOR = "generator"
CURSOR_VERSION = 1


@dataclass(frozen=True, slots=True)
class Options:
    samples_per_sec: float
    max_samples: int | None
    sensor: str | None


def parse_options(r: SettingsReader) -> Options:
    return Options(
        samples_per_sec=r.number("samples_per_sec", 1000.0, positive=True),
        max_samples=r.integer("max_samples", None, minimum=1) if r.has("max_samples") else None,
        sensor=r.text("sensor", None),
    )


def create(config: InstanceConfig) -> GeneratorDriver:
    return GeneratorDriver(config)


class GeneratorDriver:
    """Synthetic samples, paced per event, numbered from the stored cursor."""

    def __init__(self, config: InstanceConfig) -> None:
        self.config = config
        self.options: Options = config.options
        self.constants = {
            "Sensor": self.options.sensor or config.name,
            "RemoteAddr": config.routing_key or "",
        }

    def run(self, ctx: DriverContext) -> None:
        cursor = ctx.cursor(CURSOR)
        next_seq = int(cursor.value["next_seq"]) if cursor else 0
        per_event = self.config.samples_per_event
        period_ns = 1e9 / self.options.samples_per_sec
        pacer = Pacer(per_event / self.options.samples_per_sec)
        while True:
            count = self._count(next_seq)
            if count <= 0:
                ctx.log.info("generated all %d samples", self.options.max_samples)
                return
            if not pacer.wait(ctx.stop):
                return
            events = self._events(next_seq, count, period_ns)
            state = CursorState(CURSOR, CURSOR_VERSION, {"next_seq": next_seq + count})
            if ctx.append(events, cursor=state) is Appended.STOPPED:
                return
            next_seq += count  # stored, or shed (counted) by the buffer's policy

    def _count(self, next_seq: int) -> int:
        per_event = self.config.samples_per_event
        if self.options.max_samples is None:
            return per_event
        return min(per_event, self.options.max_samples - next_seq)

    def _events(self, first: int, count: int, period_ns: float) -> list:
        end_ns = time.time_ns()
        start_ns = end_ns - int((count - 1) * period_ns)
        sequence = range(first, first + count)
        columns = {
            "TimestampNanos": [start_ns + int(i * period_ns) for i in range(count)],
            "Sequence": list(sequence),
            "Value": [s * 37 % 1000 for s in sequence],
        }
        return columns_to_events(columns, self.constants, self.config.routing_key)
