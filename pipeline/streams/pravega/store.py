"""`PravegaStore`: the stream-store API on a Pravega cluster, through the `pravega` package.

Scopes, streams, seal, delete, retention, writers without a writer id and transactions work as
on the embedded store. Cuts and reads are exact on a stream with one segment (Pravega's own
framing, `frames.py`). These raise `Unsupported` naming the nearest thing that works: a stream
with several segments or a sealed one, writer ids, `Transaction.flush()`, `time_cuts`, reader
groups. Events read back without routing key or ingest time. The client's limits, and why each
call is as it is: ADAPTER.md next to this file.
"""

from __future__ import annotations

import logging
import os
import weakref
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from pipeline.streams.api import EventWriter, Feature, ReaderGroup, StreamStore, Transaction
from pipeline.streams.cut import StreamCut, as_cut
from pipeline.streams.errors import (
    InvalidCut,
    InvalidName,
    StreamNotFound,
    StreamSealed,
    Truncated,
    Unsupported,
)
from pipeline.streams.names import check_name, parse_stream
from pipeline.streams.pravega.client import PravegaClientError, build_manager, guard
from pipeline.streams.pravega.controller import ControllerChannel, SegmentRange
from pipeline.streams.pravega.frames import SegmentBytes, check_boundary, count_frames, iter_frames
from pipeline.streams.pravega.retention import policy_for, retention_from_tags
from pipeline.streams.pravega.settings import PravegaSettings, probe
from pipeline.streams.pravega.transactions import (
    BACKEND,
    CLIENT_TXN_LEASE_SECONDS,
    PravegaTransaction,
    PravegaWriter,
    no_writer_ids,
    parse_txn_id,
)
from pipeline.streams.values import (
    DEFAULT_TXN_LEASE_SECONDS,
    Event,
    Retention,
    SegmentInfo,
    StreamInfo,
    check_lease,
    check_segments,
)
from pipeline.wording import counted

T = TypeVar("T")
log = logging.getLogger(__name__)

#: Pravega's own limit on user scope and stream names.
MAX_PRAVEGA_NAME = 250
#: Events the client may have in flight per writer before `write` waits; `flush` awaits all.
WRITER_INFLIGHT = 256


