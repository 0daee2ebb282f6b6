"""Reader groups of the embedded store: named positions shared by readers in any process.

A group stores one committed offset per segment (`rg_positions`). Readers join by id, send a
heartbeat on every read, and own a fair share of the segments (ceil(segments / live readers)).
A reader that stops reading without `close()` (its process killed) keeps its segments until
`ReaderGroup.reader_offline(reader_id)` names it, a new reader with its id joins, or its
heartbeat is older than `READER_TIMEOUT_S`; then its segments are taken over from their
committed positions. Delivery is at-least-once: events read but not committed are read again by
the segment's next owner. Live readers that commit after handling each read hand segments over
at their committed positions, so each event is delivered once. A consumer that stores its
output and `reader.commit()` together, or checkpoints, gets exactly-once: a reader whose
segments were taken over learns it from `ReaderOffline` at its next commit.
"""

from __future__ import annotations

import math
import sqlite3
import time

from pipeline.streams.api import EventReader, ReaderGroup
from pipeline.streams.cut import StreamCut
from pipeline.streams.embedded.catalog import now_ns
from pipeline.streams.embedded.engine import Engine
from pipeline.streams.embedded.index import StreamRow
from pipeline.streams.errors import (
    InvalidArgument,
    ReaderGroupConflict,
    ReaderGroupNotFound,
    ReaderOffline,
)
from pipeline.streams.names import check_name
from pipeline.streams.values import Event, check_count

READER_TIMEOUT_S = 30.0
POLL_INTERVAL_S = 0.02


class EmbeddedReaderGroup(ReaderGroup):
    def __init__(self, engine: Engine, name: str, row: StreamRow) -> None:
        self.engine, self.name, self.row = engine, name, row
        self.stream = row.qualified

    @classmethod
    def open(
        cls, engine: Engine, name: str, row: StreamRow, start: StreamCut | None
    ) -> EmbeddedReaderGroup:
        check_name("reader group", name)
        start = engine.check_cut(row, start) if start else engine.head(row)
        with engine.catalog.write() as db:
            found = db.execute(
                "SELECT stream_id FROM reader_groups WHERE name=?", (name,)
            ).fetchone()
            if found is not None and found[0] != row.id:
                raise ReaderGroupConflict(name, row.qualified, _reads(db, found[0]))
            if found is None:
                for table in ("rg_positions", "rg_readers", "rg_checkpoints"):
                    # rows an earlier Sluice left behind a deleted group
                    db.execute(f"DELETE FROM {table} WHERE group_name=?", (name,))
                db.execute(
                    "INSERT INTO reader_groups(name, stream_id, created_ns) VALUES (?, ?, ?)",
                    (name, row.id, now_ns()),
                )
                db.executemany(
                    "INSERT INTO rg_positions(group_name, segment, offset) VALUES (?, ?, ?)",
                    [(name, seg, off) for seg, off in start.positions],
                )
        return cls(engine, name, row)

    @staticmethod
    def delete(engine: Engine, name: str) -> None:
        with engine.catalog.write() as db:
            if not db.execute("SELECT 1 FROM reader_groups WHERE name=?", (name,)).fetchone():
                raise ReaderGroupNotFound(name)
            for table in ("reader_groups", "rg_positions", "rg_readers", "rg_checkpoints"):
                column = "name" if table == "reader_groups" else "group_name"
                db.execute(f"DELETE FROM {table} WHERE {column}=?", (name,))

    def check_exists(self, db: sqlite3.Cursor) -> None:
        """`ReaderGroupNotFound` unless this group (of this stream) still exists."""
        found = db.execute(
            "SELECT 1 FROM reader_groups WHERE name=? AND stream_id=?", (self.name, self.row.id)
        ).fetchone()
        if found is None:
            raise ReaderGroupNotFound(self.name)

    def reader(self, reader_id: str) -> EventReader:
        """A reader `reader_id` that joins the group. A reader of that id already in it (one
        whose process was killed) is replaced: its segments go back to their committed
        positions, and the old reader gets `ReaderOffline` if it is still running."""
        check_name("reader", reader_id)
        with self.engine.catalog.write() as db:
            self.check_exists(db)
            beat = now_ns()
            db.execute(
                "INSERT OR REPLACE INTO rg_readers(group_name, reader_id, heartbeat_ns)"
                " VALUES (?, ?, ?)",
                (self.name, reader_id, beat),
            )
            self.free_segments(db, reader_id)
        return EmbeddedReader(self, reader_id, beat)

    def reader_offline(self, reader_id: str) -> None:
        check_name("reader", reader_id)
        with self.engine.catalog.write() as db:
            self.check_exists(db)
            db.execute(
                "DELETE FROM rg_readers WHERE group_name=? AND reader_id=?",
                (self.name, reader_id),
            )
            self.free_segments(db, reader_id)

    def free_segments(self, db: sqlite3.Cursor, reader_id: str) -> None:
        """Give the segments `reader_id` owns back, at their committed positions."""
        db.execute(
            "UPDATE rg_positions SET owner=NULL WHERE group_name=? AND owner=?",
            (self.name, reader_id),
        )

    def stream_cut(self) -> StreamCut:
        rows = self.engine.catalog.query(
            "SELECT segment, offset FROM rg_positions WHERE group_name=?", (self.name,)
        )
        if not rows:
            raise ReaderGroupNotFound(self.name)
        return StreamCut.of(self.row.scope, self.row.name, dict(rows), self.row.id)

    def checkpoint(self, name: str) -> StreamCut:
        check_name("checkpoint", name)
        cut = self.stream_cut()
        with self.engine.catalog.write() as db:
            self.check_exists(db)
            db.execute(
                "INSERT OR REPLACE INTO rg_checkpoints(group_name, name, cut, created_ns)"
                " VALUES (?, ?, ?, ?)",
                (self.name, name, cut.text, now_ns()),
            )
        return cut

    def reset(self, cut: StreamCut) -> None:
        cut = self.engine.check_cut(self.row, cut)
        with self.engine.catalog.write() as db:
            self.check_exists(db)
            db.execute("DELETE FROM rg_positions WHERE group_name=?", (self.name,))
            db.executemany(
                "INSERT INTO rg_positions(group_name, segment, offset) VALUES (?, ?, ?)",
                [(self.name, seg, off) for seg, off in cut.positions],
            )


