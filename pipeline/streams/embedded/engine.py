"""The engine beneath the embedded store: one store directory's catalog, segment files and index.

`Engine` knows a stream by its catalog row (`StreamRow`). It binds the catalog to the data
(store id, manifests), keeps the block index caught up with the segment files, settles torn
tails, marks damaged segments, appends blocks, checks cuts and event boundaries, and reads a
segment's events, each block checked before any of its events is returned. The public store
(`store.py`), its writers, transactions, reader groups, scaling and integrity checks all work
through it; it imports none of them. What is on disk and why it survives a crash: FORMAT.md.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from pipeline.config import FileModes
from pipeline.streams.api import check_event
from pipeline.streams.cut import StreamCut, as_cut
from pipeline.streams.embedded.binding import (
    HeadBlock,
    bind,
    manifest_of,
    refuse_newer_store_file,
)
from pipeline.streams.embedded.blocks import (
    BadBlock,
    BlockHeader,
    BlockRow,
    encode_event,
    frame_head,
    parse_header,
)
from pipeline.streams.embedded.catalog import CLOSED, REBUILDING, Catalog, now_ns
from pipeline.streams.embedded.identity import check_identity
from pipeline.streams.embedded.manifest import (
    MANIFEST_FILE,
    StreamManifest,
    read_manifest,
    stream_dir,
    write_manifest,
)
from pipeline.streams.embedded.reading import (
    BlockReader,
    Buffers,
    ParsedFrames,
    Reading,
    read_events,
)
from pipeline.streams.embedded.routing import SegmentRange
from pipeline.streams.embedded.segment import SegmentFile
from pipeline.streams.errors import (
    CatalogMismatch,
    Corrupted,
    InvalidCut,
    SegmentDamaged,
    StoreUnavailable,
    StreamNotFound,
    StreamSealed,
    StreamStoreError,
    Truncated,
)
from pipeline.streams.names import parse_stream

__all__ = ["BlockRow", "Engine", "StreamRow", "commit_landed", "encode", "encode_pieces"]

#: A payload at least this large is written from the caller's own bytes, one more buffer of
#: the block's `pwritev`, instead of being copied into its frame (a copy into fresh memory
#: costs more than the extra buffer; below this the copy is cheaper).
ZERO_COPY_PAYLOAD = 4096


@dataclass(frozen=True, slots=True)
class StreamRow:
    """A live stream's row in the catalog: its id names its directory under `data/`."""

    id: int
    scope: str
    name: str

    @property
    def qualified(self) -> str:
        return f"{self.scope}/{self.name}"


def encode(payload: bytes, key: str | None) -> bytes:
    """An event's frame as stored, once the payload and routing key pass the API's checks."""
    return encode_event(check_event(payload, key), key)


def encode_pieces(payload: bytes, key: str | None) -> tuple[bytes, ...]:
    """An event's frame as stored, in the pieces a block's `pwritev` takes: one bytes for a
    small event; the frame's head and the payload itself (never copied) for a large one.

    The payload is held by reference until it is written: `check_event` gives the caller's
    `bytes` (immutable) as they are and copies a `bytearray` or `memoryview`, so a caller that
    reuses its buffer after `write()` cannot change what is flushed."""
    payload = check_event(payload, key)
    if len(payload) < ZERO_COPY_PAYLOAD:
        return (encode_event(payload, key),)
    return (frame_head(len(payload), key), payload)