class PravegaStore(StreamStore):
    """A Pravega cluster as a Sluice stream store (see the module docstring for its limits).

    Delivery guarantees: transactions are exactly-once for a caller that keeps its input until
    `commit()` returns and resolves a crash through `get_transaction(...).state()`; plain
    writers are at-least-once across crashes. Reads between cuts are exact and repeatable.
    """

    #: The client reads whole streams, not chosen segments, has no writer ids, confirms a
    #: transaction's events only at commit, and keeps no time index: see the docstrings.
    features: frozenset[Feature] = frozenset()

    def __init__(self, uri: str, settings: PravegaSettings | None = None) -> None:
        self._settings = settings or PravegaSettings.from_uri(uri, os.environ)
        self.uri = self._settings.uri
        probe(self._settings)
        self._manager: Any = build_manager(self._settings)
        self._controller = ControllerChannel(self._settings)
        self._txn_writers: dict[str, Any] = {}
        self._segment_bytes: dict[str, SegmentBytes] = {}
        # transactions begun here and still referenced: a lookup by id shares their client
        # object, whose commit waits for every event written through it
        self._begun: weakref.WeakValueDictionary[int, PravegaTransaction] = (
            weakref.WeakValueDictionary()
        )
        self._lease_noted = False

    def __repr__(self) -> str:
        return f"PravegaStore({self.uri!r}, tls={self._settings.tls}, auth={self._settings.auth!r})"

    def _call(self, operation: str, call: Callable[[], T], stream: str | None = None) -> T:
        scope, _, name = (stream or "").partition("/")
        return guard(self._settings, operation, call, (scope, name) if stream else None)

    # --- scopes and streams -------------------------------------------------------------
    def create_scope(self, scope: str) -> bool:
        scope = _pravega_name("scope", scope)
        return bool(self._call("create scope", lambda: self._manager.create_scope(scope)))

    def list_scopes(self) -> list[str]:
        scopes = self._call("list scopes", self._manager.list_scope)
        if not scopes:
            probe(self._settings)  # the client answers [] when it cannot list: tell them apart
        return sorted(s for s in scopes if not s.startswith("_"))

    def create_stream(
        self, stream: str, segments: int = 1, retention: Retention | None = None
    ) -> bool:
        scope, name = _pravega_stream(stream)
        check_segments(segments)
        client = self._client()
        retention_policy, tags = policy_for(client, retention or Retention())
        self.create_scope(scope)
        scaling = client.StreamScalingPolicy.fixed_scaling_policy(segments)
        return bool(
            self._call(
                "create stream",
                lambda: self._manager.create_stream_with_policy(
                    scope, name, scaling, retention_policy, tags
                ),
                stream,
            )
        )

    def list_streams(self, scope: str | None = None) -> list[str]:
        scopes = [check_name("scope", scope)] if scope else self.list_scopes()
        found: list[str] = []
        for sc in scopes:
            try:
                names = self._call("list streams", lambda sc=sc: self._manager.list_stream(sc))
            except PravegaClientError:
                if sc in self.list_scopes():
                    raise
                continue  # an unknown scope holds no streams
            found += [f"{sc}/{n}" for n in names if not n.startswith("_")]
        return sorted(found)

    def stream_exists(self, stream: str) -> bool:
        scope, _ = parse_stream(stream)
        return scope in self.list_scopes() and stream in self.list_streams(scope)

    def info(self, stream: str) -> StreamInfo:
        scope, name = self._existing(stream)
        tags = self._call("read stream tags", lambda: self._manager.get_stream_tags(scope, name))
        retention = retention_from_tags(tags or [])
        ranges = self._controller.current_segments(scope, name)
        segment, source = self._single_segment(stream, ranges)
        head, tail = source.head(), source.tail()
        events = count_frames(source, head, tail)
        seg = SegmentInfo(
            segment.segment, segment.key_range, False, head, tail, events, tail - head
        )
        cut_head = StreamCut.of(scope, name, {segment.segment: head})
        cut_tail = StreamCut.of(scope, name, {segment.segment: tail})
        return StreamInfo(scope, name, False, cut_head, cut_tail, (seg,), retention)

    def seal_stream(self, stream: str) -> None:
        scope, name = self._existing(stream)
        self._call("seal stream", lambda: self._manager.seal_stream(scope, name), stream)
        self._forget(stream)

    def delete_stream(self, stream: str) -> None:
        scope, name = self._existing(stream)
        self._forget(stream)
        done = self._call("delete stream", lambda: self._manager.delete_stream(scope, name), stream)
        if not done:
            msg = f"the controller kept {stream}"
            raise PravegaClientError(msg, operation="delete stream")

    # --- writing ------------------------------------------------------------------------
    def writer(self, stream: str, writer_id: str | None = None) -> EventWriter:
        """An event writer (see `PravegaWriter` for its guarantee); no caller writer ids."""
        if writer_id is not None:
            raise no_writer_ids()
        scope, name = self._existing(stream)
        self._refuse_sealed(scope, name)
        client_writer = self._call(
            "create writer",
            lambda: self._manager.create_writer(scope, name, WRITER_INFLIGHT),
            stream,
        )
        return PravegaWriter(client_writer, self._stream_call(stream), stream)

    def begin_transaction(
        self, stream: str, lease_seconds: float = DEFAULT_TXN_LEASE_SECONDS
    ) -> Transaction:
        """Open a transaction. Its lease is the client's fixed 90 s, renewed while this process
        lives (`lease_seconds` cannot be passed on; see transactions.py)."""
        check_lease(lease_seconds)
        scope, name = self._existing(stream)
        self._refuse_sealed(scope, name)
        if lease_seconds > CLIENT_TXN_LEASE_SECONDS and not self._lease_noted:
            self._lease_noted = True
            log.warning(
                "Pravega client leases transactions for %.0f s, renewed while this process runs; "
                "a requested lease of %.0f s applies only up to the controller's limits",
                CLIENT_TXN_LEASE_SECONDS,
                lease_seconds,
            )
        writer = self._txn_writer(stream)
        handle = self._call("begin transaction", writer.begin_txn, stream)
        txn_id = int(self._call("read transaction id", handle.get_txn_id, stream))
        txn = self._transaction(stream, txn_id, handle)
        self._begun[txn_id] = txn
        return txn

    def get_transaction(self, stream: str, txn_id: str) -> Transaction:
        """The transaction `txn_id`. One begun by this store object (and still referenced)
        shares its client object and can be committed; any other can be inspected, aborted,
        or "committed" once it is committed (see `PravegaTransaction`)."""
        self._existing(stream)
        number = parse_txn_id(txn_id)
        begun = self._begun.get(number)
        handle = begun.client_handle() if begun is not None and begun.stream == stream else None
        txn = self._transaction(stream, number, handle)
        txn.state()  # TxnNotFound for an id the controller does not know
        return txn

    def _transaction(self, stream: str, txn_id: int, handle: Any) -> PravegaTransaction:
        writer = self._txn_writer(stream)
        return PravegaTransaction(
            stream,
            txn_id,
            self._controller,
            self._stream_call(stream),
            handle=handle,
            reopen=lambda tid: self._call("look up transaction", lambda: writer.get_txn(tid)),
        )

    def _txn_writer(self, stream: str) -> Any:
        if stream not in self._txn_writers:
            scope, name = stream.split("/")
            writer_id = int.from_bytes(os.urandom(16), "big")
            self._txn_writers[stream] = self._call(
                "create transaction writer",
                lambda: self._manager.create_transaction_writer(scope, name, writer_id),
                stream,
            )
        return self._txn_writers[stream]

    # --- cuts and reading ---------------------------------------------------------------
    def head(self, stream: str) -> StreamCut:
        scope, name, segment, source = self._open_segment(stream)
        return StreamCut.of(scope, name, {segment: source.head()})

    def tail(self, stream: str) -> StreamCut:
        scope, name, segment, source = self._open_segment(stream)
        return StreamCut.of(scope, name, {segment: source.tail()})

    def time_cuts(self, stream: str, start_ns: int, end_ns: int) -> tuple[StreamCut, StreamCut]:
        raise Unsupported(
            BACKEND,
            "find the cuts of an event-time window (Pravega keeps no time index it can query)",
            "record cuts while writing (tail() after each commit, with its time bounds) and "
            "read between those, or use the embedded store, which indexes commit time bounds",
        )

    def read(
        self, stream: str, start: StreamCut | None = None, end: StreamCut | None = None
    ) -> Iterator[Event]:
        """The events between two cuts of a one-segment stream, exactly (see the module doc)."""
        _, _, segment, source = self._open_segment(stream)
        head, tail = source.head(), source.tail()
        first = self._position(stream, start, segment, bounds=(head, tail), default=head)
        last = self._position(stream, end, segment, bounds=(head, tail), default=tail)
        if first > last:
            msg = f"the start cut ({first}) is after the end cut ({last})"
            raise InvalidCut(str(first), msg)
        return iter_frames(source, stream, segment, first, last)

    def read_segment(
        self, stream: str, segment: int, start: int, end: int | None = None
    ) -> Iterator[Event]:
        _, _, only, source = self._open_segment(stream)
        if segment != only:
            msg = f"{stream} has one segment, {only}, not {segment}"
            raise InvalidCut(str(segment), msg)
        head, tail = source.head(), source.tail()
        stop = tail if end is None else end
        for offset in (start, stop):
            self._check_offset(stream, segment, offset, head, tail)
        if start > stop:
            msg = f"start {start} is after end {stop}"
            raise InvalidCut(str(start), msg)
        return iter_frames(source, stream, segment, start, stop)

    def reader_group(self, name: str, stream: str, start: StreamCut | None = None) -> ReaderGroup:
        """Unsupported: the client's reader groups advance their positions on their own (every
        3 s, on release), so "read but not committed is read again" cannot hold, do not say
        which segment an event came from, and accept no starting cut built from offsets."""
        raise Unsupported(
            BACKEND,
            "run a reader group with commit-controlled positions",
            "read bounded ranges with read(stream, start, end) and keep your position as cut "
            "text (tail() after each range), which is exact and survives restarts",
        )

    def delete_reader_group(self, name: str) -> None:
        raise Unsupported(
            BACKEND,
            "delete a Sluice reader group (Pravega reader groups are not used)",
            "nothing to delete: positions kept as cut text live with their owner",
        )

    # --- truncation and retention -------------------------------------------------------
    def truncate(self, cut: StreamCut) -> None:
        """Truncate at `cut` through the controller, after checking that it is an event
        boundary (the frames from it must chain onto the tail)."""
        cut = as_cut(cut)
        stream = cut.stream
        scope, name, segment, source = self._open_segment(stream)
        head, tail = source.head(), source.tail()
        offset = self._position(stream, cut, segment, bounds=(head, tail), default=head)
        if offset == head:
            return
        check_boundary(source, offset, tail)
        self._controller.truncate(scope, name, {segment: offset})

    def apply_retention(self, stream: str, now_ns: int | None = None) -> StreamCut | None:
        """Nothing to do: Pravega's controller applies a stream's retention policy itself,
        periodically (`controller.retention.frequency.minutes`). Returns None."""
        self._existing(stream)
        return None

    def close(self) -> None:
        self._controller.close()
        self._txn_writers.clear()
        self._segment_bytes.clear()

    # --- helpers ------------------------------------------------------------------------
    def _client(self) -> Any:
        import pravega_client

        return pravega_client

    def _stream_call(self, stream: str) -> Callable[[str, Callable[[], Any]], Any]:
        return lambda operation, call: self._call(operation, call, stream)

    def _existing(self, stream: str) -> tuple[str, str]:
        scope, name = _pravega_stream(stream)
        if not self.stream_exists(stream):
            raise StreamNotFound(scope, name)
        return scope, name

    def _refuse_sealed(self, scope: str, name: str) -> None:
        if not self._controller.current_segments(scope, name):
            raise StreamSealed(scope, name)

    def _open_segment(self, stream: str) -> tuple[str, str, int, SegmentBytes]:
        """(scope, name, segment id, bytes) of a stream with exactly one segment."""
        scope, name = self._existing(stream)
        ranges = self._controller.current_segments(scope, name)
        segment, source = self._single_segment(stream, ranges)
        return scope, name, segment.segment, source

    def _single_segment(
        self, stream: str, ranges: list[SegmentRange]
    ) -> tuple[SegmentRange, SegmentBytes]:
        if len(ranges) != 1:
            raise _multi_segment(stream, len(ranges))
        if stream not in self._segment_bytes:
            scope, name = stream.split("/")
            byte_stream = self._call(
                "open segment", lambda: self._manager.create_byte_stream(scope, name), stream
            )
            self._segment_bytes[stream] = SegmentBytes(byte_stream, self._stream_call(stream))
        return ranges[0], self._segment_bytes[stream]

    def _position(
        self,
        stream: str,
        cut: StreamCut | None,
        segment: int,
        *,
        bounds: tuple[int, int],
        default: int,
    ) -> int:
        if cut is None:
            return default
        head, tail = bounds
        scope, name = stream.split("/")
        cut = as_cut(cut).check_stream(scope, name)
        if set(cut.segments) != {segment}:
            msg = f"{stream} has the one segment {segment}; the cut names {sorted(cut.segments)}"
            raise InvalidCut(cut.text, msg)
        offset = cut.segments[segment]
        self._check_offset(stream, segment, offset, head, tail)
        return offset

    def _check_offset(self, stream: str, segment: int, offset: int, head: int, tail: int) -> None:
        if offset < head:
            raise Truncated(stream, segment, offset, head)
        if offset > tail:
            msg = f"offset {offset} is past the tail {tail} of {stream} segment {segment}"
            raise InvalidCut(str(offset), msg)

    def _forget(self, stream: str) -> None:
        self._segment_bytes.pop(stream, None)
        self._txn_writers.pop(stream, None)


