"""The engine beneath the embedded store: one store directory's catalog, segment files and index.

`Engine` knows a stream by its catalog row (`StreamRow`). It repairs torn segment tails, keeps
the block index caught up with the segment files, appends blocks, checks event boundaries and
reads the events of a segment. The public store (`store.py`), its writers, transactions,
reader groups and scaling all work through it; it imports none of them. What is on disk and
why it survives a crash: FORMAT.md.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from pipeline.streams.api import Event, check_event
from pipeline.streams.cut import StreamCut
from pipeline.streams.embedded.blocks import (
    BlockHeader,
    encode_event,
    event_frame,
    iter_events,
    parse_header,
)
from pipeline.streams.embedded.catalog import Catalog
from pipeline.streams.embedded.routing import SegmentRange
from pipeline.streams.embedded.segment import SegmentFile
from pipeline.streams.errors import InvalidCut, StreamNotFound, StreamSealed, Truncated
from pipeline.streams.names import parse_stream

READ_CHUNK = 1 << 20
SINGLE_EVENT_READ = 16 << 10


@dataclass(frozen=True, slots=True)
class StreamRow:
    """A live stream's row in the catalog: its id names its directory under `data/`."""

    id: int
    scope: str
    name: str

    @property
    def qualified(self) -> str:
        return f"{self.scope}/{self.name}"


@dataclass(frozen=True, slots=True)
class BlockRow:
    """One block of the index: where it lies in its segment, its events and times."""

    offset: int
    length: int
    events: int
    ingest_ns: int
    t_min: int | None
    t_max: int | None

    @property
    def end(self) -> int:
        return self.offset + self.length


def encode(payload: bytes, key: str | None) -> bytes:
    """An event's frame as stored, once the payload and routing key pass the API's checks."""
    return encode_event(check_event(payload, key), key)


