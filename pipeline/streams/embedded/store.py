"""The embedded stream store: Pravega's semantics on one machine's disk, many processes at once.

On-disk layout and the durability argument are in FORMAT.md next to this file.
"""

from __future__ import annotations

import hashlib
import random
import shutil
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from pipeline.streams.api import (
    DEFAULT_TXN_LEASE_SECONDS,
    Event,
    EventWriter,
    ReaderGroup,
    Retention,
    ScalingPolicy,
    SegmentInfo,
    StreamInfo,
    StreamStore,
    Transaction,
    check_event,
)
from pipeline.streams.cut import StreamCut, as_cut
from pipeline.streams.embedded.blocks import (
    BlockHeader,
    encode_event,
    event_frame,
    iter_events,
    parse_header,
)
from pipeline.streams.embedded.catalog import Catalog, now_ns
from pipeline.streams.embedded.segment import SegmentFile
from pipeline.streams.errors import (
    InvalidCut,
    StoreUnavailable,
    StreamNotFound,
    StreamNotSealed,
    StreamSealed,
    Truncated,
)
from pipeline.streams.names import check_name, parse_stream

READ_CHUNK = 1 << 20
SINGLE_EVENT_READ = 16 << 10
WRITER_AUTOFLUSH_BYTES = 8 << 20


@dataclass(frozen=True, slots=True)
class StreamRow:
    id: int
    scope: str
    name: str

    @property
    def qualified(self) -> str:
        return f"{self.scope}/{self.name}"


@dataclass(frozen=True, slots=True)
class BlockRow:
    offset: int
    length: int
    events: int
    ingest_ns: int
    t_min: int | None
    t_max: int | None

    @property
    def end(self) -> int:
        return self.offset + self.length


def key_position(key: str) -> float:
    """Where a routing key falls in the key space [0, 1): stable across processes and runs."""
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


