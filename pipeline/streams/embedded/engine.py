"""The engine beneath the embedded store: one store directory's catalog, segment files and index.

`Engine` knows a stream by its catalog row (`StreamRow`). It binds the catalog to the data
(store id, manifests), keeps the block index caught up with the segment files, settles torn
tails, marks damaged segments, appends blocks (these four as the `BlockIndex` it extends:
index.py), checks cuts and event boundaries, and reads a segment's events, each block checked
before any of its events is returned. The public store (`store.py`), its writers,
transactions, reader groups, scaling and integrity checks all work through it; it imports none
of them. What is on disk and why it survives a crash: FORMAT.md.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from pipeline.config import FileModes
from pipeline.streams.cut import StreamCut, as_cut
from pipeline.streams.embedded.binding import (
    HeadBlock,
    bind,
    manifest_of,
    refuse_newer_store_file,
)
from pipeline.streams.embedded.blocks import (
    BadBlock,
    encode_event,
    frame_head,
)
from pipeline.streams.embedded.catalog import CLOSED, REBUILDING, Catalog
from pipeline.streams.embedded.identity import check_identity
from pipeline.streams.embedded.index import BlockIndex, StreamRow
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
    StoreUnavailable,
    StreamNotFound,
    StreamSealed,
    StreamStoreError,
    Truncated,
)
from pipeline.streams.names import parse_stream
from pipeline.streams.values import check_event

__all__ = ["Engine", "encode", "encode_pieces"]

#: A payload at least this large is written from the caller's own bytes, one more buffer of
#: the block's `pwritev`, instead of being copied into its frame (a copy into fresh memory
#: costs more than the extra buffer; below this the copy is cheaper).
ZERO_COPY_PAYLOAD = 4096


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


class Engine(BlockIndex):
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

    # --- damage -------------------------------------------------------------------------
    def corrupted(self, row: StreamRow, segment: int, bad: BadBlock) -> StreamStoreError:
        """The error for a block that failed its check: `StreamNotFound` if the stream was
        deleted under the read, `Truncated` if a truncation raced the read past it, else
        `Corrupted`, the segment marked damaged."""
        if self.catalog.query_one("SELECT deleted FROM streams WHERE id=?", (row.id,)) != (0,):
            return StreamNotFound(row.scope, row.name)
        head = self.segment_head(row, segment)
        if bad.offset < head:
            return Truncated(row.qualified, segment, bad.offset, head)
        problem = bad.problem
        if not self.segment_file(row, segment).path.exists():
            problem = "the segment file is missing"
        self.mark_damaged(row, segment, bad.offset, problem)
        return Corrupted(row.qualified, segment, bad.offset, problem)

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