def _reads(db: sqlite3.Cursor, stream_id: int) -> str:
    """What the group of another stream reads, for `ReaderGroupConflict`."""
    found = db.execute(
        "SELECT scope, name, deleted FROM streams WHERE id=?", (stream_id,)
    ).fetchone()
    if found is None or found[2]:
        stream = f" {found[0]}/{found[1]}" if found else ""
        return f"it read a stream{stream} that was deleted since"
    return f"it reads {found[0]}/{found[1]}"


def check_read(max_events: object, timeout: object) -> None:
    """`InvalidArgument` unless a read may return `max_events` (1 or more) and wait `timeout`
    seconds (0 or more; infinity waits until an event comes)."""
    check_count("max_events", max_events, 1, "a read returns 1 or more events")
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout >= 0:
        rule = "a read waits 0 or more seconds (NaN waits forever and is refused)"
        raise InvalidArgument(name="timeout", value=timeout, rule=rule)


class EmbeddedReader(EventReader):
    def __init__(self, group: EmbeddedReaderGroup, reader_id: str, beat: int) -> None:
        self.group, self.reader_id = group, reader_id
        self.engine = group.engine
        self._beat = beat  # the heartbeat last sent: who else sends one replaced this reader
        self._positions: dict[int, int] = {}

    def _heartbeat(self, db: sqlite3.Cursor) -> int:
        """Send a heartbeat and return its time; `ReaderOffline` (after forgetting the segments
        it read) if this reader left the group: `reader_offline` named it, or a new reader
        with its id joined."""
        self.group.check_exists(db)
        now = max(now_ns(), self._beat + 1)
        db.execute(
            "UPDATE rg_readers SET heartbeat_ns=? WHERE group_name=? AND reader_id=?"
            " AND heartbeat_ns=?",
            (now, self.group.name, self.reader_id, self._beat),
        )
        if db.rowcount == 0:
            self._positions.clear()
            reason = (
                "`reader_offline` named it, or a new reader with its id joined the group;"
                " open a new reader to read on"
            )
            raise ReaderOffline(self.group.name, self.reader_id, reason)
        self._beat = now
        return now

    def _rebalance(self) -> None:
        """Heartbeat, then release or acquire segments to hold a fair share of the ready ones.

        A segment is done when it is sealed and the group's committed position is its tail; it
        is ready when it is not done and all its predecessors are (per-key order across a
        scale). Segments created by a scale after the group started join at their beginning,
        offset 0 (a successor truncated before the group reached it raises `Truncated`). A
        segment another reader owns now (this one was presumed dead, or the group was reset)
        is dropped: its owner reads it from the committed position. Predecessors are read in
        the transaction that adds the rows of new segments (a successor never looks like an
        original segment); tails before it (a segment sealed since is not done yet).
        """
        name, me, row = self.group.name, self.reader_id, self.group.row
        sealed = {
            seg: self.engine.catch_up(row, seg)
            for seg, flag in self.engine.catalog.query(
                "SELECT segment, sealed FROM segments WHERE stream_id=?", (row.id,)
            )
            if flag
        }
        with self.engine.catalog.write() as db:
            now = self._heartbeat(db)
            preds: dict[int, list[int]] = {}  # read with the segments the rows are made of
            for seg, pred in db.execute(
                "SELECT segment, predecessor FROM segment_predecessors WHERE stream_id=?",
                (row.id,),
            ):
                preds.setdefault(seg, []).append(pred)
            db.execute(
                "INSERT OR IGNORE INTO rg_positions(group_name, segment, offset)"
                " SELECT ?, segment, 0 FROM segments WHERE stream_id=?",
                (name, row.id),
            )
            live = {
                r
                for (r,) in db.execute(
                    "SELECT reader_id FROM rg_readers WHERE group_name=? AND heartbeat_ns>=?",
                    (name, now - int(READER_TIMEOUT_S * 1e9)),
                )
            } | {me}
            rows = db.execute(
                "SELECT segment, offset, owner FROM rg_positions WHERE group_name=?"
                " ORDER BY segment",
                (name,),
            ).fetchall()
            owners = {seg: owner for seg, _, owner in rows}
            for seg in [s for s in self._positions if owners.get(s) != me]:
                del self._positions[seg]
            done = {seg for seg, off, _ in rows if seg in sealed and off >= sealed[seg]}
            ready = [
                (seg, off, owner)
                for seg, off, owner in rows
                if seg not in done and all(p in done for p in preds.get(seg, []))
            ]
            for seg in [s for s in self._positions if s in done]:
                self._release(db, seg)
            fair = math.ceil(len(ready) / len(live)) if ready else 0
            mine = [seg for seg, _, owner in ready if seg in self._positions]
            for seg in mine[fair:]:
                self._release(db, seg)
            for seg, off, owner in ready:
                free = owner is None or owner not in live or owner == me
                if free and seg not in self._positions and len(self._positions) < fair:
                    db.execute(
                        "UPDATE rg_positions SET owner=? WHERE group_name=? AND segment=?",
                        (me, name, seg),
                    )
                    self._positions[seg] = off

    def _release(self, db: sqlite3.Cursor, segment: int) -> None:
        """Give a segment back; its next owner starts from the committed position."""
        self._positions.pop(segment, None)
        db.execute(
            "UPDATE rg_positions SET owner=NULL WHERE group_name=? AND segment=? AND owner=?",
            (self.group.name, segment, self.reader_id),
        )

    def read(self, max_events: int = 1000, timeout: float = 0.0) -> list[Event]:
        check_read(max_events, timeout)
        deadline = time.monotonic() + timeout
        while True:
            self._rebalance()
            events: list[Event] = []
            for seg in sorted(self._positions):
                for event in self.engine.read_segment(self.group.row, seg, self._positions[seg]):
                    events.append(event)
                    self._positions[seg] = event.end_offset
                    if len(events) >= max_events:
                        return events
            if events or time.monotonic() >= deadline:
                return events
            time.sleep(POLL_INTERVAL_S)

    def commit(self) -> None:
        """Record the positions read so far; `ReaderOffline` names the segments that other
        readers took over meanwhile (their events since the last commit are read again)."""
        name, me = self.group.name, self.reader_id
        lost = []
        with self.engine.catalog.write() as db:
            self._heartbeat(db)
            for seg, off in self._positions.items():
                db.execute(
                    "UPDATE rg_positions SET offset=? WHERE group_name=? AND segment=? AND owner=?",
                    (off, name, seg, me),
                )
                if db.rowcount == 0:
                    lost.append(seg)
        if lost:
            for seg in lost:
                del self._positions[seg]
            reason = (
                f"it read nothing for over {READER_TIMEOUT_S:g} s, so the group presumed it"
                f" dead and gave segment(s) {', '.join(map(str, lost))} to other readers;"
                " it reads on with the segments it is given"
            )
            raise ReaderOffline(name, me, reason)

    def close(self) -> None:
        """Commit the positions read so far, then leave the group (a reader that left it
        already, or whose group was deleted, just stops)."""
        try:
            self.commit()
        finally:
            self._positions.clear()
            with self.engine.catalog.write() as db:
                db.execute(
                    "DELETE FROM rg_readers WHERE group_name=? AND reader_id=? AND heartbeat_ns=?",
                    (self.group.name, self.reader_id, self._beat),
                )
                if db.rowcount:  # still this reader's segments, not a successor's
                    self.group.free_segments(db, self.reader_id)