class EmbeddedStore(StreamStore):
    """A durable, crash-safe, multi-process stream store in a local directory."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).expanduser().absolute()
        self.uri = f"embedded:{self.root}"
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            self.catalog = Catalog(self.root / "catalog.db")
        except (OSError, sqlite3.Error) as exc:
            raise StoreUnavailable(self.uri, str(exc)) from None
        self._files: dict[tuple[int, int], SegmentFile] = {}
        self._repaired: set[int] = set()

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()
        self.catalog.close()

    # --- scopes and streams -------------------------------------------------------------
    def create_scope(self, scope: str) -> bool:
        check_name("scope", scope)
        with self.catalog.write() as db:
            db.execute(
                "INSERT OR IGNORE INTO scopes(name, created_ns) VALUES (?, ?)", (scope, now_ns())
            )
            return db.rowcount == 1

    def list_scopes(self) -> list[str]:
        return [r[0] for r in self.catalog.query("SELECT name FROM scopes ORDER BY name")]

    def create_stream(
        self, stream: str, segments: int = 1, retention: Retention | None = None
    ) -> bool:
        scope, name = parse_stream(stream)
        if not isinstance(segments, int) or not 1 <= segments <= 1024:
            msg = f"a stream has 1 to 1024 segments, not {segments!r}"
            raise ValueError(msg)
        retention = retention or Retention()
        self.create_scope(scope)
        with self.catalog.write() as db:
            if db.execute(
                "SELECT 1 FROM streams WHERE scope=? AND name=? AND deleted=0", (scope, name)
            ).fetchone():
                return False
            db.execute(
                "INSERT INTO streams(scope, name, created_ns, retention_bytes, retention_seconds)"
                " VALUES (?, ?, ?, ?, ?)",
                (scope, name, now_ns(), retention.max_bytes, retention.max_age_seconds),
            )
            sid = db.lastrowid
            db.executemany(
                "INSERT INTO segments(stream_id, segment, key_lo, key_hi) VALUES (?, ?, ?, ?)",
                [(sid, i, i / segments, (i + 1) / segments) for i in range(segments)],
            )
        return True

    def list_streams(self, scope: str | None = None) -> list[str]:
        if scope is not None:
            check_name("scope", scope)
            rows = self.catalog.query(
                "SELECT scope, name FROM streams WHERE deleted=0 AND scope=? ORDER BY name",
                (scope,),
            )
        else:
            rows = self.catalog.query(
                "SELECT scope, name FROM streams WHERE deleted=0 ORDER BY scope, name"
            )
        return [f"{s}/{n}" for s, n in rows]

    def stream_exists(self, stream: str) -> bool:
        scope, name = parse_stream(stream)
        return self._lookup(scope, name) is not None

    def _lookup(self, scope: str, name: str) -> StreamRow | None:
        row = self.catalog.query_one(
            "SELECT id FROM streams WHERE scope=? AND name=? AND deleted=0", (scope, name)
        )
        return StreamRow(row[0], scope, name) if row else None

    def stream_row(self, stream: str) -> StreamRow:
        """The catalog row of a stream; repairs torn segment tails on first use (see FORMAT.md)."""
        scope, name = parse_stream(stream)
        row = self._lookup(scope, name)
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

    def seal_stream(self, stream: str) -> None:
        row = self.stream_row(stream)
        with self.catalog.write() as db:
            db.execute("UPDATE streams SET sealed=1 WHERE id=?", (row.id,))
            db.execute("UPDATE segments SET sealed=1 WHERE stream_id=?", (row.id,))

    def delete_stream(self, stream: str) -> None:
        row = self.stream_row(stream)
        if not self.is_sealed(row):
            raise StreamNotSealed(row.scope, row.name)
        with self.catalog.write() as db:
            db.execute("UPDATE streams SET deleted=1 WHERE id=?", (row.id,))
            for table in ("segments", "segment_predecessors", "writers"):
                db.execute(f"DELETE FROM {table} WHERE stream_id=?", (row.id,))
        with self.catalog.write(self.catalog.index) as db:
            db.execute("DELETE FROM blocks WHERE stream_id=?", (row.id,))
        for key in [k for k in self._files if k[0] == row.id]:
            self._files.pop(key).close()
        shutil.rmtree(self.root / "data" / str(row.id), ignore_errors=True)

    def info(self, stream: str) -> StreamInfo:
        row = self.stream_row(stream)
        sealed = self.is_sealed(row)
        segs = []
        for seg, lo, hi, seg_sealed, head in self.catalog.query(
            "SELECT segment, key_lo, key_hi, sealed, head FROM segments"
            " WHERE stream_id=? ORDER BY segment",
            (row.id,),
        ):
            tail = self.catch_up(row, seg)
            events, size = self._count_from(row, seg, head, tail)
            segs.append(SegmentInfo(seg, (lo, hi), bool(seg_sealed), head, tail, events, size))
        retention = self.catalog.query_one(
            "SELECT retention_bytes, retention_seconds FROM streams WHERE id=?", (row.id,)
        )
        return StreamInfo(
            scope=row.scope,
            stream=row.name,
            sealed=sealed,
            head=StreamCut.of(row.scope, row.name, {s.segment: s.head for s in segs}),
            tail=StreamCut.of(row.scope, row.name, {s.segment: s.tail for s in segs}),
            segments=tuple(segs),
            retention=Retention(*retention) if retention else Retention(),
        )

    def _count_from(self, row: StreamRow, seg: int, head: int, tail: int) -> tuple[int, int]:
        first = self._block_at(row, seg, head)
        events = self.catalog.query_one(
            "SELECT COALESCE(SUM(events), 0) FROM blocks"
            " WHERE stream_id=? AND segment=? AND offset>=?",
            (row.id, seg, head),
            index=True,
        )[0]
        if first is not None and first.offset < head:
            events += sum(1 for e in self.read_segment(row.qualified, seg, head, first.end))
        return events, tail - head

    # --- segments: files, index catch-up, repair ----------------------------------------
    def segment_file(self, row: StreamRow, segment: int) -> SegmentFile:
        key = (row.id, segment)
        if key not in self._files:
            path = self.root / "data" / str(row.id) / f"{segment}.seg"
            self._files[key] = SegmentFile(path)
        return self._files[key]

    def segments(self, row: StreamRow, active_only: bool = False) -> list[tuple[int, float, float]]:
        sql = "SELECT segment, key_lo, key_hi FROM segments WHERE stream_id=?"
        if active_only:
            sql += " AND sealed=0"
        return self.catalog.query(sql + " ORDER BY segment", (row.id,))

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

    # --- writing ------------------------------------------------------------------------
    def writer(self, stream: str, writer_id: str | None = None) -> EventWriter:
        from pipeline.streams.embedded.writer import EmbeddedWriter

        return EmbeddedWriter(self, self.stream_row(stream), writer_id)

    def begin_transaction(
        self, stream: str, lease_seconds: float = DEFAULT_TXN_LEASE_SECONDS
    ) -> Transaction:
        from pipeline.streams.embedded.transactions import EmbeddedTransaction

        return EmbeddedTransaction.begin(self, self.stream_row(stream), lease_seconds)

    def get_transaction(self, stream: str, txn_id: str) -> Transaction:
        from pipeline.streams.embedded.transactions import EmbeddedTransaction

        return EmbeddedTransaction.lookup(self, self.stream_row(stream), txn_id)

    def route(self, active: list[tuple[int, float, float]], key: str | None) -> int:
        if key is None:
            return random.choice(active)[0]
        pos = key_position(key)
        for seg, lo, hi in active:
            if lo <= pos < hi:
                return seg
        return active[-1][0]

    @staticmethod
    def encode(payload: bytes, key: str | None) -> bytes:
        return encode_event(check_event(payload, key), key)

    def check_writable(self, row: StreamRow) -> None:
        if self.is_sealed(row):
            raise StreamSealed(row.scope, row.name)

    # --- cuts ---------------------------------------------------------------------------
    def head(self, stream: str) -> StreamCut:
        row = self.stream_row(stream)
        heads = self.catalog.query(
            "SELECT segment, head FROM segments WHERE stream_id=?", (row.id,)
        )
        return StreamCut.of(row.scope, row.name, dict(heads))

    def tail(self, stream: str) -> StreamCut:
        row = self.stream_row(stream)
        tails = {seg: self.catch_up(row, seg) for seg, _, _ in self.segments(row)}
        return StreamCut.of(row.scope, row.name, tails)

    def time_cuts(self, stream: str, start_ns: int, end_ns: int) -> tuple[StreamCut, StreamCut]:
        row = self.stream_row(stream)
        starts, ends = {}, {}
        for seg, _, _ in self.segments(row):
            tail = self.catch_up(row, seg)
            head = self._segment_head(row, seg)
            inside = [
                b
                for b in self._blocks(row, seg, head, tail)
                if (b.t_max if b.t_max is not None else b.ingest_ns) >= start_ns
                and (b.t_min if b.t_min is not None else b.ingest_ns) < end_ns
            ]
            starts[seg] = max(head, inside[0].offset) if inside else tail
            ends[seg] = inside[-1].end if inside else starts[seg]
        return (
            StreamCut.of(row.scope, row.name, starts),
            StreamCut.of(row.scope, row.name, ends),
        )

    def _segment_head(self, row: StreamRow, segment: int) -> int:
        found = self.catalog.query_one(
            "SELECT head FROM segments WHERE stream_id=? AND segment=?", (row.id, segment)
        )
        return found[0] if found else 0

    # --- reading ------------------------------------------------------------------------
    def _blocks(self, row: StreamRow, segment: int, start: int, end: int) -> list[BlockRow]:
        """Indexed blocks that hold bytes of [start, end)."""
        first = self._block_at(row, segment, start)
        lo = first.offset if first is not None else start
        rows = self.catalog.query(
            "SELECT offset, length, events, ingest_ns, t_min, t_max FROM blocks"
            " WHERE stream_id=? AND segment=? AND offset>=? AND offset<? ORDER BY offset",
            (row.id, segment, lo, end),
            index=True,
        )
        return [BlockRow(*r) for r in rows]

    def _block_at(self, row: StreamRow, segment: int, offset: int) -> BlockRow | None:
        """The indexed block that contains `offset`, if any."""
        found = self.catalog.query_one(
            "SELECT offset, length, events, ingest_ns, t_min, t_max FROM blocks"
            " WHERE stream_id=? AND segment=? AND offset<=? ORDER BY offset DESC LIMIT 1",
            (row.id, segment, offset),
            index=True,
        )
        block = BlockRow(*found) if found else None
        return block if block is not None and offset < block.end else None

    def read(
        self, stream: str, start: StreamCut | None = None, end: StreamCut | None = None
    ) -> Iterator[Event]:
        row = self.stream_row(stream)
        start = as_cut(start).check_stream(row.scope, row.name) if start else self.head(stream)
        end = as_cut(end).check_stream(row.scope, row.name) if end else self.tail(stream)
        # A segment a cut does not name was created after the cut (by scaling): everything in
        # it comes after that cut, so its position in that cut is its beginning.
        starts, ends = start.segments, end.segments
        for seg in sorted(set(starts) | set(ends)):
            starts.setdefault(seg, self._segment_head(row, seg))
            ends.setdefault(seg, self._segment_head(row, seg))
            if ends[seg] < starts[seg]:
                raise InvalidCut(end.text, f"it is before the start cut in segment {seg}")
            yield from self.read_segment(stream, seg, starts[seg], ends[seg])

    def read_segment(
        self, stream: str, segment: int, start: int, end: int | None = None
    ) -> Iterator[Event]:
        row = self.stream_row(stream)
        known = {s for s, _, _ in self.segments(row)}
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
        head = self._segment_head(row, segment)
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
        blocks = self._blocks(row, segment, start, end)
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

    def check_boundary(self, row: StreamRow, segment: int, offset: int) -> None:
        """Raise `InvalidCut` unless `offset` is an event boundary of the segment."""
        block = self._block_at(row, segment, offset)
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

    def split_points(
        self, stream: str, segment: int, start: int, end: int, parts: int
    ) -> list[int]:
        row = self.stream_row(stream)
        if parts <= 1 or end <= start:
            return []
        blocks = [b for b in self._blocks(row, segment, start, end) if b.offset > start]
        step = (end - start) / parts
        points: list[int] = []
        for b in blocks:
            if b.offset >= start + step * (len(points) + 1) and b.offset < end:
                points.append(b.offset)
        return points

    # --- scaling ------------------------------------------------------------------------
    def scale(self, stream: str, seal: list[int], ranges: list[tuple[float, float]]) -> list[int]:
        from pipeline.streams.embedded import scaling

        return scaling.scale(self, self.stream_row(stream), list(seal), list(ranges))

    def auto_scale(
        self, stream: str, policy: ScalingPolicy, window_seconds: float = 60.0
    ) -> list[int]:
        from pipeline.streams.embedded import scaling

        return scaling.auto_scale(self, self.stream_row(stream), policy, window_seconds)

    def segment_sealed(self, row: StreamRow, segment: int) -> bool:
        found = self.catalog.query_one(
            "SELECT sealed FROM segments WHERE stream_id=? AND segment=?", (row.id, segment)
        )
        return bool(found and found[0])

    # --- reader groups ------------------------------------------------------------------
    def reader_group(self, name: str, stream: str, start: StreamCut | None = None) -> ReaderGroup:
        from pipeline.streams.embedded.readers import EmbeddedReaderGroup

        return EmbeddedReaderGroup.open(self, name, self.stream_row(stream), start)

    def delete_reader_group(self, name: str) -> None:
        from pipeline.streams.embedded.readers import EmbeddedReaderGroup

        EmbeddedReaderGroup.delete(self, name)

    # --- truncation and retention -------------------------------------------------------
    def truncate(self, cut: StreamCut) -> None:
        cut = as_cut(cut)
        row = self.stream_row(cut.stream)
        tails = self.tail(cut.stream).segments
        for seg, off in cut.positions:
            if seg not in tails:
                raise InvalidCut(cut.text, f"{row.qualified} has no segment {seg}")
            if off > tails[seg]:
                raise InvalidCut(cut.text, f"offset {off} is past the tail of segment {seg}")
            self.check_boundary(row, seg, off)
        with self.catalog.write() as db:
            for seg, off in cut.positions:
                db.execute(
                    "UPDATE segments SET head = MAX(head, ?) WHERE stream_id=? AND segment=?",
                    (off, row.id, seg),
                )
        for seg, off in cut.positions:
            first = self._block_at(row, seg, off)
            self.segment_file(row, seg).punch_hole(first.offset if first else off)

    def apply_retention(self, stream: str, now_ns: int | None = None) -> StreamCut | None:
        row = self.stream_row(stream)
        max_bytes, max_age = self.catalog.query_one(
            "SELECT retention_bytes, retention_seconds FROM streams WHERE id=?", (row.id,)
        )
        if max_bytes is None and max_age is None:
            return None
        now_ns = now_ns if now_ns is not None else time.time_ns()
        head = self.head(stream).segments
        tail = self.tail(stream).segments
        blocks = {seg: self._blocks(row, seg, head[seg], tail[seg]) for seg in head}
        cutoff = -(2**63)
        if max_age is not None:
            cutoff = now_ns - int(max_age * 1e9)
        if max_bytes is not None:
            newest_first = sorted(
                (b for bs in blocks.values() for b in bs), key=lambda b: b.ingest_ns, reverse=True
            )
            kept = 0
            for b in newest_first:
                kept += b.length
                if kept > max_bytes:
                    cutoff = max(cutoff, b.ingest_ns + 1)
                    break
        new_heads = {}
        for seg, bs in blocks.items():
            keep = [b for b in bs if b.ingest_ns >= cutoff and b.offset >= head[seg]]
            new_heads[seg] = keep[0].offset if keep else tail[seg]
        if new_heads == head:
            return None
        cut = StreamCut.of(row.scope, row.name, new_heads)
        self.truncate(cut)
        return cut
