"""The values the stream-store API takes and returns, and the checks its arguments pass.

Events and event batches as read back, stream and segment info, retention and scaling policies,
the reports of `verify` and `repair`, a transaction's states, and the limits every backend
holds (event size, segments, leases, retention). Each `check_*` function returns its argument
if it is acceptable, else raises a typed error before a backend acts on it. The interfaces that
pass these values are in `api.py`.
"""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Literal

from pipeline.streams.cut import StreamCut
from pipeline.streams.errors import (
    EventTooLarge,
    InvalidArgument,
    SegmentNotActive,
    StreamSealed,
)
from pipeline.streams.names import check_routing_key

MAX_EVENT_SIZE = 8 * 1024 * 1024
#: Long enough for weeks without network: an open transaction lives this long by default.
#: 30 days is also the longest lease a Pravega controller grants.
DEFAULT_TXN_LEASE_SECONDS = 30 * 24 * 3600
#: The longest lease a transaction may ask for (ten years): far beyond any outage, and its
#: expiry, in nanoseconds, stays inside 64 bits.
MAX_TXN_LEASE_SECONDS = 10 * 365 * 86_400


def check_time_bounds(bounds: tuple[int, int] | None) -> tuple[int, int] | None:
    """`bounds`, a commit's (min, max) event time in ns, if it is one: two whole numbers of
    64-bit nanoseconds, the min first; else `InvalidArgument` (bounds given max-first hid the
    transaction's events from a time window between them)."""
    if bounds is None:
        return None
    try:
        low, high = (operator.index(b) for b in bounds if not isinstance(b, bool))
    except (TypeError, ValueError):  # not two whole numbers (numpy's ints are whole numbers)
        low, high = 1, 0
    if not -(2**63) < low <= high < 2**63:
        rule = "(min_ns, max_ns): two whole numbers of 64-bit nanoseconds, the smaller first"
        raise InvalidArgument(name="time_bounds", value=bounds, rule=rule)
    return int(low), int(high)


def check_lease(lease_seconds: float) -> float:
    """`lease_seconds` if a transaction can be leased for that long, else `InvalidArgument`
    (NaN, zero or less, past `MAX_TXN_LEASE_SECONDS`): refused when it begins, not a
    transaction aborted at its commit, or an overflow."""
    if not 0 < lease_seconds <= MAX_TXN_LEASE_SECONDS:  # NaN fails both comparisons
        rule = f"a transaction's lease is more than 0 and at most {MAX_TXN_LEASE_SECONDS:,} s"
        raise InvalidArgument(name="lease_seconds", value=lease_seconds, rule=rule)
    return lease_seconds


def check_event(payload: bytes, routing_key: str | None) -> bytes:
    """The payload as bytes, if it and its routing key are acceptable; else a typed error."""
    if not isinstance(payload, bytes | bytearray | memoryview):
        msg = f"an event payload is bytes, not {type(payload).__name__}"
        raise TypeError(msg)
    if len(payload) > MAX_EVENT_SIZE:
        raise EventTooLarge(len(payload), MAX_EVENT_SIZE)
    check_routing_key(routing_key)
    return bytes(payload)


def check_count(name: str, value: object, minimum: int, rule: str) -> int:
    """`value` if it is a whole number (not a bool) of at least `minimum`, else
    `InvalidArgument(name, value, rule)`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidArgument(name, value, rule)
    return value


def check_positive(name: str, value: object, rule: str) -> float:
    """`value` if it is a finite number above 0, else `InvalidArgument(name, value, rule)`."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise InvalidArgument(name, value, rule)
    return value


TxnState = Literal["open", "committing", "committed", "aborted"]


@dataclass(frozen=True, slots=True)
class Event:
    """One event as read back: its position, routing key, payload and ingest time.

    `offset` is the position from which a read yields this event; `end_offset` the position
    right after it. Both are event boundaries, usable in a `StreamCut`.
    """

    stream: str
    segment: int
    offset: int
    end_offset: int
    routing_key: str | None
    payload: bytes
    ingest_time_ns: int


