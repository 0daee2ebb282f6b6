"""Generator driver: a synthetic sensor at a chosen rate, numbering every sample.

`Sequence` counts 0, 1, 2, ... across restarts and `Value` is a pure function of it, so tests
and benchmarks can check that the stream holds every sample once, in order. Delivery
guarantee: **exactly-once**: the next sequence number is stored in the same SQLite commit as
the events that used the previous ones, so after a crash the generator resumes where the
buffer ends (a lost batch is generated again with the same numbers; nothing stored is
generated twice). Details and settings: DRIVERS.md next to this file.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass

from collectors.batch import columns_to_events
from collectors.drivers.base import (
    Appended,
    CursorState,
    DriverContext,
    DriverSettings,
    OptionsReader,
)
from collectors.errors import CURSOR_HINT, MOVE_ASIDE_COST, CursorUnreadable
from pipeline.wording import counted

CURSOR = "generator"
CURSOR_VERSION = 1
#: When behind, this many events go into one SQLite commit (one fsync, not one per event)...
EVENTS_PER_COMMIT = 128
#: ... and at most this many samples (one event when it is larger): a commit's samples are
#: built in memory first, and up to three commits are held at once.
SAMPLES_PER_COMMIT = 128_000
#: A higher rate is "as fast as the buffer takes them": one sample a nanosecond is already
#: beyond any machine (and a rate near the float limit would overflow the schedule).
FASTEST = 1e9
#: The longest single wait for the next event (a slow rate is waited for in steps; one timed
#: wait over about 292 years overflows).
LONGEST_WAIT = 60.0
#: The longest interval between two samples' timestamps, in ns (a year).
LONGEST_PERIOD_NS = 365 * 86_400 * 10**9


@dataclass(frozen=True, slots=True)
class Options:
    samples_per_sec: float
    max_samples: int | None
    sensor: str | None


def parse_options(r: OptionsReader) -> Options:
    return Options(
        samples_per_sec=r.number("samples_per_sec", 1000.0, positive=True),
        max_samples=r.integer("max_samples", None, minimum=1) if r.has("max_samples") else None,
        sensor=r.text("sensor", None),
    )


def create(settings: DriverSettings) -> GeneratorDriver:
    return GeneratorDriver(settings)


class GeneratorDriver:
    """Synthetic samples, paced per event, numbered from the stored cursor."""

    def __init__(self, settings: DriverSettings) -> None:
        self.settings = settings
        self.options: Options = settings.options
        self.events_per_commit = EVENTS_PER_COMMIT
        self.constants = {
            "Sensor": self.options.sensor or settings.name,
            "RemoteAddr": settings.routing_key or "",
        }

    def run(self, ctx: DriverContext) -> None:
        appender = _Appender(ctx)
        try:
            self._generate(ctx, appender)
        finally:
            appender.close()

    def _generate(self, ctx: DriverContext, appender: _Appender) -> None:
        next_seq = _resume_at(ctx)
        rate = min(self.options.samples_per_sec, FASTEST)
        schedule = _Schedule(rate, next_seq)
        per_event = self.settings.samples_per_event
        self.events_per_commit = max(
            1, min(EVENTS_PER_COMMIT, ctx.buffer.capacity_events, SAMPLES_PER_COMMIT // per_event)
        )
        burst = per_event * self.events_per_commit
        period = max(1, round(min(1e9 / rate, LONGEST_PERIOD_NS)))  # whole nanoseconds
        while appender.running and ctx.running:  # at any rate: a stop is never starved
            if schedule.due() - next_seq > max(rate, burst):
                schedule.restart(next_seq + burst)  # a stall: do not owe more than one burst
            count = self._count(next_seq, schedule.due() - next_seq)
            if count is None:
                ctx.log.info("generated all %s", counted(self.options.max_samples, "sample"))
                return
            if count == 0:  # not a whole event due yet (nor the last samples of max_samples)
                wanted = next_seq + per_event
                if self.options.max_samples is not None:
                    wanted = min(wanted, self.options.max_samples)
                wait = min(schedule.seconds_until(wanted), LONGEST_WAIT)
                if not ctx.wait(wait):
                    return
                continue
            events = [
                event
                for first in range(next_seq, next_seq + count, per_event)
                for event in self._events(first, min(per_event, next_seq + count - first), period)
            ]
            next_seq += count
            appender.put(events, CursorState(CURSOR, CURSOR_VERSION, {"next_seq": next_seq}))

    def _count(self, next_seq: int, due: int) -> int | None:
        """Samples to generate now: whole events that are due, at most `events_per_commit` of
        them (the last may be partial when `max_samples` ends mid-event); None when done."""
        per_event = self.settings.samples_per_event
        left = None if self.options.max_samples is None else self.options.max_samples - next_seq
        if left is not None and left <= 0:
            return None
        whole = min(due // per_event, self.events_per_commit) * per_event
        if left is not None and left <= min(due, per_event * self.events_per_commit):
            return left
        return whole

    def _events(self, first: int, count: int, period_ns: int) -> list:
        end_ns = time.time_ns()
        start_ns = end_ns - (count - 1) * period_ns
        sequence = range(first, first + count)
        columns = {
            "TimestampNanos": list(range(start_ns, end_ns + 1, period_ns)),
            "Sequence": list(sequence),
            "Value": [s * 37 % 1000 for s in sequence],
        }
        return columns_to_events(columns, self.constants, self.settings.routing_key)


def _resume_at(ctx: DriverContext) -> int:
    """The next sequence number, from the stored cursor (0 when there is none). A cursor of
    another version, or without a whole `next_seq` of 0 or more, is refused: numbering
    from a guess would send numbers the stream already holds, or skip some."""
    cursor = ctx.cursor(CURSOR)
    if cursor is None:
        return 0
    where = ctx.settings.buffer_file
    if cursor.version != CURSOR_VERSION:
        problem = f"has version {cursor.version}, this collector reads version {CURSOR_VERSION}"
        hint = "run the collector that wrote it (a newer one), or move the buffer aside"
        raise CursorUnreadable(where, CURSOR, problem, f"{hint}: {MOVE_ASIDE_COST}")
    next_seq = cursor.value.get("next_seq")
    if isinstance(next_seq, bool) or not isinstance(next_seq, int) or next_seq < 0:
        problem = f"has no usable next_seq ({cursor.value!r:.200}: a whole number >= 0 is needed)"
        raise CursorUnreadable(where, CURSOR, problem, CURSOR_HINT)
    return next_seq


class _Schedule:
    """Sample k is due at `start + k / rate` on the monotonic clock. After a stall of more
    than a second the schedule starts again from now, rather than owing a burst."""

    def __init__(self, rate: float, first: int) -> None:
        self.rate = rate
        self.start = time.monotonic()
        self.first = first

    def due(self) -> int:
        """How many samples should exist by now (counting from sequence 0)."""
        return self.first + int((time.monotonic() - self.start) * self.rate)

    def restart(self, due_now: int) -> None:
        self.start, self.first = time.monotonic(), due_now

    def seconds_until(self, count: int) -> float:
        return max(0.0, self.start + (count - self.first) / self.rate - time.monotonic())


class _Appender:
    """Appends batches in order on a second thread while the next one is generated: SQLite
    releases the GIL while it writes and fsyncs, so the two overlap. At most two batches
    wait; a batch lost with the process is generated again from the stored cursor."""

    def __init__(self, ctx: DriverContext) -> None:
        self.ctx = ctx
        self.queue: queue.Queue = queue.Queue(maxsize=2)
        self.running = True
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name=f"{ctx.settings.name}-append")
        self.thread.start()

    def put(self, events: list, cursor: CursorState) -> None:
        self.queue.put((events, cursor))
        if self.error is not None:
            raise self.error

    def close(self) -> None:
        self.queue.put(None)
        self.thread.join()
        if self.error is not None:
            raise self.error

    def _run(self) -> None:
        while (item := self.queue.get()) is not None:
            if not self.running:
                continue  # stopping: what is left is generated again after a restart
            try:
                if self.ctx.append(*item) is Appended.STOPPED:
                    self.running = False
            except BaseException as exc:  # re-raised in the generating thread
                self.error, self.running = exc, False
