"""What an embedded transaction is on disk: its catalog rows and the bodies of its flushed events.

A transaction's row in `txns` (state, lease, the commit's ingest time and bounds) is recorded
by the first catalog write about it; until then its id carries its `open` row (`txn_ids`).
Its flushed events are in one body file per segment, txn/<id>.<segment>.body, of which only
the length and CRC recorded in `txn_segments` count: bytes past them are a crash's leftovers,
written over by the next flush. A body is read back checked against its recorded CRC before it
lands in a block. `EmbeddedTransaction` (`transactions.py`) commits and aborts over this
record; FORMAT.md ("Transactions") says why each step survives a crash.
"""

from __future__ import annotations

import errno
import os
import sqlite3
from pathlib import Path

from pipeline.durable import fsync_dir
from pipeline.streams.embedded import txn_ids
from pipeline.streams.embedded.blocks import body_checksum, body_magic, checksum_for, encode_header
from pipeline.streams.embedded.engine import Engine
from pipeline.streams.embedded.index import StreamRow
from pipeline.streams.embedded.space import out_of_space
from pipeline.streams.errors import TxnFailed, TxnNotFound

BODY_READ_CHUNK = 64 << 20
BodyRow = tuple[int, int, int, int]  # segment, recorded body length, events, running CRC


class TxnRecord:
    """The catalog rows and body files of one transaction of one stream (`txn_id` of `row`);
    the events written since its last flush are in `_pending`, by segment."""

    engine: Engine
    row: StreamRow
    txn_id: str
    _pending: dict[int, list[bytes]]

    def _carried(self) -> tuple[int, int]:
        """(created_ns, lease_expiry_ns) that the id carries, for a transaction the catalog
        has no row of; `TxnNotFound` if it carries none for this stream of this store, or
        predates the catalog's last rebuild."""
        begun = txn_ids.begin_row(self.engine.store_id, self.row.id, self.txn_id)
        rebuilt = self.engine.catalog.query_one("SELECT value FROM meta WHERE key='rebuilt_ns'")
        if begun is None or (rebuilt is not None and begun[0] < int(rebuilt[0])):
            raise TxnNotFound(self.txn_id)
        return begun

    def _state_row(self, db: sqlite3.Cursor) -> tuple[str, int]:
        """State and lease expiry inside a catalog write; the `open` row the id carries is
        recorded in it if the catalog has none yet."""
        found = db.execute(
            "SELECT state, lease_expiry_ns, stream_id FROM txns WHERE txn_id=?", (self.txn_id,)
        ).fetchone()
        if found is None:
            created, expiry = self._carried()
            db.execute(
                "INSERT INTO txns(txn_id, stream_id, state, created_ns, lease_expiry_ns)"
                " VALUES (?, ?, 'open', ?, ?)",
                (self.txn_id, self.row.id, created, expiry),
            )
            return "open", expiry
        if found[2] != self.row.id:
            raise TxnNotFound(self.txn_id)
        return found[0], found[1]

    @property
    def _dir(self) -> Path:
        return self.engine.root / "txn"

    def _body_path(self, segment: int) -> Path:
        return self._dir / f"{self.txn_id}.{segment}.body"

    def _raw_state(self) -> str:
        found = self.engine.catalog.query_one(
            "SELECT state, stream_id FROM txns WHERE txn_id=?", (self.txn_id,)
        )
        if found is None:
            self._carried()
            return "open"
        if found[1] != self.row.id:
            raise TxnNotFound(self.txn_id)
        return found[0]

    def _write_pending(self) -> list[BodyRow]:
        """Write the pending events past the recorded ends of their bodies and fsync them; the
        rows returned make them part of the transaction once recorded (nothing before)."""
        if not self._pending:
            return []
        if not self._dir.exists():
            self._dir.mkdir(mode=self.engine.modes.directory, parents=True, exist_ok=True)
            fsync_dir(self._dir.parent)
        return [self._write_body(seg, frames) for seg, frames in sorted(self._pending.items())]

    def _write_body(self, segment: int, frames: list[bytes]) -> BodyRow:
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
        crc = body_checksum(crc, body_len, data)
        return segment, body_len + len(data), events + len(frames), crc

    def _upsert(self, db: sqlite3.Cursor, rows: list[BodyRow]) -> None:
        db.executemany(
            "INSERT INTO txn_segments(txn_id, segment, body_len, events, body_crc)"
            " VALUES (?, ?, ?, ?, ?) ON CONFLICT DO UPDATE SET body_len=excluded.body_len,"
            " events=excluded.events, body_crc=excluded.body_crc",
            [(self.txn_id, *row) for row in rows],
        )

    def _header(
        self, ingest_ns: int, bounds: tuple[int, int] | None, body_len: int, events: int, crc: int
    ) -> bytes:
        return encode_header(
            body_crc=crc,
            body_len=body_len,
            events=events,
            ingest_ns=ingest_ns,
            time_bounds=bounds,
            meta=b"t" + self.txn_id.encode(),
            magic=body_magic(crc, body_len),
        )

    def _checked_body(self, segment: int, body_len: int, body_crc: int) -> list[bytes]:
        """The flushed body of a segment, checked against its recorded length and CRC: never
        land a block that would fail its own checksum."""
        chunks = self._body(segment, body_len)
        sums, found = checksum_for(body_magic(body_crc, body_len)), 0
        for chunk in chunks:
            found = sums(chunk, found)
        if found != body_crc & 0xFFFFFFFF:
            msg = f"its flushed events for segment {segment} are damaged (checksum mismatch)"
            raise TxnFailed(self.txn_id, "committing", msg)
        return chunks

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

    def _remove_bodies(self) -> None:
        for path in self._dir.glob(f"{self.txn_id}.*.body"):
            path.unlink(missing_ok=True)
