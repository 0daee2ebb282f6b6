"""The stream-store interface every backend implements.

Streams are named `scope/stream`. A stream has one or more segments; a routing key hashes to
one segment, so events with one key are read in the order they were written. Positions are
`StreamCut`s. Semantics every backend holds are listed in docs/architecture.md ("The stream
store") and checked by `tests/streams/test_contract.py` against each backend.
"""

from __future__ import annotations

import itertools
import math
import operator
from abc import ABC, abstractmethod
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


#: What a backend can do beyond the common core; the contract suite skips what is missing.
Feature = Literal[
    "multi_segment",  # read, cut and route over several segments
    "writer_ids",  # idempotent writers (writer id + event numbers)
    "txn_flush",  # a transaction's events are durable before commit
    "time_cuts",  # cuts from commit-time event-time bounds
    "reader_groups",
    "scaling",
]
ALL_FEATURES: frozenset[Feature] = frozenset(Feature.__args__)  # type: ignore[attr-defined]


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


class EventWriter(ABC):
    """Appends events to one stream.

    `write` buffers; `flush` returns once every buffered event is durable (fsynced). With a
    `writer_id`, each event carries an event number (given, or one more than the last), and the
    store drops an event whose number is not above the last it stored for that writer in that
    segment: resending after a lost acknowledgement is a no-op. Exactly-once for a writer that
    resends with the same id and numbers; at-least-once without a writer id.
    """

    writer_id: str | None

    @abstractmethod
    def write(
        self, payload: bytes, routing_key: str | None = None, event_number: int | None = None
    ) -> None: ...

    @abstractmethod
    def flush(self) -> None: ...

    @abstractmethod
    def last_event_number(self) -> int:
        """The highest event number this writer id has stored (0 if none)."""

    def close(self) -> None:
        self.flush()

    def __enter__(self) -> EventWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.close()


class Transaction(ABC):
    """Events that become visible together, contiguously in each segment, or not at all.

    `flush` makes the written events durable in the transaction (they survive a crash);
    `commit` appends them to the stream. A transaction id outlives the process:
    `store.get_transaction(stream, txn_id).commit()` after a restart commits it or finds it
    committed. Committing twice is not an error; committing an aborted one raises `TxnFailed`.
    """

    txn_id: str
    stream: str

    @abstractmethod
    def write(self, payload: bytes, routing_key: str | None = None) -> None: ...

    @abstractmethod
    def flush(self) -> None: ...

    @abstractmethod
    def commit(self, time_bounds: tuple[int, int] | None = None) -> None:
        """Commit; `time_bounds` = (min, max) event time in ns of its events, if known."""

    @abstractmethod
    def abort(self) -> None: ...

    @abstractmethod
    def state(self) -> TxnState: ...


class EventReader(ABC):
    """One member of a reader group: reads the segments the group assigned to it.

    Positions are persisted by `commit()` (and by `close()`): events read but not committed
    are read again by whoever owns the segment next (at-least-once, exactly-once when the
    consumer commits its own output and the reader position together). A reader whose
    segments went to others (see `ReaderGroup.reader_offline`) gets `ReaderOffline`.
    """

    reader_id: str

    @abstractmethod
    def read(self, max_events: int = 1000, timeout: float = 0.0) -> list[Event]:
        """Up to `max_events` (1 or more) events of this reader's segments, waiting up to
        `timeout` seconds (0 or more) for one; per routing key in order."""

    @abstractmethod
    def commit(self) -> None: ...

    @abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> EventReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ReaderGroup(ABC):
    """A named, persistent set of positions over one stream, shared by several readers.

    A reader that stops without `close()` (its process killed) holds its segments until
    `reader_offline(its id)` is called, a new reader with its id joins, or (embedded store)
    it has not read for `READER_TIMEOUT_S`; its next owners read them from the committed
    positions, so nothing it did not commit is lost."""

    name: str
    stream: str

    @abstractmethod
    def reader(self, reader_id: str) -> EventReader:
        """Join the group as `reader_id`, replacing a reader of that id already in it."""

    @abstractmethod
    def reader_offline(self, reader_id: str) -> None:
        """Take `reader_id` out of the group (a reader whose process died): its segments go to
        the other readers at their committed positions."""

    @abstractmethod
    def stream_cut(self) -> StreamCut:
        """The group's committed position as a cut."""

    @abstractmethod
    def checkpoint(self, name: str) -> StreamCut:
        """Record the committed position under `name` and return it."""

    @abstractmethod
    def reset(self, cut: StreamCut) -> None: ...