@dataclass(frozen=True, slots=True)
class EventBatch:
    """Consecutive events of one segment read together, as columns: event `i` is at
    `offsets[i]`, ends at `end_offsets[i]`, and its payload is `data[starts[i]:ends[i]]`.

    The payloads are slices of one read-only buffer, so a reader that hands them on as a whole
    (an Arrow column, a file) copies nothing per event; `payload(i)` is a view, `events()`
    makes the `Event`s (each payload copied). Every event was checked as `read` checks it.
    """

    stream: str
    segment: int
    data: bytes | memoryview
    offsets: list[int]
    end_offsets: list[int]
    routing_keys: list[str | None]
    starts: list[int]
    ends: list[int]
    ingest_times_ns: list[int]

    def __len__(self) -> int:
        return len(self.offsets)

    def payload(self, i: int) -> memoryview:
        return memoryview(self.data)[self.starts[i] : self.ends[i]]

    @property
    def nbytes(self) -> int:
        """The payload bytes of the batch."""
        return sum(self.ends) - sum(self.starts)

    def events(self) -> Iterator[Event]:
        columns = zip(
            self.offsets,
            self.end_offsets,
            self.routing_keys,
            self.starts,
            self.ends,
            self.ingest_times_ns,
            strict=True,
        )
        data = self.data
        whole = isinstance(data, bytes)  # (a whole bytes object is not copied)
        for offset, end, key, at, until, ns in columns:
            payload = data[at:until] if whole else bytes(data[at:until])
            yield Event(self.stream, self.segment, offset, end, key, payload, ns)

    @classmethod
    def of(cls, stream: str, segment: int, events: list[Event]) -> EventBatch:
        """A batch of events read one by one (their payloads joined into one buffer)."""
        ends = list(itertools.accumulate(len(e.payload) for e in events))
        return cls(
            stream,
            segment,
            b"".join(e.payload for e in events),
            [e.offset for e in events],
            [e.end_offset for e in events],
            [e.routing_key for e in events],
            [0, *ends[:-1]],
            ends,
            [e.ingest_time_ns for e in events],
        )


@dataclass(frozen=True, slots=True)
class Retention:
    """Keep at most `max_bytes` (whole stream) and nothing older than `max_age_seconds`."""

    max_bytes: int | None = None
    max_age_seconds: float | None = None


#: The most active segments a stream has, when created and after a scale (as Pravega allows).
MAX_SEGMENTS = 1024


def check_segments(segments: object) -> int:
    """`segments` if a stream can be created with that many, else `InvalidArgument`."""
    name, rule = "number of segments", f"a stream has 1 to {MAX_SEGMENTS} segments"
    if check_count(name, segments, 1, rule) > MAX_SEGMENTS:
        raise InvalidArgument(name, segments, rule)
    return segments  # type: ignore[return-value]


#: The largest retention limits: a byte count and an age in nanoseconds are signed 64-bit
#: integers where they are stored and compared (an age of 292 years).
MAX_RETENTION_BYTES = 2**63 - 1
MAX_RETENTION_SECONDS = (2**63 - 1) // 10**9


def check_retention(retention: Retention) -> Retention:
    """`retention` if each limit it sets is positive and fits; else `InvalidArgument`. Checked
    when a stream is created, and before a recorded policy is applied (one an earlier Sluice
    accepted is refused, never applied: it would drop everything, or could not be computed)."""
    if (max_bytes := retention.max_bytes) is not None:
        name = "retention max_bytes"
        rule = "keep a positive whole number of bytes, or set no byte limit"
        if check_count(name, max_bytes, 1, rule) > MAX_RETENTION_BYTES:
            rule = f"keep at most {MAX_RETENTION_BYTES:,} bytes, or set no byte limit"
            raise InvalidArgument(name, max_bytes, rule)
    if (max_age := retention.max_age_seconds) is not None:
        name = "retention max_age_seconds"
        rule = "keep events for a positive number of seconds, or set no age limit"
        if check_positive(name, max_age, rule) > MAX_RETENTION_SECONDS:
            rule = (
                f"keep events for at most {MAX_RETENTION_SECONDS:,} seconds (292 years),"
                " or set no age limit"
            )
            raise InvalidArgument(name, max_age, rule)
    return retention


