"""The stream-store interface every backend implements.

Streams are named `scope/stream`. A stream has one or more segments; a routing key hashes to
one segment, so events with one key are read in the order they were written. Positions are
`StreamCut`s. Semantics every backend holds are listed in docs/architecture.md ("The stream
store") and checked by `tests/streams/test_contract.py` against each backend. The values these
interfaces pass (events, infos, policies, reports) and the checks of their arguments: `values.py`.
"""

from __future__ import annotations

import itertools
from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import Literal

from pipeline.streams.cut import StreamCut
from pipeline.streams.errors import InvalidArgument
from pipeline.streams.values import (
    DEFAULT_TXN_LEASE_SECONDS,
    Event,
    EventBatch,
    Progress,
    RepairReport,
    Retention,
    ScalingPolicy,
    StreamInfo,
    TxnState,
    VerifyReport,
    check_count,
)

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
    def seal_stream(self, stream: str) -> None:
        """Seal the stream: once this returns, no event is ever added to it (appends and
        commits in flight land before; open transactions can no longer commit)."""

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
