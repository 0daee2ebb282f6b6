"""Event writers of the embedded store.

Delivery: `flush()` returns once the events are fsynced (durable). Without a writer id a
resend after a lost acknowledgement duplicates (at-least-once). With a writer id each event has
an event number; each flushed block records the writer and its highest number, and the store
drops events whose number it has already stored for that writer in that segment, so a resend
is a no-op (exactly-once for a writer that resends with the same id and numbers). Event numbers
run from 1 to 2^63-1; anything else is refused (`InvalidEventNumber`). A flush refused (a full
disk, a damaged segment) keeps its events buffered: flushing again later resends them.
"""

from __future__ import annotations

from collections import defaultdict

from pipeline.streams.api import EventWriter
from pipeline.streams.embedded import blocks
from pipeline.streams.embedded.blocks import checksum_for, encode_header
from pipeline.streams.embedded.catalog import now_ns
from pipeline.streams.embedded.engine import Engine, encode_pieces
from pipeline.streams.embedded.index import StreamRow
from pipeline.streams.embedded.routing import route
from pipeline.streams.errors import MAX_EVENT_NUMBER, InvalidEventNumber

WRITER_AUTOFLUSH_BYTES = 8 << 20
#: Routing keys whose segment a writer remembers (it forgets them all past this many).
ROUTES_REMEMBERED = 4096
Pending = tuple[int, str | None, tuple[bytes, ...]]  # event number, routing key, frame pieces


class EmbeddedWriter(EventWriter):
    def __init__(self, engine: Engine, row: StreamRow, writer_id: str | None) -> None:
        if writer_id is not None and (not writer_id or len(writer_id) > 255):
            msg = f"a writer id is 1 to 255 characters, not {writer_id!r}"
            raise ValueError(msg)
        self.engine, self.row, self.writer_id = engine, row, writer_id
        self._active = engine.segments(row, active_only=True)
        self._routes: dict[str, int] = {}  # routing key -> its segment among `_active`
        self._flushed: set[int] = set()  # segments this writer has appended to
        self._pending: dict[int, list[Pending]] = defaultdict(list)
        self._pending_bytes = 0
        self._last = self._stored_last()

    def last_event_number(self) -> int:
        return max(self._stored_last(), self._last)

    def _stored_last(self) -> int:
        """The highest number the store holds for this writer id, over all segments."""
        if self.writer_id is None:
            return 0
        self.engine.tail(self.row)  # index what crashed writers left unindexed
        found = self.engine.catalog.query_one(
            "SELECT MAX(last_event_number) FROM writers WHERE stream_id=? AND writer_id=?",
            (self.row.id, self.writer_id),
            index=True,
        )
        return found[0] or 0

    def write(
        self, payload: bytes, routing_key: str | None = None, event_number: int | None = None
    ) -> None:
        pieces = encode_pieces(payload, routing_key)
        segment = self._route(routing_key)
        if event_number is None:
            event_number = self._last + 1
        else:
            self._check_number(event_number)
        self._last = max(self._last, event_number)
        self._pending[segment].append((event_number, routing_key, pieces))
        self._pending_bytes += sum(map(len, pieces))
        if self._pending_bytes >= WRITER_AUTOFLUSH_BYTES:
            self.flush()

    def _route(self, key: str | None) -> int:
        """The active segment that takes `key` (remembered per key until a scale)."""
        segment = self._routes.get(key) if key is not None else None
        if segment is None:
            if not self._active:
                self.engine.check_writable(self.row)
            segment = route(self._active, key)
            if key is not None:
                if len(self._routes) >= ROUTES_REMEMBERED:
                    self._routes.clear()
                self._routes[key] = segment
        return segment

    def _check_number(self, event_number: int) -> None:
        if self.writer_id is None:
            msg = "event numbers need a writer id: open the writer with writer_id=..."
            raise ValueError(msg)
        valid = isinstance(event_number, int) and not isinstance(event_number, bool)
        if not valid or not 1 <= event_number <= MAX_EVENT_NUMBER:
            raise InvalidEventNumber(self.writer_id, event_number)

    def flush(self) -> None:
        while self._pending:
            segment = min(self._pending)
            moved = self._flush_segment(segment, self._pending[segment])
            if moved:  # the segment was sealed by a scale: its successors take the events
                self._reroute(segment, moved)
            else:
                del self._pending[segment]
        self._pending_bytes = 0

    def _reroute(self, sealed: int, events: list[Pending]) -> None:
        """Move the events pending for a segment sealed since they were routed to its
        successors; if the stream is sealed (or deleted) raise, the events still pending."""
        self._active = self.engine.segments(self.row, active_only=True)
        self._routes.clear()
        if not self._active:
            self.engine.check_writable(self.row)
        del self._pending[sealed]
        rerouted: dict[int, list[Pending]] = defaultdict(list)
        for event in events:
            rerouted[self._route(event[1])].append(event)
        for target, moved in rerouted.items():
            self._pending[target][:0] = moved  # older than anything pending there

    def _flush_segment(self, segment: int, events: list[Pending]) -> list[Pending]:
        """Append `events` as one block; return them instead if the segment is sealed."""
        if segment not in self._flushed:  # a stream deleted since must not get its file back
            self.engine.check_writable(self.row)
        segfile = self.engine.segment_file(self.row, segment)
        with segfile.locked():
            if not self.engine.segment_writable(self.row, segment):
                return events
            self._flushed.add(segment)
            if self.writer_id is not None:
                self.engine.catch_up(self.row, segment)
                stored = self.engine.writer_position(self.row, segment, self.writer_id)
                events = [e for e in events if e[0] > stored]
                if not events:
                    return []
            body = [piece for _, _, pieces in events for piece in pieces]
            magic = blocks.BLOCK_MAGIC  # read once: the header names the sum computed here
            sums, crc = checksum_for(magic), 0
            for piece in body:
                crc = sums(piece, crc)
            header = encode_header(
                magic=magic,
                body_crc=crc,
                body_len=sum(map(len, body)),
                events=len(events),
                ingest_ns=now_ns(),
                last_event_number=max(e[0] for e in events) if self.writer_id else 0,
                meta=b"w" + self.writer_id.encode() if self.writer_id else b"",
            )
            self.engine.append_block(self.row, segment, header, body)
        return []
