"""Reader groups of the embedded store: named positions shared by readers in any process.

A group stores one committed offset per segment (`rg_positions`). Readers join by id, send a
heartbeat on every read, and own a fair share of the segments (ceil(segments / live readers));
a reader whose heartbeat is older than `READER_TIMEOUT_S` is presumed dead and its segments are
taken over from their committed positions. Delivery is at-least-once: events read but not
committed are read again by the segment's next owner. A consumer that stores its output and
`reader.commit()` together, or checkpoints, gets exactly-once.
"""

from __future__ import annotations

import math
import sqlite3
import time

from pipeline.streams.api import Event, EventReader, ReaderGroup
from pipeline.streams.cut import StreamCut
from pipeline.streams.embedded.catalog import now_ns
from pipeline.streams.embedded.engine import Engine, StreamRow
from pipeline.streams.errors import InvalidName, ReaderGroupNotFound
from pipeline.streams.names import check_name

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
                raise InvalidName(kind="reader group", name=name, reason="it reads another stream")
            if found is None:
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

    def reader(self, reader_id: str) -> EventReader:
        check_name("reader", reader_id)
        with self.engine.catalog.write() as db:
            db.execute(
                "INSERT OR REPLACE INTO rg_readers(group_name, reader_id, heartbeat_ns)"
                " VALUES (?, ?, ?)",
                (self.name, reader_id, now_ns()),
            )
        return EmbeddedReader(self, reader_id)

    def stream_cut(self) -> StreamCut:
        rows = self.engine.catalog.query(
            "SELECT segment, offset FROM rg_positions WHERE group_name=?", (self.name,)
        )
        if not rows:
            raise ReaderGroupNotFound(self.name)
        return StreamCut.of(self.row.scope, self.row.name, dict(rows))

    def checkpoint(self, name: str) -> StreamCut:
        cut = self.stream_cut()
        with self.engine.catalog.write() as db:
            db.execute(
                "INSERT OR REPLACE INTO rg_checkpoints(group_name, name, cut, created_ns)"
                " VALUES (?, ?, ?, ?)",
                (self.name, name, cut.text, now_ns()),
            )
        return cut

    def reset(self, cut: StreamCut) -> None:
        cut = self.engine.check_cut(self.row, cut)
        with self.engine.catalog.write() as db:
            db.execute("DELETE FROM rg_positions WHERE group_name=?", (self.name,))
            db.executemany(
                "INSERT INTO rg_positions(group_name, segment, offset) VALUES (?, ?, ?)",
                [(self.name, seg, off) for seg, off in cut.positions],
            )


class EmbeddedReader(EventReader):
    def __init__(self, group: EmbeddedReaderGroup, reader_id: str) -> None:
        self.group, self.reader_id = group, reader_id
        self.engine = group.engine
        self._positions: dict[int, int] = {}

    def _rebalance(self) -> None:
        """Heartbeat, then release or acquire segments to hold a fair share of the ready ones.

        A segment is done when it is sealed and the group's committed position is its tail; it
        is ready when it is not done and all its predecessors are (per-key order across a
        scale). Segments created by a scale after the group started join at their beginning,
        offset 0 (a successor truncated before the group reached it raises `Truncated`).
        """
        now = now_ns()
        dead_before = now - int(READER_TIMEOUT_S * 1e9)
        name, me, row = self.group.name, self.reader_id, self.group.row
        sealed = {
            seg: self.engine.catch_up(row, seg)
            for seg, flag in self.engine.catalog.query(
                "SELECT segment, sealed FROM segments WHERE stream_id=?", (row.id,)
            )
            if flag
        }
        preds = self.engine.predecessors(row)
        with self.engine.catalog.write() as db:
            db.execute(
                "UPDATE rg_readers SET heartbeat_ns=? WHERE group_name=? AND reader_id=?",
                (now, name, me),
            )
            db.execute(
                "INSERT OR IGNORE INTO rg_positions(group_name, segment, offset)"
                " SELECT ?, segment, 0 FROM segments WHERE stream_id=?",
                (name, row.id),
            )
            live = {
                r
                for (r,) in db.execute(
                    "SELECT reader_id FROM rg_readers WHERE group_name=? AND heartbeat_ns>=?",
                    (name, dead_before),
                )
            } | {me}
            rows = db.execute(
                "SELECT segment, offset, owner FROM rg_positions WHERE group_name=?"
                " ORDER BY segment",
                (name,),
            ).fetchall()
            done = {seg for seg, off, _ in rows if seg in sealed and off >= sealed[seg]}
            ready = [
                (seg, off, owner)
                for seg, off, owner in rows
                if seg not in done and all(p in done for p in preds.get(seg, []))
            ]
            for seg in [s for s in self._positions if s in done]:
                self._release(db, seg)
            fair = math.ceil(len(ready) / len(live)) if ready else 0
            mine = [seg for seg, _, owner in ready if owner == me]
            for seg in mine[fair:]:
                self._release(db, seg)
            for seg, off, owner in ready:
                free = owner is None or owner not in live
                if free and len(self._positions) < fair:
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
        with self.engine.catalog.write() as db:
            db.executemany(
                "UPDATE rg_positions SET offset=? WHERE group_name=? AND segment=? AND owner=?",
                [
                    (off, self.group.name, seg, self.reader_id)
                    for seg, off in self._positions.items()
                ],
            )

    def close(self) -> None:
        """Commit the positions read so far, then leave the group."""
        self.commit()
        with self.engine.catalog.write() as db:
            for seg in list(self._positions):
                self._release(db, seg)
            db.execute(
                "DELETE FROM rg_readers WHERE group_name=? AND reader_id=?",
                (self.group.name, self.reader_id),
            )