class Engine:
    """The catalog and open segment files of one store directory, shared by all its parts."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.catalog = Catalog(root / "catalog.db")
        self._files: dict[tuple[int, int], SegmentFile] = {}
        self._repaired: set[int] = set()

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()
        self.catalog.close()

    # --- streams ------------------------------------------------------------------------
    def lookup(self, scope: str, name: str) -> StreamRow | None:
        row = self.catalog.query_one(
            "SELECT id FROM streams WHERE scope=? AND name=? AND deleted=0", (scope, name)
        )
        return StreamRow(row[0], scope, name) if row else None

    def stream_row(self, stream: str) -> StreamRow:
        """The catalog row of a stream; repairs torn segment tails on first use (see FORMAT.md)."""
        scope, name = parse_stream(stream)
        row = self.lookup(scope, name)
        if row is None:
            raise StreamNotFound(scope, name)
        if row.id not in self._repaired:
            self._repair_stream(row)
            self._repaired.add(row.id)
        return row

    def is_sealed(self, row: StreamRow) -> bool:
        found = self.catalog.query_one("SELECT sealed, deleted FROM streams WHERE id=?", (row.id,))
        if found is None or found[1]:
            raise StreamNotFound(row.scope, row.name)
        return bool(found[0])

    def check_writable(self, row: StreamRow) -> None:
        if self.is_sealed(row):
            raise StreamSealed(row.scope, row.name)

    def remove_files(self, row: StreamRow) -> None:
        """Close and delete the segment files of a stream the catalog has deleted."""
        for key in [k for k in self._files if k[0] == row.id]:
            self._files.pop(key).close()
        shutil.rmtree(self.root / "data" / str(row.id), ignore_errors=True)

    # --- segments -----------------------------------------------------------------------
    def segments(self, row: StreamRow, active_only: bool = False) -> list[SegmentRange]:
        sql = "SELECT segment, key_lo, key_hi FROM segments WHERE stream_id=?"
        if active_only:
            sql += " AND sealed=0"
        return self.catalog.query(sql + " ORDER BY segment", (row.id,))

    def segment_sealed(self, row: StreamRow, segment: int) -> bool:
        found = self.catalog.query_one(
            "SELECT sealed FROM segments WHERE stream_id=? AND segment=?", (row.id, segment)
        )
        return bool(found and found[0])

    def segment_head(self, row: StreamRow, segment: int) -> int:
        found = self.catalog.query_one(
            "SELECT head FROM segments WHERE stream_id=? AND segment=?", (row.id, segment)
        )
        return found[0] if found else 0

    def head(self, row: StreamRow) -> StreamCut:
        heads = self.catalog.query(
            "SELECT segment, head FROM segments WHERE stream_id=?", (row.id,)
        )
        return StreamCut.of(row.scope, row.name, dict(heads))

    def tail(self, row: StreamRow) -> StreamCut:
        """The valid end of every segment, indexing whatever others appended since."""
        tails = {seg: self.catch_up(row, seg) for seg, _, _ in self.segments(row)}
        return StreamCut.of(row.scope, row.name, tails)

    def segment_file(self, row: StreamRow, segment: int) -> SegmentFile:
        key = (row.id, segment)
        if key not in self._files:
            path = self.root / "data" / str(row.id) / f"{segment}.seg"
            self._files[key] = SegmentFile(path)
        return self._files[key]

    # --- the block index: catch-up, repair, append ----------------------------------------
    def indexed_end(self, row: StreamRow, segment: int) -> int:
        found = self.catalog.query_one(
            "SELECT offset + length FROM blocks WHERE stream_id=? AND segment=?"
            " ORDER BY offset DESC LIMIT 1",
            (row.id, segment),
            index=True,
        )
        return found[0] if found else 0

    def catch_up(self, row: StreamRow, segment: int) -> int:
        """Index the valid blocks past the indexed end; return the segment's valid end (tail)."""
        start = self.indexed_end(row, segment)
        headers, end = self.segment_file(row, segment).scan(start)
        if headers:
            self.index_blocks(row, segment, headers)
        return end

    def index_blocks(self, row: StreamRow, segment: int, headers: list[BlockHeader]) -> None:
        with self.catalog.write(self.catalog.index) as db:
            db.executemany(
                "INSERT OR IGNORE INTO blocks"
                "(stream_id, segment, offset, length, events, ingest_ns, t_min, t_max)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (row.id, segment, h.offset, h.length, h.events, h.ingest_ns, h.t_min, h.t_max)
                    for h in headers
                ],
            )
            db.executemany(
                "INSERT INTO writers(stream_id, segment, writer_id, last_event_number)"
                " VALUES (?, ?, ?, ?) ON CONFLICT DO UPDATE SET last_event_number ="
                " MAX(last_event_number, excluded.last_event_number)",
                [
                    (row.id, segment, h.writer_id, h.last_event_number)
                    for h in headers
                    if h.writer_id is not None
                ],
            )

    def _repair_stream(self, row: StreamRow) -> None:
        """Truncate torn tails left by a crash, where no writer holds the segment right now."""
        for seg, _, _ in self.segments(row):
            segfile = self.segment_file(row, seg)
            if not segfile.path.exists():
                continue
            with segfile.try_locked() as locked:
                if locked:
                    segfile.repair(self.catch_up(row, seg))

    def append_block(
        self, row: StreamRow, segment: int, header: bytes, body: list[bytes | memoryview]
    ) -> int:
        """Append one block at the valid end of a segment (caller holds its lock); index it."""
        segfile = self.segment_file(row, segment)
        at = self.catch_up(row, segment)
        end = segfile.append(at, [header, *body])
        data = memoryview(header)
        parsed = parse_header(data, 0, at)
        assert parsed is not None and parsed.end == end
        self.index_blocks(row, segment, [parsed])
        return at

    def writer_position(self, row: StreamRow, segment: int, writer_id: str) -> int:
        found = self.catalog.query_one(
            "SELECT last_event_number FROM writers WHERE stream_id=? AND segment=? AND writer_id=?",
            (row.id, segment, writer_id),
            index=True,
        )
        return found[0] if found else 0

    def blocks(self, row: StreamRow, segment: int, start: int, end: int) -> list[BlockRow]:
        """Indexed blocks that hold bytes of [start, end)."""
        first = self.block_at(row, segment, start)
        lo = first.offset if first is not None else start
        rows = self.catalog.query(
            "SELECT offset, length, events, ingest_ns, t_min, t_max FROM blocks"
            " WHERE stream_id=? AND segment=? AND offset>=? AND offset<? ORDER BY offset",
            (row.id, segment, lo, end),
            index=True,
        )
        return [BlockRow(*r) for r in rows]

    def block_at(self, row: StreamRow, segment: int, offset: int) -> BlockRow | None:
        """The indexed block that contains `offset`, if any."""
        found = self.catalog.query_one(
            "SELECT offset, length, events, ingest_ns, t_min, t_max FROM blocks"
            " WHERE stream_id=? AND segment=? AND offset<=? ORDER BY offset DESC LIMIT 1",
            (row.id, segment, offset),
            index=True,
        )
        block = BlockRow(*found) if found else None
        return block if block is not None and offset < block.end else None

    # --- reading ------------------------------------------------------------------------
    def check_boundary(self, row: StreamRow, segment: int, offset: int) -> None:
        """Raise `InvalidCut` unless `offset` is an event boundary of the segment."""
        block = self.block_at(row, segment, offset)
        if block is None or block.offset == offset:
            return  # a block start, the tail, or the start of an empty segment
        data = memoryview(self.segment_file(row, segment).pread(block.length, block.offset))
        header = parse_header(data, 0, block.offset)
        body = data[header.body_offset - block.offset :] if header else b""
        if header and any(off == offset for off, _, _, _ in iter_events(body, header)):
            return
        msg = (
            f"offset {offset} of segment {segment} is not an event boundary;"
            " use a cut taken from the store (head, tail, an event's offset)"
        )
        raise InvalidCut(text=f"{segment}-{offset}", reason=msg)

    def read_segment(
        self, row: StreamRow, segment: int, start: int, end: int | None = None
    ) -> Iterator[Event]:
        """Events of one segment from `start` up to `end` (its tail by default)."""
        known = {s for s, _, _ in self.segments(row)}
        if not known:  # only a deleted stream has no segments
            raise StreamNotFound(row.scope, row.name)
        if segment not in known:
            msg = f"{row.qualified} has no segment {segment}"
            raise InvalidCut(text=f"{segment}-{start}", reason=msg)
        tail = self.catch_up(row, segment)
        end = tail if end is None else end
        if end > tail:
            msg = f"offset {end} is past the tail ({tail}) of segment {segment}"
            raise InvalidCut(text=f"{segment}-{end}", reason=msg)
        if start >= end:  # an empty range reads nothing, even one the head has passed
            return iter(())
        head = self.segment_head(row, segment)
        if start < head:
            raise Truncated(row.qualified, segment, start, head)
        return self._read_range(row, segment, start, end)

    def _read_range(self, row: StreamRow, segment: int, start: int, end: int) -> Iterator[Event]:
        """Events of indexed blocks in [start, end), read with as few copies as possible.

        Small blocks are read together in chunks of up to READ_CHUNK bytes; a large block with
        one event (a typical 1000-sample event) has its payload read straight into the bytes
        object returned, one copy from the page cache.
        """
        self.check_boundary(row, segment, start)
        self.check_boundary(row, segment, end)
        blocks = self.blocks(row, segment, start, end)
        i = 0
        while i < len(blocks):
            if blocks[i].events == 1 and blocks[i].length > SINGLE_EVENT_READ:
                yield from self._events_in(row, segment, [blocks[i]], start, end, single=True)
                i += 1
                continue
            j, size = i, 0
            while j < len(blocks) and (size == 0 or size + blocks[j].length <= READ_CHUNK):
                if blocks[j].events == 1 and blocks[j].length > SINGLE_EVENT_READ and j > i:
                    break
                size += blocks[j].length
                j += 1
            yield from self._events_in(row, segment, blocks[i:j], start, end, single=False)
            i = j

    def _events_in(
        self,
        row: StreamRow,
        segment: int,
        blocks: list[BlockRow],
        start: int,
        end: int,
        *,
        single: bool,
    ) -> Iterator[Event]:
        segfile = self.segment_file(row, segment)
        first = blocks[0].offset
        size = SINGLE_EVENT_READ if single else blocks[-1].end - first
        data = memoryview(segfile.pread(size, first))
        pos = 0
        for block in blocks:
            header = parse_header(data, pos, block.offset)
            if header is None:
                msg = f"block at {block.offset} of segment {segment} is unreadable"
                raise InvalidCut(text=f"{segment}-{block.offset}", reason=msg)
            if single:
                key, payload_at, payload_len = event_frame(data, header.body_offset - first)
                payload = segfile.pread(payload_len, first + payload_at)
                if block.offset >= start and block.end <= end:
                    yield Event(
                        row.qualified,
                        segment,
                        block.offset,
                        block.end,
                        key,
                        payload,
                        header.ingest_ns,
                    )
                return
            body = data[pos + header.body_offset - block.offset : pos + block.length]
            for off, end_off, key, payload in iter_events(body, header):
                if start <= off and end_off <= end:
                    yield Event(
                        row.qualified, segment, off, end_off, key, payload, header.ingest_ns
                    )
            pos += block.length
