"""The block index beneath the engine: which valid blocks each segment file holds, kept current.

`BlockIndex` holds one store directory's segment files and the catalog's index of their blocks
(`blocks`, and each writer's last event number in `writers`). It indexes the blocks that any
process appended past the indexed end (catch-up), settles torn tails (cut, or marked damaged
when valid blocks follow them), records damage, appends blocks, and finds the block that holds
an offset. A transaction's block that a catch-up finds commits its transaction
(`commit_landed`). `Engine` (engine.py) is built on it; what is on disk and why it survives a
crash: FORMAT.md.
"""

from __future__ import annotations

import sqlite3
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from pipeline.config import FileModes
from pipeline.streams.embedded.blocks import BlockHeader, BlockRow, parse_header
from pipeline.streams.embedded.catalog import Catalog, now_ns
from pipeline.streams.embedded.manifest import stream_dir
from pipeline.streams.embedded.segment import SegmentFile
from pipeline.streams.errors import SegmentDamaged, StreamNotFound, StreamStoreError


@dataclass(frozen=True, slots=True)
class StreamRow:
    """A live stream's row in the catalog: its id names its directory under `data/`."""

    id: int
    scope: str
    name: str

    @property
    def qualified(self) -> str:
        return f"{self.scope}/{self.name}"


class BlockIndex:
    """The segment files of one store directory and the block index over them, shared by
    every part of the store (`Engine` opens the catalog and sets these up)."""

    root: Path
    modes: FileModes
    catalog: Catalog
    _files: dict[tuple[int, int], SegmentFile]
    _removed: set[int]

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
            if not segfile.path.exists():
                problem = (
                    f"the segment file is missing ({segfile.path.name}; its index ends at {start})"
                )
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
        at = self.writable_end(row, segment)
        end = segfile.append(at, [header, *body])
        parsed = parse_header(memoryview(header), 0, at)
        assert parsed is not None and parsed.end == end
        self.index_blocks(row, segment, [parsed])
        return at

    def writable_end(self, row: StreamRow, segment: int) -> int:
        """Where the next block of a segment goes, its valid end (caller holds its lock): the
        blocks others appended are indexed and a torn tail is cut first. `SegmentDamaged` when
        the segment is damaged (or found so now)."""
        at, damaged = self._indexed_end_and_damage(row, segment)
        if damaged or self.segment_file(row, segment).size() != at:
            at = self.catch_up(row, segment)  # others appended, a torn tail, damage: look
            self.settle_tail(row, segment, at)
            self.check_undamaged(row, segment)
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