class Engine:
    """The catalog and open segment files of one store directory, shared by all its parts.

    A catalog that cannot be read or does not match the data leaves the engine open but
    refusing: every catalog access raises the typed error (`CatalogDamaged`, `CatalogMismatch`)
    until `repair` rebuilds it; `problem` holds that error.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.modes = FileModes.from_environment()  # of every file and directory it creates
        root.mkdir(mode=self.modes.directory, parents=True, exist_ok=True)
        self._files: dict[tuple[int, int], SegmentFile] = {}
        self._opened: set[int] = set()
        self._removed: set[int] = set()  # streams whose files `remove_files` deleted
        self.read_buffers = Buffers()  # shared by every read of this store (reading.py)
        self.parsed_frames = ParsedFrames()  # of large blocks, as `read_buffers`
        self.open_catalog()

    def open_catalog(self, *, rebuilding: bool = False) -> None:
        """Open the catalog and bind it to the data (again, while `repair` rebuilds it: only
        then is a catalog whose rebuild has not finished served)."""
        self._opened.clear()
        self.store_id = ""
        # before the catalog is opened: a newer store's missing or unreadable catalog is
        # neither created nor read as damaged
        refuse_newer_store_file(self.root)
        self.catalog = Catalog(self.root / "catalog.db")
        self.problem: StreamStoreError | None = self.catalog.refusal
        if self.catalog.readable:
            try:
                self.store_id = bind(self.root, self.catalog, self._head_blocks)
                if not rebuilding and self.catalog.query_one(
                    "SELECT 1 FROM meta WHERE key = ?", (REBUILDING,)
                ):
                    reason = "a repair that was rebuilding it from the data files was stopped"
                    raise CatalogMismatch(str(self.catalog.path), reason)
            except CatalogMismatch as exc:
                self.problem = exc
                self.catalog.refuse(exc)

    def close(self) -> None:
        """Close the catalog and the segment files; a read or write in flight on another
        thread finishes first, later ones raise `StoreUnavailable` (see segment.py)."""
        closed = StoreUnavailable(f"embedded:{self.root}", CLOSED)
        for f in list(self._files.values()):
            f.close(closed)
        self._files.clear()
        self.catalog.close()

    # --- streams ------------------------------------------------------------------------
    def lookup(self, scope: str, name: str) -> StreamRow | None:
        row = self.catalog.query_one(
            "SELECT id FROM streams WHERE scope=? AND name=? AND deleted=0", (scope, name)
        )
        return StreamRow(row[0], scope, name) if row else None

    def stream_row(self, stream: str) -> StreamRow:
        """The catalog row of a stream. On first use in this process its manifest is brought in
        line with the catalog and its torn segment tails are settled (see FORMAT.md)."""
        scope, name = parse_stream(stream)
        row = self.lookup(scope, name)
        if row is None:
            raise StreamNotFound(scope, name)
        if row.id not in self._opened:
            self.sync_manifest(row)
            for seg, _, _ in self.segments(row):
                if self.segment_file(row, seg).path.exists():
                    self._settle_unlocked(row, seg)
            self._opened.add(row.id)
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
        """Close and delete the segment files of a stream the catalog has deleted; its manifest
        stays behind as a tombstone, so its id is never used again. A read or write of them in
        flight on another thread finishes on the deleted file; any later use in this process
        raises `StreamNotFound`, never opening (or creating) the file again."""
        self._removed.add(row.id)
        for key, segfile in list(self._files.items()):
            if key[0] == row.id:
                segfile.close(StreamNotFound(row.scope, row.name))
        for path in stream_dir(self.root, row.id).glob("*.seg"):
            path.unlink(missing_ok=True)

    # --- manifests ----------------------------------------------------------------------
    @contextmanager
    def changing(self, row: StreamRow) -> Iterator:
        """A catalog transaction that changes a stream; its manifest is written before it
        commits (a manifest is never behind its catalog) and put back if it fails."""
        try:
            with self.catalog.write() as db:
                yield db
                self._write_manifest(db, row.id)
        except BaseException:
            with suppress(Exception):
                self.sync_manifest(row)
            raise

    def sync_manifest(self, row: StreamRow) -> None:
        """Write the stream's manifest from the catalog, unless it says the same already (then
        no lock is taken); one naming another stream or store is refused."""
        if self._stored_manifest(row) == self.manifest(row.id):
            return
        with self.catalog.write() as db:  # serialised with changes that write it too
            found = self._stored_manifest(row)
            if found is not None and (found.store_id, found.scope, found.name) != (
                self.store_id,
                row.scope,
                row.name,
            ):
                path = stream_dir(self.root, row.id) / MANIFEST_FILE
                reason = (
                    f"the catalog says data/{row.id} holds {row.qualified}, but its manifest"
                    f" {path} says {found.qualified} of store {found.store_id}"
                )
                raise CatalogMismatch(str(self.catalog.path), reason)
            self._write_manifest(db, row.id)

    def _stored_manifest(self, row: StreamRow) -> StreamManifest | None:
        try:
            return read_manifest(self.root, row.id)
        except ValueError:
            return None

    def manifest(self, stream_id: int) -> StreamManifest:
        """A stream's manifest as the catalog describes it now."""
        with self.catalog.reading() as db:
            return manifest_of(db, self.store_id, stream_id, self._head_blocks(stream_id))

    def _write_manifest(self, db: sqlite3.Cursor, stream_id: int) -> None:
        manifest = manifest_of(db, self.store_id, stream_id, self._head_blocks(stream_id))
        write_manifest(self.root, manifest)

    def _head_blocks(self, stream_id: int) -> HeadBlock:
        """Where the block holding a segment's head starts (the head itself if none does)."""
        row = StreamRow(stream_id, "", "")

        def head_block(segment: int, head: int) -> int:
            block = self.block_at(row, segment, head)
            return block.offset if block is not None else head

        return head_block

    # --- segments -----------------------------------------------------------------------
    def segments(self, row: StreamRow, active_only: bool = False) -> list[SegmentRange]:
        sql = "SELECT segment, key_lo, key_hi FROM segments WHERE stream_id=?"
        if active_only:
            sql += " AND sealed=0"
        return self.catalog.query(sql + " ORDER BY segment", (row.id,))

    def predecessors(self, row: StreamRow) -> dict[int, list[int]]:
        """Each segment created by a scale -> the segments it succeeded."""
        found: dict[int, list[int]] = {}
        for seg, pred in self.catalog.query(
            "SELECT segment, predecessor FROM segment_predecessors WHERE stream_id=?", (row.id,)
        ):
            found.setdefault(seg, []).append(pred)
        return found

    def segment_sealed(self, row: StreamRow, segment: int) -> bool:
        found = self.catalog.query_one(
            "SELECT sealed FROM segments WHERE stream_id=? AND segment=?", (row.id, segment)
        )
        return bool(found and found[0])

    def segment_writable(self, row: StreamRow, segment: int) -> bool:
        """False when the segment is sealed, or gone with its deleted stream (an appender asks
        this under the segment's lock; read on the index connection, whose pages are current
        after its own index writes)."""
        found = self.catalog.query_one(
            "SELECT sealed FROM segments WHERE stream_id=? AND segment=?",
            (row.id, segment),
            index=True,
        )
        return found is not None and not found[0]

    def segment_head(self, row: StreamRow, segment: int) -> int:
        found = self.catalog.query_one(
            "SELECT head FROM segments WHERE stream_id=? AND segment=?", (row.id, segment)
        )
        return found[0] if found else 0

    def head(self, row: StreamRow) -> StreamCut:
        heads = self.catalog.query(
            "SELECT segment, head FROM segments WHERE stream_id=?", (row.id,)
        )
        return StreamCut.of(row.scope, row.name, dict(heads), row.id)

    def tail(self, row: StreamRow) -> StreamCut:
        """The valid end of every segment, indexing whatever others appended since."""
        tails = {seg: self.catch_up(row, seg) for seg, _, _ in self.segments(row)}
        return StreamCut.of(row.scope, row.name, tails, row.id)

    def segment_file(self, row: StreamRow, segment: int) -> SegmentFile:
        """The segment's file, shared by every thread (one object, so one thread lock);
        `StreamNotFound` once this process deleted the stream."""
        key = (row.id, segment)
        found = self._files.get(key)
        if found is None:
            path = stream_dir(self.root, row.id) / f"{segment}.seg"
            found = self._files.setdefault(key, SegmentFile(path, self.modes))
        if row.id in self._removed:  # (after the insert: `remove_files` adds it before closing)
            raise StreamNotFound(row.scope, row.name)
        return found

    # --- damage -------------------------------------------------------------------------
    def damage(self, row: StreamRow, segment: int) -> tuple[int, str] | None:
        """Where a segment is marked damaged and what is wrong there, if it is."""
        return self.catalog.query_one(
            "SELECT offset, problem FROM damage WHERE stream_id=? AND segment=?", (row.id, segment)
        )

    def mark_damaged(self, row: StreamRow, segment: int, offset: int, problem: str) -> None:
        """Record the first damage found in a segment: it takes no writes until `repair`."""
        with suppress(StreamStoreError), self.catalog.write() as db:
            db.execute(
                "INSERT OR IGNORE INTO damage(stream_id, segment, offset, problem, found_ns)"
                " VALUES (?, ?, ?, ?, ?)",
                (row.id, segment, offset, problem, now_ns()),
            )

    def clear_damage(self, row: StreamRow, segment: int) -> None:
        with self.catalog.write() as db:
            db.execute("DELETE FROM damage WHERE stream_id=? AND segment=?", (row.id, segment))

    def check_undamaged(self, row: StreamRow, segment: int) -> None:
        found = self.damage(row, segment)
        if found is not None:
            raise SegmentDamaged(row.qualified, segment, found[0], found[1])

    def corrupted(self, row: StreamRow, segment: int, bad: BadBlock) -> StreamStoreError:
        """The error for a block that failed its check: `StreamNotFound` if the stream was
        deleted under the read, `Truncated` if a truncation raced the read past it, else
        `Corrupted`, the segment marked damaged."""
        if self.catalog.query_one("SELECT deleted FROM streams WHERE id=?", (row.id,)) != (0,):
            return StreamNotFound(row.scope, row.name)
        head = self.segment_head(row, segment)
        if bad.offset < head:
            return Truncated(row.qualified, segment, bad.offset, head)
        self.mark_damaged(row, segment, bad.offset, bad.problem)
        return Corrupted(row.qualified, segment, bad.offset, bad.problem)

    # --- the block index: catch-up, torn tails, append -----------------------------------
    def indexed_end(self, row: StreamRow, segment: int) -> int:
        found = self.catalog.query_one(
            "SELECT offset + length FROM blocks WHERE stream_id=? AND segment=?"
            " ORDER BY offset DESC LIMIT 1",
            (row.id, segment),
            index=True,
        )
        return found[0] if found else 0

    def catch_up(self, row: StreamRow, segment: int) -> int:
        """Index the valid blocks past the indexed end; return the segment's valid end (tail).

        A file shorter than its index marks the segment damaged; its tail stays where the
        index ends (reads stop with `Corrupted` where the data does).
        """
        start = self.indexed_end(row, segment)
        segfile = self.segment_file(row, segment)
        if start and (size := segfile.size()) < start:
            lost = self.catalog.query_one(
                "SELECT offset FROM blocks WHERE stream_id=? AND segment=? AND offset+length>?"
                " ORDER BY offset LIMIT 1",
                (row.id, segment, size),
                index=True,
            )
            problem = f"the segment file ends at {size}, before the end of its index ({start})"
            self.mark_damaged(row, segment, lost[0] if lost else size, problem)
            return start
        headers, end = segfile.scan(start)
        if headers:
            self.index_blocks(row, segment, headers)
        return end

    def index_blocks(
        self, row: StreamRow, segment: int, headers: list[BlockHeader], *, landed: bool = True
    ) -> None:
        """Index blocks found valid in a segment file. With `landed`, a transaction's block
        whose transaction the catalog does not hold committed (or committing) commits it: such
        a block was landed whole by a one-segment commit (see `commit_landed`)."""
        uncommitted = self._uncommitted_txns(headers) if landed else []
        if uncommitted:  # the block may still be in the page cache only: make it durable first
            self.segment_file(row, segment).sync()
        with self.catalog.write(self.catalog.index) as db:
            self.insert_index(db, row, segment, headers)
            if uncommitted:
                commit_landed(db, row, segment, uncommitted)
        for h in uncommitted:
            for path in (self.root / "txn").glob(f"{h.txn_id}.*.body"):
                path.unlink(missing_ok=True)

    def _uncommitted_txns(self, headers: list[BlockHeader]) -> list[BlockHeader]:
        """The transaction blocks among `headers` whose transaction is open, landing or
        unknown to the catalog."""
        named = {h.txn_id: h for h in headers if h.txn_id is not None}
        if not named:
            return []
        marks = ",".join("?" * len(named))
        known = dict(
            self.catalog.query(
                f"SELECT txn_id, state FROM txns WHERE txn_id IN ({marks})", tuple(named)
            )
        )
        return [h for t, h in named.items() if known.get(t, "open") in ("open", "landing")]

    def insert_index(
        self, db: sqlite3.Cursor, row: StreamRow, segment: int, headers: list[BlockHeader]
    ) -> None:
        """Insert index rows and writer positions for `headers` (inside `db`'s transaction)."""
        if not headers:
            return
        db.executemany(
            "INSERT OR IGNORE INTO blocks"
            "(stream_id, segment, offset, length, events, ingest_ns, t_min, t_max)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (row.id, segment, h.offset, h.length, h.events, h.ingest_ns, h.t_min, h.t_max)
                for h in headers
            ],
        )
        writers = [
            (row.id, segment, h.writer_id, h.last_event_number)
            for h in headers
            if h.writer_id is not None
        ]
        if writers:
            db.executemany(
                "INSERT INTO writers(stream_id, segment, writer_id, last_event_number)"
                " VALUES (?, ?, ?, ?) ON CONFLICT DO UPDATE SET last_event_number ="
                " MAX(last_event_number, excluded.last_event_number)",
                writers,
            )

    def _settle_unlocked(self, row: StreamRow, segment: int) -> None:
        """Settle a segment's tail if no one is appending to it right now."""
        segfile = self.segment_file(row, segment)
        with segfile.try_locked() as locked:
            if locked:
                self.settle_tail(row, segment, self.catch_up(row, segment))

    def settle_tail(self, row: StreamRow, segment: int, valid_end: int) -> None:
        """Bytes past the valid end (caller holds the lock): a torn tail is cut, unless a valid
        block follows it; then it is damage, marked and left for `repair`."""
        segfile = self.segment_file(row, segment)
        if segfile.size() <= valid_end:
            return
        later = segfile.next_valid_block(valid_end)
        if later is None:
            segfile.repair(valid_end)
            return
        problem = (
            f"{later - valid_end} bytes at {valid_end} are no valid block, but valid blocks"
            f" follow at {later} (kept for `sluice store repair`)"
        )
        self.mark_damaged(row, segment, valid_end, problem)

    def append_block(
        self, row: StreamRow, segment: int, header: bytes, body: list[bytes | memoryview]
    ) -> int:
        """Append one block at the valid end of a segment (caller holds its lock); index it.

        Refused with `SegmentDamaged` when the segment is damaged (or found so now)."""
        segfile = self.segment_file(row, segment)
        at, damaged = self._indexed_end_and_damage(row, segment)
        if damaged or segfile.size() != at:  # others appended, a torn tail, damage: look
            at = self.catch_up(row, segment)
            self.settle_tail(row, segment, at)
            self.check_undamaged(row, segment)
        end = segfile.append(at, [header, *body])
        parsed = parse_header(memoryview(header), 0, at)
        assert parsed is not None and parsed.end == end
        self.index_blocks(row, segment, [parsed])
        return at

    def _indexed_end_and_damage(self, row: StreamRow, segment: int) -> tuple[int, bool]:
        """The indexed end of a segment and whether it is marked damaged, in one query. When
        the file ends at the indexed end and no damage is marked, that end is the valid end:
        a catch-up would find no block past it, and there is no torn tail to settle."""
        found = self.catalog.query_one(
            "SELECT (SELECT offset + length FROM blocks WHERE stream_id=?1 AND segment=?2"
            " ORDER BY offset DESC LIMIT 1),"
            " EXISTS (SELECT 1 FROM damage WHERE stream_id=?1 AND segment=?2)",
            (row.id, segment),
            index=True,
        )
        return found[0] or 0, bool(found[1])

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

    # --- cuts ---------------------------------------------------------------------------
    def check_cut(self, row: StreamRow, cut: StreamCut | str) -> StreamCut:
        """`cut` if it is a whole cut of this stream: of this very stream, not of an earlier
        one of its name (`StaleCut`), it names every segment the stream had at that point, and
        no offset lies past a segment's tail; else `InvalidCut`."""
        cut = as_cut(cut).check_stream(row.scope, row.name)
        check_identity(self.catalog, row.id, cut)
        known = {seg for seg, _, _ in self.segments(row)}
        unknown = sorted(set(cut.segments) - known)
        if unknown:
            raise InvalidCut(cut.text, f"{row.qualified} has no segment {unknown[0]}")
        missing = self.missing_segments(row, set(cut.segments))
        if missing:
            reason = (
                f"it does not name segment{'s' if len(missing) > 1 else ''}"
                f" {', '.join(map(str, missing))}, which {row.qualified} had at that point;"
                " a cut names every segment (take cuts from the store: head, tail, a reader"
                " group, an event's offsets)"
            )
            raise InvalidCut(cut.text, reason)
        for seg, off in cut.positions:
            if off < 0:
                raise InvalidCut(cut.text, f"offset {off} of segment {seg} is negative")
            tail = self.catch_up(row, seg)
            if off > tail:
                raise InvalidCut(cut.text, self.past_tail(row, seg, off, tail))
        return cut

    def missing_segments(self, row: StreamRow, named: set[int]) -> list[int]:
        """Segments a cut naming `named` must name too: the original segments, and every
        predecessor and sibling (made by the same scale) of a segment it names."""
        preds = self.predecessors(row)
        required = set(named) | {seg for seg, _, _ in self.segments(row) if seg not in preds}
        frontier = list(required)
        while frontier:
            seg = frontier.pop()
            mine = set(preds.get(seg, []))
            siblings = {s for s, p in preds.items() if mine & set(p)}
            for other in (mine | siblings) - required:
                required.add(other)
                frontier.append(other)
        return sorted(required - named)

    def past_tail(self, row: StreamRow, segment: int, offset: int, tail: int) -> str:
        return (
            f"offset {offset} is past the tail ({tail}) of segment {segment};"
            f" the stream's tail is {self.tail(row).text}"
        )

    def check_boundary(self, row: StreamRow, segment: int, offset: int) -> None:
        """Raise `InvalidCut` unless `offset` is an event boundary of the segment."""
        block = self.block_at(row, segment, offset)
        if block is None or block.offset == offset:
            return  # a block start, the tail, or the start of an empty segment
        try:
            frames = self.block_reader(row, segment).block(block)
        except BadBlock as bad:
            raise self.corrupted(row, segment, bad) from None
        if any(frame[0] == offset for frame in frames):
            return
        msg = (
            f"offset {offset} of segment {segment} is not an event boundary;"
            " use a cut taken from the store (head, tail, an event's offset)"
        )
        raise InvalidCut(text=f"{segment}-{offset}", reason=msg)

    # --- reading ------------------------------------------------------------------------
    def block_reader(self, row: StreamRow, segment: int) -> BlockReader:
        """A reader of the segment's blocks, with this store's buffers and parsed frames."""
        return BlockReader(self.segment_file(row, segment), self.read_buffers, self.parsed_frames)

    def read_segment(
        self,
        row: StreamRow,
        segment: int,
        start: int,
        end: int | None = None,
        reading: Reading = read_events,
    ) -> Iterator:
        """Events of one segment from `start` up to `end` (its tail by default), each block
        checked before its events are returned (`Corrupted` at the first damaged one); with
        `reading=read_batches`, in batches."""
        known = {s for s, _, _ in self.segments(row)}
        if not known:  # only a deleted stream has no segments
            raise StreamNotFound(row.scope, row.name)
        if segment not in known:
            msg = f"{row.qualified} has no segment {segment}"
            raise InvalidCut(text=f"{segment}-{start}", reason=msg)
        for offset in (start, end):
            if offset is not None and (not isinstance(offset, int) or offset < 0):
                msg = f"an offset is a whole number of bytes from 0, not {offset!r}"
                raise InvalidCut(text=f"{segment}-{offset}", reason=msg)
        tail = self.catch_up(row, segment)
        end = tail if end is None else end
        for offset in (start, end):
            if offset > tail:
                msg = self.past_tail(row, segment, offset, tail)
                raise InvalidCut(text=f"{segment}-{offset}", reason=msg)
        if start >= end:  # an empty range reads nothing, even one the head has passed
            return iter(())
        head = self.segment_head(row, segment)
        if start < head:
            raise Truncated(row.qualified, segment, start, head)
        return self._read_range(row, segment, start, end, reading)

    def _read_range(
        self, row: StreamRow, segment: int, start: int, end: int, reading: Reading
    ) -> Iterator:
        self.check_boundary(row, segment, start)
        self.check_boundary(row, segment, end)
        blocks = self.blocks(row, segment, start, end)
        reader = self.block_reader(row, segment)
        try:
            yield from reading(reader, row.qualified, segment, blocks, start=start, end=end)
        except BadBlock as bad:
            raise self.corrupted(row, segment, bad) from None