class StreamStore(ABC):
    """Scopes, streams, writers, transactions, readers, cuts, truncation and retention."""

    uri: str
    features: frozenset[Feature] = ALL_FEATURES

    # --- scopes and streams -------------------------------------------------------------
    @abstractmethod
    def create_scope(self, scope: str) -> bool:
        """Create a scope; False if it existed."""

    @abstractmethod
    def list_scopes(self) -> list[str]: ...

    @abstractmethod
    def create_stream(
        self, stream: str, segments: int = 1, retention: Retention | None = None
    ) -> bool:
        """Create `scope/stream` (and its scope); False if it existed."""

    @abstractmethod
    def list_streams(self, scope: str | None = None) -> list[str]: ...

    @abstractmethod
    def stream_exists(self, stream: str) -> bool: ...

    @abstractmethod
    def info(self, stream: str) -> StreamInfo: ...

    @abstractmethod
    def seal_stream(self, stream: str) -> None: ...

    @abstractmethod
    def delete_stream(self, stream: str) -> None: ...

    # --- writing ------------------------------------------------------------------------
    @abstractmethod
    def writer(self, stream: str, writer_id: str | None = None) -> EventWriter: ...

    @abstractmethod
    def begin_transaction(
        self, stream: str, lease_seconds: float = DEFAULT_TXN_LEASE_SECONDS
    ) -> Transaction: ...

    @abstractmethod
    def get_transaction(self, stream: str, txn_id: str) -> Transaction: ...

    # --- cuts and reading ---------------------------------------------------------------
    @abstractmethod
    def head(self, stream: str) -> StreamCut: ...

    @abstractmethod
    def tail(self, stream: str) -> StreamCut: ...

    @abstractmethod
    def time_cuts(self, stream: str, start_ns: int, end_ns: int) -> tuple[StreamCut, StreamCut]:
        """The tightest cut pair holding every event committed with time bounds that meet
        [start_ns, end_ns) (events without bounds count by their ingest time)."""

    @abstractmethod
    def read(
        self, stream: str, start: StreamCut | None = None, end: StreamCut | None = None
    ) -> Iterator[Event]:
        """Events between two cuts (head and tail by default), segment by segment in
        ascending segment order, each in offset order. Bounded and repeatable. A cut must
        name every segment the stream had at its point, and lie within the tail
        (`InvalidCut` otherwise, naming the missing segments or the tail)."""

    @abstractmethod
    def read_segment(
        self, stream: str, segment: int, start: int, end: int | None = None
    ) -> Iterator[Event]:
        """Events of one segment from offset `start` up to `end` (its tail by default)."""

    def read_batches(
        self, stream: str, start: StreamCut | None = None, end: StreamCut | None = None
    ) -> Iterator[EventBatch]:
        """The events of `read(stream, start, end)`, in the same order and as checked, in
        batches of one segment each (see `EventBatch`). A backend that reads blocks hands out
        each run of blocks as one batch without copying a payload; by default the events of
        `read` are grouped into batches of up to `BATCH_EVENTS`."""
        yield from _batched(self.read(stream, start, end))

    def read_segment_batches(
        self, stream: str, segment: int, start: int, end: int | None = None
    ) -> Iterator[EventBatch]:
        """The events of `read_segment(stream, segment, start, end)` in batches."""
        yield from _batched(self.read_segment(stream, segment, start, end))

    def split_points(
        self, stream: str, segment: int, start: int, end: int, parts: int
    ) -> list[int]:
        """Event boundaries that cut [start, end) into about `parts` ranges of equal bytes.

        A backend that cannot see boundaries returns [] (the range is read as one)."""
        return []

    @abstractmethod
    def reader_group(self, name: str, stream: str, start: StreamCut | None = None) -> ReaderGroup:
        """Open the named reader group, creating it at `start` (default head) if new."""

    @abstractmethod
    def delete_reader_group(self, name: str) -> None: ...

    # --- truncation and retention -------------------------------------------------------
    @abstractmethod
    def truncate(self, cut: StreamCut) -> None:
        """Drop everything before `cut`; later reads before it raise `Truncated`."""

    @abstractmethod
    def apply_retention(self, stream: str, now_ns: int | None = None) -> StreamCut | None:
        """Truncate by the stream's retention policy; return the cut used, if any."""

    # --- scaling ------------------------------------------------------------------------
    def scale(self, stream: str, seal: list[int], ranges: list[tuple[float, float]]) -> list[int]:
        """Seal `seal` and create segments for `ranges`, which must cover exactly the key
        space the sealed ones covered. Returns the new segment numbers. Readers read a sealed
        segment to its end before its successors, so per-key order holds across the change."""
        from pipeline.streams.errors import Unsupported

        raise Unsupported(type(self).__name__, "scale segments", "scale with the cluster's tools")

    def split_segment(self, stream: str, segment: int, parts: int = 2) -> list[int]:
        """Split one active segment's key range into `parts` (2 or more) equal new segments."""
        check_count("number of parts", parts, 2, "a split makes 2 or more segments")
        lo, hi = self.info(stream).active_segment(segment).key_range
        step = (hi - lo) / parts
        bounds = [lo + step * i for i in range(parts)] + [hi]
        return self.scale(stream, [segment], list(itertools.pairwise(bounds)))

    def merge_segments(self, stream: str, segments: list[int]) -> int:
        """Merge two or more active segments with adjacent key ranges into one."""
        if len(set(segments)) < 2:
            rule = "a merge takes 2 or more neighbouring segments"
            raise InvalidArgument(name="segments to merge", value=segments, rule=rule)
        info = self.info(stream)
        ranges = sorted(info.active_segment(s).key_range for s in segments)
        if any(abs(hi - lo) > 1e-12 for (_, hi), (lo, _) in itertools.pairwise(ranges)):
            rule = (
                f"only neighbours merge, and their key ranges {ranges} leave a gap"
                f" (`sluice store info {stream}` lists each segment's)"
            )
            raise InvalidArgument(name="segments to merge", value=segments, rule=rule)
        return self.scale(stream, segments, [(ranges[0][0], ranges[-1][1])])[0]

    def auto_scale(
        self, stream: str, policy: ScalingPolicy, window_seconds: float = 60.0
    ) -> list[int]:
        """Apply `policy` to the rates of the last `window_seconds` (above 0); return new
        segments."""
        from pipeline.streams.errors import Unsupported

        raise Unsupported(type(self).__name__, "auto-scale", "set a scaling policy on the stream")

    # --- integrity ----------------------------------------------------------------------
    def verify(self, stream: str | None = None, progress: Progress | None = None) -> VerifyReport:
        """Check every stored byte of `stream` (all streams by default) against its checksum,
        the index against the data files, transaction bodies and the catalog; change nothing."""
        from pipeline.streams.errors import Unsupported

        hint = "the cluster checks its own data (see its segment store's tools)"
        raise Unsupported(type(self).__name__, "verify stored data", hint)

    def repair(self, stream: str | None = None, progress: Progress | None = None) -> RepairReport:
        """Fix what can be fixed without guessing; report what could not be fixed."""
        from pipeline.streams.errors import Unsupported

        hint = "the cluster repairs its own data (see its segment store's tools)"
        raise Unsupported(type(self).__name__, "repair stored data", hint)

    def close(self) -> None:  # noqa: B027 - optional hook, most backends hold no handles
        """Release handles; the store stays usable by other processes."""

    def __enter__(self) -> StreamStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


#: The most events a default `read_batches` batch holds.
BATCH_EVENTS = 4096


def _batched(events: Iterator[Event]) -> Iterator[EventBatch]:
    """Events grouped into batches of one segment each, at most `BATCH_EVENTS` long."""
    for (stream, segment), group in itertools.groupby(events, lambda e: (e.stream, e.segment)):
        while chunk := list(itertools.islice(group, BATCH_EVENTS)):
            yield EventBatch.of(stream, segment, chunk)