def _pravega_name(kind: str, name: str) -> str:
    """A Sluice name that Pravega also accepts: ASCII letters, digits, '.', '-', <= 250."""
    check_name(kind, name)
    if "_" in name:
        raise InvalidName(kind, name, "Pravega does not allow '_' in names (it marks its own)")
    if len(name) > MAX_PRAVEGA_NAME:
        raise InvalidName(kind, name, f"Pravega allows at most {MAX_PRAVEGA_NAME} characters")
    return name


def _pravega_stream(stream: str) -> tuple[str, str]:
    scope, name = parse_stream(stream)
    return _pravega_name("scope", scope), _pravega_name("stream", name)


def _multi_segment(stream: str, count: int) -> Unsupported:
    if count == 0:
        return Unsupported(
            BACKEND,
            f"read or describe {stream} by position: it is sealed, and the controller lists "
            "no current segments for a sealed stream",
            "take the cuts you need (tail(), info()) before seal_stream()",
        )
    return Unsupported(
        BACKEND,
        f"read {stream} by position: it has {counted(count, 'segment')}, and the client can neither"
        " read a chosen segment nor tell which segment an event came from",
        "create Pravega streams with segments=1 for exact positional reads (a routing key then "
        "orders nothing across segments), or read this one with a Pravega connector for "
        "Spark/Flink",
    )