@dataclass(frozen=True, slots=True)
class ScalingPolicy:
    """Pravega-style auto-scaling: split a segment whose rate exceeds `target` per second
    (events, or KiB when `kind` is "kbytes_per_second") into `scale_factor` parts; merge two
    neighbours that together stay under half the target. Never fewer than `min_segments`."""

    kind: Literal["events_per_second", "kbytes_per_second"]
    target: float
    scale_factor: int = 2
    min_segments: int = 1

    def __post_init__(self) -> None:
        if self.kind not in ("events_per_second", "kbytes_per_second"):
            rule = "events_per_second or kbytes_per_second"
            raise InvalidArgument(name="scaling kind", value=self.kind, rule=rule)
        check_positive("scaling target", self.target, "a rate above 0 per second")
        check_count("scale_factor", self.scale_factor, 2, "a split makes 2 or more segments")
        check_count("min_segments", self.min_segments, 1, "a stream keeps 1 or more segments")


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    segment: int
    key_range: tuple[float, float]
    sealed: bool
    head: int
    tail: int
    events: int
    bytes: int
    #: (offset, problem) where a read or a write found the segment damaged: it takes no writes
    #: until `repair`. None when it is not marked (`verify` reports damage, it marks none; a
    #: backend may mark none at all).
    damaged: tuple[int, str] | None = None


@dataclass(frozen=True, slots=True)
class StreamInfo:
    scope: str
    stream: str
    sealed: bool
    head: StreamCut
    tail: StreamCut
    segments: tuple[SegmentInfo, ...]
    retention: Retention = field(default_factory=Retention)

    @property
    def events(self) -> int:
        return sum(s.events for s in self.segments)

    def active_segment(self, number: int) -> SegmentInfo:
        """Segment `number`, if it takes writes; else `SegmentNotActive` (`StreamSealed` when
        the whole stream is sealed)."""
        if self.sealed:
            raise StreamSealed(self.scope, self.stream)
        active = [s for s in self.segments if not s.sealed]
        for s in active:
            if s.segment == number:
                return s
        stream = f"{self.scope}/{self.stream}"
        raise SegmentNotActive(stream, number, [s.segment for s in active])

    def segment(self, number: int) -> SegmentInfo:
        for s in self.segments:
            if s.segment == number:
                return s
        from pipeline.streams.errors import InvalidCut

        msg = f"{self.scope}/{self.stream} has no segment {number}"
        raise InvalidCut(text=str(number), reason=msg)

    @property
    def bytes(self) -> int:
        return sum(s.bytes for s in self.segments)

    def as_dict(self) -> dict:
        return {
            "stream": f"{self.scope}/{self.stream}",
            "sealed": self.sealed,
            "head": self.head.text,
            "tail": self.tail.text,
            "events": self.events,
            "bytes": self.bytes,
            "retention": {
                "max_bytes": self.retention.max_bytes,
                "max_age_seconds": self.retention.max_age_seconds,
            },
            "segments": [
                {
                    "segment": s.segment,
                    "key_range": list(s.key_range),
                    "sealed": s.sealed,
                    "head": s.head,
                    "tail": s.tail,
                    "events": s.events,
                    "bytes": s.bytes,
                    "damaged": (
                        None
                        if s.damaged is None
                        else {"offset": s.damaged[0], "problem": s.damaged[1]}
                    ),
                }
                for s in self.segments
            ],
        }


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing `verify` found wrong, or `repair` fixed or could not fix: where, and what.

    `stream` is None for the store as a whole (its catalog); `segment` and `offset` are None
    when the problem is not at one place in a segment. `fixable`: `repair` can fix it without
    guessing (rebuild the index or the catalog, cut a torn tail).
    """

    stream: str | None
    segment: int | None
    offset: int | None
    what: str
    fixable: bool = False

    def __str__(self) -> str:
        where = [self.stream or "store"]
        if self.segment is not None:
            where.append(f"segment {self.segment}")
        if self.offset is not None:
            where.append(f"offset {self.offset}")
        return f"{' '.join(where)}: {self.what}"


#: A progress callback: (bytes checked so far, bytes to check in all).
Progress = Callable[[int, int], None]


@dataclass(frozen=True, slots=True)
class VerifyReport:
    """What `verify` checked and every problem it found (none: the store is intact)."""

    problems: tuple[Problem, ...]
    streams: int
    segments: int
    blocks: int
    bytes: int

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass(frozen=True, slots=True)
class RepairReport:
    """What `repair` fixed (each `what` says how) and what it could not fix without guessing."""

    fixed: tuple[Problem, ...]
    unfixed: tuple[Problem, ...]

    @property
    def ok(self) -> bool:
        return not self.unfixed