def commit_landed(
    db: sqlite3.Cursor, row: StreamRow, segment: int, headers: list[BlockHeader]
) -> None:
    """Record as committed the transactions whose one block landed in `segment` (inside `db`'s
    transaction; the blocks are durable).

    A one-segment commit (`transactions.py`) appends its block before anything durable in the
    catalog says it commits, so the block is the commit: a transaction the catalog has `open`
    or `landing` (its catalog rows lost in a power cut, or its process killed before it
    recorded `committed`), or does not know at all, is committed by its block. A transaction
    that lands in several segments is `committing` (synchronous=FULL) before its first block
    lands, and is never touched here.
    """
    for h in headers:
        db.execute(
            "INSERT OR IGNORE INTO txns(txn_id, stream_id, state, created_ns, lease_expiry_ns,"
            " ingest_ns, t_min, t_max, finished_ns) VALUES (?, ?, 'committed', ?, ?, ?, ?, ?, ?)",
            (h.txn_id, row.id, *(h.ingest_ns,) * 3, h.t_min, h.t_max, now_ns()),
        )
        db.execute(
            "UPDATE txns SET state='committed', ingest_ns=?, t_min=?, t_max=?, finished_ns=?"
            " WHERE txn_id=? AND state IN ('open', 'landing')",
            (h.ingest_ns, h.t_min, h.t_max, now_ns(), h.txn_id),
        )
        db.execute(
            "INSERT INTO txn_segments(txn_id, segment, body_len, events, appended_at, done)"
            " VALUES (?, ?, ?, ?, ?, 1) ON CONFLICT DO UPDATE SET body_len=excluded.body_len,"
            " events=excluded.events, appended_at=excluded.appended_at, done=1",
            (h.txn_id, segment, h.body_len, h.events, h.offset),
        )
