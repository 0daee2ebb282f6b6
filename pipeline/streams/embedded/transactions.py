"""Transactions of the embedded store: durable, atomic, contiguous, committable after a crash.

    open --flush--> (events fsynced in txn/<id>.<segment>.body, length+CRC in txn_segments)
    open --commit--> committing --(one block per segment appended)--> committed
    open --abort--> aborted

Exactly-once: each segment gets one block holding all of the transaction's events for it, so a
reader sees all of them or none, and a commit that crashed half-way is rolled forward by the
next `commit()` on the same id, from any process. How each step is made durable: FORMAT.md.
"""

from __future__ import annotations

import errno
import os
import uuid
from collections import defaultdict
from pathlib import Path

from pipeline.durable import fsync_dir
from pipeline.streams.api import Transaction, TxnState
from pipeline.streams.embedded.blocks import (
    BadBlock,
    crc32,
    encode_header,
    iter_frames,
    parse_header,
)
from pipeline.streams.embedded.catalog import now_ns
from pipeline.streams.embedded.engine import Engine, StreamRow, encode
from pipeline.streams.embedded.routing import route
from pipeline.streams.embedded.space import out_of_space
from pipeline.streams.errors import SegmentDamaged, TxnFailed, TxnNotFound

BODY_READ_CHUNK = 64 << 20


class EmbeddedTransaction(Transaction):
    def __init__(self, engine: Engine, row: StreamRow, txn_id: str) -> None:
        self.engine, self.row, self.txn_id = engine, row, txn_id
        self.stream = row.qualified
        self._pending: dict[int, list[bytes]] = defaultdict(list)
        self._active = engine.segments(row, active_only=True)

    @classmethod
    def begin(cls, engine: Engine, row: StreamRow, lease_seconds: float) -> EmbeddedTransaction:
        engine.check_writable(row)
        txn_id = uuid.uuid4().hex
        created = now_ns()
        with engine.catalog.write() as db:
            db.execute(
                "INSERT INTO txns(txn_id, stream_id, state, created_ns, lease_expiry_ns)"
                " VALUES (?, ?, 'open', ?, ?)",
                (txn_id, row.id, created, created + int(lease_seconds * 1e9)),
            )
        return cls(engine, row, txn_id)

    @classmethod
    def lookup(cls, engine: Engine, row: StreamRow, txn_id: str) -> EmbeddedTransaction:
        found = engine.catalog.query_one(
            "SELECT stream_id FROM txns WHERE txn_id=?", (str(txn_id),)
        )
        if found is None or found[0] != row.id:
            raise TxnNotFound(str(txn_id))
        return cls(engine, row, txn_id)

    @property
    def _dir(self) -> Path:
        return self.engine.root / "txn"

    def _body_path(self, segment: int) -> Path:
        return self._dir / f"{self.txn_id}.{segment}.body"

    def state(self) -> TxnState:
        found = self.engine.catalog.query_one(
            "SELECT state FROM txns WHERE txn_id=?", (self.txn_id,)
        )
        if found is None:
            raise TxnNotFound(self.txn_id)
        return found[0]

    def _require_open(self, action: str) -> None:
        state, expiry = self.engine.catalog.query_one(
            "SELECT state, lease_expiry_ns FROM txns WHERE txn_id=?", (self.txn_id,)
        )
        if state != "open":
            raise TxnFailed(self.txn_id, state, f"it is {state}, so it cannot {action}")
        if now_ns() > expiry:
            self.abort()
            raise TxnFailed(self.txn_id, "aborted", "its lease expired; it has been aborted")

    def write(self, payload: bytes, routing_key: str | None = None) -> None:
        frame = encode(payload, routing_key)
        if not self._active:
            self.engine.check_writable(self.row)
        self._pending[route(self._active, routing_key)].append(frame)

    def flush(self) -> None:
        if not self._pending:
            return
        self._require_open("take more events")
        if not self._dir.exists():
            self._dir.mkdir(mode=self.engine.modes.directory, parents=True, exist_ok=True)
            fsync_dir(self._dir.parent)
        for segment, frames in sorted(self._pending.items()):
            self._flush_segment(segment, frames)
        self._pending.clear()

    def _flush_segment(self, segment: int, frames: list[bytes]) -> None:
        self._record([self._write_body(segment, frames)])

    def _write_body(self, segment: int, frames: list[bytes]) -> tuple[int, int, int, int]:
        """Append frames past the recorded length of a body file and fsync them; return the
        row (segment, length, events, crc) that makes them part of the transaction."""
        found = self.engine.catalog.query_one(
            "SELECT body_len, events, body_crc FROM txn_segments WHERE txn_id=? AND segment=?",
            (self.txn_id, segment),
        )
        body_len, events, crc = found or (0, 0, 0)
        path = self._body_path(segment)
        new_file = not path.exists()
        data = b"".join(frames)
        with out_of_space(path):  # the recorded length is the truth: nothing past it counts
            fd = os.open(path, os.O_RDWR | os.O_CREAT, self.engine.modes.file)
            try:
                written = os.pwrite(fd, data, body_len)  # over whatever a crash left there
                if written != len(data):
                    raise OSError(errno.ENOSPC, f"short write: {written} of {len(data)} bytes")
                os.ftruncate(fd, body_len + len(data))
                os.fdatasync(fd)
            finally:
                os.close(fd)
            if new_file:
                fsync_dir(self._dir)
        return segment, body_len + len(data), events + len(frames), crc32(data, crc)

    def _record(self, rows: list[tuple[int, int, int, int]], drop: tuple[int, ...] = ()) -> None:
        with self.engine.catalog.write() as db:
            db.executemany(
                "INSERT INTO txn_segments(txn_id, segment, body_len, events, body_crc)"
                " VALUES (?, ?, ?, ?, ?) ON CONFLICT DO UPDATE SET body_len=excluded.body_len,"
                " events=excluded.events, body_crc=excluded.body_crc",
                [(self.txn_id, *row) for row in rows],
            )
            db.executemany(
                "DELETE FROM txn_segments WHERE txn_id=? AND segment=?",
                [(self.txn_id, seg) for seg in drop],
            )

    def _rebase(self) -> None:
        """Move events routed to segments sealed since (by a scale) onto their successors.

        The moved frames are written past the recorded ends of the successors' bodies first;
        one catalog transaction then adopts them and drops the sealed segments' rows, so a
        crash in between leaves the transaction as it was."""
        rows = self.engine.catalog.query(
            "SELECT segment, body_len FROM txn_segments WHERE txn_id=?", (self.txn_id,)
        )
        sealed = [(s, n) for s, n in rows if self.engine.segment_sealed(self.row, s)]
        if not sealed:
            return
        self._active = self.engine.segments(self.row, active_only=True)
        moved: dict[int, list[bytes]] = defaultdict(list)
        for segment, body_len in sealed:
            body = b"".join(self._body(segment, body_len))
            try:
                for key, frame in iter_frames(body):
                    moved[route(self._active, key)].append(frame)
            except BadBlock as bad:
                msg = f"its flushed events for segment {segment} are damaged ({bad.problem})"
                raise TxnFailed(self.txn_id, "open", msg) from None
        self._record(
            [self._write_body(s, frames) for s, frames in sorted(moved.items())],
            drop=tuple(s for s, _ in sealed),
        )
        for segment, _ in sealed:
            self._body_path(segment).unlink(missing_ok=True)

    def commit(self, time_bounds: tuple[int, int] | None = None) -> None:
        state = self.state()
        if state == "committed":
            return
        if state == "open":
            self.flush()
            self._require_open("be committed")
            self.engine.check_writable(self.row)
            while not self._mark_committing(time_bounds):
                self._rebase()
        elif state != "committing":
            raise TxnFailed(self.txn_id, state, f"it was {state}")
        self._roll_forward()

    def _mark_committing(self, time_bounds: tuple[int, int] | None) -> bool:
        """Enter `committing` unless a target segment is sealed (then rebase first).

        One catalog transaction, so a concurrent scale either seals first (and we rebase) or
        sees us committing (and refuses to seal a segment we are landing in)."""
        t_min, t_max = time_bounds if time_bounds is not None else (None, None)
        with self.engine.catalog.write() as db:
            sealed = db.execute(
                "SELECT COUNT(*) FROM txn_segments ts JOIN segments s"
                " ON s.stream_id=? AND s.segment=ts.segment WHERE ts.txn_id=? AND s.sealed=1",
                (self.row.id, self.txn_id),
            ).fetchone()[0]
            if sealed:
                return False
            damaged = db.execute(
                "SELECT d.segment, d.offset, d.problem FROM txn_segments ts JOIN damage d"
                " ON d.stream_id=? AND d.segment=ts.segment WHERE ts.txn_id=? LIMIT 1",
                (self.row.id, self.txn_id),
            ).fetchone()
            if damaged:  # refused while still open: it commits once `repair` has run
                raise SegmentDamaged(self.row.qualified, *damaged)
            db.execute(
                "UPDATE txns SET state='committing', ingest_ns=?, t_min=?, t_max=?"
                " WHERE txn_id=? AND state='open'",
                (now_ns(), t_min, t_max, self.txn_id),
            )
        return True

    def _roll_forward(self) -> None:
        ingest_ns, t_min, t_max = self.engine.catalog.query_one(
            "SELECT ingest_ns, t_min, t_max FROM txns WHERE txn_id=?", (self.txn_id,)
        )
        bounds = (t_min, t_max) if t_min is not None else None
        rows = self.engine.catalog.query(
            "SELECT segment, body_len, events, body_crc, appended_at FROM txn_segments"
            " WHERE txn_id=? AND done=0 ORDER BY segment",
            (self.txn_id,),
        )
        for segment, body_len, events, crc, appended_at in rows:
            header = encode_header(
                body_crc=crc,
                body_len=body_len,
                events=events,
                ingest_ns=ingest_ns,
                time_bounds=bounds,
                meta=b"t" + self.txn_id.encode(),
            )
            self._land(segment, header, (body_len, crc), appended_at)
        with self.engine.catalog.write() as db:
            db.execute(
                "UPDATE txns SET state='committed', finished_ns=? WHERE txn_id=?",
                (now_ns(), self.txn_id),
            )
        self._remove_bodies()

    def _land(
        self, segment: int, header: bytes, body: tuple[int, int], appended_at: int | None
    ) -> None:
        """Append this transaction's block to one segment unless an earlier try already did;
        `body` is the recorded (length, CRC) of its flushed events."""
        body_len, body_crc = body
        segfile = self.engine.segment_file(self.row, segment)
        with segfile.locked():
            at = self.engine.catch_up(self.row, segment)
            if appended_at is not None and self._block_is_mine(segment, appended_at):
                self._mark_done(segment)
                return
            with self.engine.catalog.write() as db:
                db.execute(
                    "UPDATE txn_segments SET appended_at=? WHERE txn_id=? AND segment=?",
                    (at, self.txn_id, segment),
                )
            chunks = self._body(segment, body_len)
            found = 0
            for chunk in chunks:
                found = crc32(chunk, found)
            if found != body_crc:  # never land a block that would fail its own checksum
                msg = f"its flushed events for segment {segment} are damaged (checksum mismatch)"
                raise TxnFailed(self.txn_id, "committing", msg)
            self.engine.append_block(self.row, segment, header, chunks)
        self._mark_done(segment)

    def _block_is_mine(self, segment: int, offset: int) -> bool:
        block = self.engine.block_at(self.row, segment, offset)
        if block is None or block.offset != offset:
            return False
        data = self.engine.segment_file(self.row, segment).pread(block.length, offset)
        parsed = parse_header(data, 0, offset)
        return parsed is not None and parsed.txn_id == self.txn_id

    def _body(self, segment: int, body_len: int) -> list[bytes]:
        if body_len == 0:
            return []
        chunks, pos = [], 0
        with self._body_path(segment).open("rb") as fh:
            while pos < body_len:
                chunk = fh.read(min(BODY_READ_CHUNK, body_len - pos))
                if not chunk:
                    msg = f"transaction {self.txn_id} lost flushed data of segment {segment}"
                    raise TxnFailed(self.txn_id, "committing", msg)
                chunks.append(chunk)
                pos += len(chunk)
        return chunks

    def _mark_done(self, segment: int) -> None:
        # derivable (the block at appended_at names this transaction): no fsync needed
        with self.engine.catalog.write(self.engine.catalog.index) as db:
            db.execute(
                "UPDATE txn_segments SET done=1 WHERE txn_id=? AND segment=?",
                (self.txn_id, segment),
            )

    def _remove_bodies(self) -> None:
        for path in self._dir.glob(f"{self.txn_id}.*.body"):
            path.unlink(missing_ok=True)

    def abort(self) -> None:
        with self.engine.catalog.write() as db:
            state = db.execute("SELECT state FROM txns WHERE txn_id=?", (self.txn_id,)).fetchone()[
                0
            ]
            if state in ("committing", "committed"):
                raise TxnFailed(self.txn_id, state, "it is already committed; it cannot be aborted")
            db.execute(
                "UPDATE txns SET state='aborted', finished_ns=? WHERE txn_id=?",
                (now_ns(), self.txn_id),
            )
        self._pending.clear()
        self._remove_bodies()
