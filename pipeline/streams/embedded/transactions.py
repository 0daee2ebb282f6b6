"""Transactions of the embedded store: durable, atomic, contiguous, committable after a crash.

    begin --> open (nothing written: the id carries the row, see `txn_ids`)
    open --flush--> (events fsynced in txn/<id>.<segment>.body, length+CRC in txn_segments)
    open --commit, one segment--> landing --(its block appended, fsynced)--> committed
    open --commit, several--> committing --(one block per segment appended)--> committed
    open --abort--> aborted

Exactly-once: each segment gets one block holding all of the transaction's events for it, so a
reader sees all of them or none. A one-segment commit appends its block straight from memory
(and its flushed body): the block is the commit, and whoever finds it commits the transaction
in the catalog (`index.commit_landed`); one that died before its block was whole goes back to
`open`. A commit over several segments records them all `committing` first and is rolled
forward by the next `commit()` on the same id, from any process, or by sealing the stream
(which settles every decided commit first: nothing lands after it). What a transaction is on
disk (its catalog rows, its body files): `txn_record.py`. How each step is made durable, and
why each crash point is safe: FORMAT.md ("Transactions").
"""

from __future__ import annotations

import sqlite3
from collections import defaultdict
from contextlib import ExitStack, suppress
from typing import Literal, NoReturn

from pipeline.streams.api import Transaction
from pipeline.streams.embedded import txn_ids
from pipeline.streams.embedded.blocks import (
    BadBlock,
    BlockHeader,
    body_checksum,
    iter_frames,
    parse_header,
)
from pipeline.streams.embedded.catalog import now_ns
from pipeline.streams.embedded.engine import Engine, encode
from pipeline.streams.embedded.index import StreamRow
from pipeline.streams.embedded.routing import route
from pipeline.streams.embedded.segment import SegmentFile
from pipeline.streams.embedded.txn_record import BodyRow, TxnRecord
from pipeline.streams.errors import SegmentDamaged, TxnFailed
from pipeline.streams.values import TxnState, check_lease, check_time_bounds


def unsettled(engine: Engine, row: StreamRow) -> list[str]:
    """The stream's transactions whose commit was decided and may still add a block to it:
    `committing` with a segment not done, or `landing` (`EmbeddedTransaction.settle`)."""
    return [
        txn_id
        for (txn_id,) in engine.catalog.query(
            "SELECT txn_id FROM txns t WHERE stream_id=? AND (state='landing' OR"
            " (state='committing' AND EXISTS (SELECT 1 FROM txn_segments ts"
            " WHERE ts.txn_id=t.txn_id AND ts.done=0)))",
            (row.id,),
        )
    ]


class EmbeddedTransaction(TxnRecord, Transaction):
    def __init__(self, engine: Engine, row: StreamRow, txn_id: str) -> None:
        self.engine, self.row, self.txn_id = engine, row, txn_id
        self.stream = row.qualified
        self._pending: dict[int, list[bytes]] = defaultdict(list)
        self._active = engine.segments(row, active_only=True)

    @classmethod
    def begin(cls, engine: Engine, row: StreamRow, lease_seconds: float) -> EmbeddedTransaction:
        """Issue the transaction's id and write nothing: the id carries its `open` row
        (`txn_ids`), which the first catalog write about it records (a flush, the commit, an
        abort); until then every process reads the row from the id."""
        engine.check_writable(row)
        created = now_ns()
        expiry = created + int(check_lease(lease_seconds) * 1e9)
        return cls(engine, row, txn_ids.issue(engine.store_id, row.id, created, expiry))

    @classmethod
    def lookup(cls, engine: Engine, row: StreamRow, txn_id: str) -> EmbeddedTransaction:
        """The transaction `txn_id` of this stream: one the catalog knows, or one whose id
        this store issued for this stream (its row not recorded yet, or lost in a power cut),
        unless it was issued before `repair` rebuilt the catalog (that catalog lost more than
        a begin row); else `TxnNotFound`."""
        txn = cls(engine, row, str(txn_id))
        txn._raw_state()
        return txn

    def state(self) -> TxnState:
        """The transaction's state; `open` only once no block of it is in any segment (a
        one-segment commit whose catalog rows a power cut lost is found committed)."""
        state = self._settled_state()
        while state in ("open", "landing"):
            self._catch_up_all()
            if (state := self._settled_state()) == "open":
                break
        return state

    def _settled_state(self) -> str:
        """The state, once a one-segment commit left `landing` by a process that died has been
        settled: committed if its block landed whole, else open again. A live committer holds
        the segment's lock while it lands, so taking the lock waits for it."""
        state = self._raw_state()
        if state != "landing":
            return state
        found = self.engine.catalog.query_one(
            "SELECT segment FROM txn_segments WHERE txn_id=? AND appended_at IS NOT NULL",
            (self.txn_id,),
        )
        if found is None:  # committed meanwhile (`commit_landed` rewrote the rows)
            return self._raw_state()
        with self.engine.segment_file(self.row, found[0]).locked():
            if self._raw_state() == "landing":
                self.engine.catch_up(self.row, found[0])  # a whole block commits it
                if self._raw_state() == "landing":
                    self._unland()
        return self._raw_state()

    def _catch_up_all(self) -> None:
        """Index every segment's new blocks: a block of this transaction commits it."""
        for segment, _, _ in self.engine.segments(self.row):
            if self.engine.segment_file(self.row, segment).path.exists():
                self.engine.catch_up(self.row, segment)

    def _require_open(self, action: str) -> None:
        state = self._settled_state()
        found = self.engine.catalog.query_one(
            "SELECT lease_expiry_ns FROM txns WHERE txn_id=?", (self.txn_id,)
        )
        expiry = found[0] if found else self._carried()[1]
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
        self._record(self._write_pending())
        self._pending.clear()

    def _record(self, rows: list[BodyRow], drop: tuple[int, ...] = ()) -> None:
        """Make the bodies just written part of the transaction, if it is still open: another
        thread or process may have aborted or committed it since this one checked."""
        with self.engine.catalog.write() as db:
            state, _ = self._state_row(db)  # the flushed events' transaction is recorded with them
            if state == "open":
                self._upsert(db, rows)
                db.executemany(
                    "DELETE FROM txn_segments WHERE txn_id=? AND segment=?",
                    [(self.txn_id, seg) for seg in drop],
                )
        if state != "open":
            if state in ("aborted", "committed"):  # what we wrote after they removed theirs
                self._remove_bodies()
            raise TxnFailed(self.txn_id, state, f"it is {state}, so it cannot take more events")

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
        if not self._active:  # the stream was sealed (or deleted) since `commit` checked it
            self.engine.check_writable(self.row)
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
        time_bounds = check_time_bounds(time_bounds)
        state = self._settled_state()
        if state == "committed":
            self._refuse_late_events()
            self._remove_bodies()  # left behind by a process that died right after its commit
            return
        if state == "open":
            self.engine.check_writable(self.row)
            if self._commit_one_segment(time_bounds):
                return
            flushed = self._write_pending()
            while (outcome := self._enter_committing(flushed, time_bounds)) == "rebase":
                flushed = []
                self._rebase()
            if outcome in ("committed", "committing"):  # another commit of it got there first
                self._refuse_late_events()
            if outcome == "committed":
                return
        elif state != "committing":
            raise TxnFailed(self.txn_id, state, f"it was {state}")
        self._roll_forward()

    def _commit_one_segment(self, time_bounds: tuple[int, int] | None) -> bool:
        """Commit a transaction whose events all go to one segment with one synced write:
        its block (the flushed body, then the events still in memory) appended at the valid
        end, under the segment's lock. False, with nothing done, when it targets several
        segments or none, or its segment was sealed (then rebase: the general path).

        `landing` and `appended_at` are recorded first (synchronous=NORMAL: they survive a
        `kill -9`, and they fence off `abort` and a concurrent commit), then the block is
        appended and fsynced, then `committed` is recorded (NORMAL) with the block's index
        row. The block is the durable truth: a crash or power cut after it leaves a
        transaction that `commit_landed` records committed (any catch-up of the segment, or
        `_settled_state`); one before it leaves `landing` (or `open`) with no whole block,
        which `_settled_state` puts back to `open`."""
        recorded = {
            seg: (body_len, events, crc)
            for seg, body_len, events, crc in self.engine.catalog.query(
                "SELECT segment, body_len, events, body_crc FROM txn_segments WHERE txn_id=?",
                (self.txn_id,),
            )
        }
        targets = set(recorded) | set(self._pending)
        if len(targets) != 1:
            return False
        (segment,) = targets
        segfile = self.engine.segment_file(self.row, segment)
        with segfile.locked():
            at = self.engine.writable_end(self.row, segment)  # raises; the events stay pending
            ingest_ns = now_ns()
            outcome = self._mark_landing(segment, at, ingest_ns, time_bounds)
            if outcome in ("committed", "committing"):  # another commit of it got there first
                self._refuse_late_events()
            if outcome in ("sealed", "committing"):  # rebase, or roll the other one forward
                return False
            if outcome == "land":
                try:
                    flushed = recorded.get(segment, (0, 0, 0))
                    header = self._land_one(
                        segfile, at, segment, flushed, ingest_ns=ingest_ns, bounds=time_bounds
                    )
                except BaseException:
                    with suppress(Exception):  # else `_settled_state` does it later
                        self._unland()
                    raise
                self._pending.clear()
                self._mark_landed(segment, header)
        self._pending.clear()
        if segment in recorded:
            self._body_path(segment).unlink(missing_ok=True)
        return True

    def _refuse_late_events(self) -> None:
        """Committing again is a no-op, but events written since cannot join the commit."""
        if self._pending:
            msg = "it was committed already; the events written since cannot join it"
            raise TxnFailed(self.txn_id, "committed", msg)

    def _mark_landing(
        self, segment: int, at: int, ingest_ns: int, time_bounds: tuple[int, int] | None
    ) -> str:
        """One catalog transaction (NORMAL): unless the transaction is no longer open (it is
        `committed` by a block found at catch-up, or `committing` by another commit; otherwise
        refused) or its segment is sealed, record it `landing` at `at` of `segment` with the
        commit's ingest time and bounds ("land")."""
        t_min, t_max = time_bounds if time_bounds is not None else (None, None)
        with self.engine.catalog.write(self.engine.catalog.index) as db:
            state, expiry = self._state_row(db)
            if state == "open" and now_ns() > expiry:
                state = "expired"
            elif state == "open" and self._sealed(db, segment):
                state = "sealed"
            elif state == "open":
                state = "land"
                db.execute(
                    "UPDATE txns SET state='landing', ingest_ns=?, t_min=?, t_max=? WHERE txn_id=?",
                    (ingest_ns, t_min, t_max, self.txn_id),
                )
                db.execute(
                    "INSERT INTO txn_segments(txn_id, segment, appended_at) VALUES (?, ?, ?)"
                    " ON CONFLICT DO UPDATE SET appended_at=excluded.appended_at",
                    (self.txn_id, segment, at),
                )
        if state in ("expired", "aborted", "landing"):
            self._refuse(state)
        return state

    def _sealed(self, db: sqlite3.Cursor, segment: int) -> bool:
        return bool(
            db.execute(
                "SELECT sealed FROM segments WHERE stream_id=? AND segment=?",
                (self.row.id, segment),
            ).fetchone()[0]
        )

    def _land_one(
        self,
        segfile: SegmentFile,
        at: int,
        segment: int,
        flushed: tuple[int, int, int],
        *,
        ingest_ns: int,
        bounds: tuple[int, int] | None,
    ) -> BlockHeader:
        """Append, at `at`, one block of the flushed body (checked against its recorded
        length and CRC) and the pending events, and fsync it; return its header."""
        body_len, events, crc = flushed
        chunks = self._checked_body(segment, body_len, crc)
        frames = self._pending.get(segment, [])
        for frame in frames:
            crc, body_len = body_checksum(crc, body_len, frame), body_len + len(frame)
        header = self._header(ingest_ns, bounds, body_len, events + len(frames), crc)
        end = segfile.append(at, [header, *chunks, *frames])
        parsed = parse_header(header, 0, at)
        assert parsed is not None and parsed.end == end
        return parsed

    def _mark_landed(self, segment: int, header: BlockHeader) -> None:
        """Index the landed block and record `committed` (NORMAL: the block is durable and
        commits the transaction by itself; see `index.commit_landed`)."""
        with self.engine.catalog.write(self.engine.catalog.index) as db:
            self.engine.insert_index(db, self.row, segment, [header])
            db.execute(
                "UPDATE txns SET state='committed', finished_ns=? WHERE txn_id=?"
                " AND state='landing'",
                (now_ns(), self.txn_id),
            )
            db.execute(
                "UPDATE txn_segments SET done=1 WHERE txn_id=? AND segment=?",
                (self.txn_id, segment),
            )

    def _unland(self) -> None:
        """Put a `landing` transaction whose block never landed whole back to `open` (its
        flushed events stay; the events that were only in the dead process's memory are gone,
        never acknowledged). The caller holds the segment's lock, or owns the landing."""
        with self.engine.catalog.write(self.engine.catalog.index) as db:
            reopened = db.execute(
                "UPDATE txns SET state='open', ingest_ns=NULL, t_min=NULL, t_max=NULL"
                " WHERE txn_id=? AND state='landing'",
                (self.txn_id,),
            ).rowcount
            if not reopened:
                return
            db.execute(
                "DELETE FROM txn_segments WHERE txn_id=? AND body_len=0 AND done=0",
                (self.txn_id,),
            )
            db.execute(
                "UPDATE txn_segments SET appended_at=NULL WHERE txn_id=? AND done=0",
                (self.txn_id,),
            )

    def _enter_committing(
        self, flushed: list[BodyRow], bounds: tuple[int, int] | None
    ) -> Literal["landed", "rebase", "committed", "committing"]:
        """Record the events just flushed, enter `committing` and land the blocks; "rebase"
        (the flushed events recorded, nothing landed) if a target segment is sealed: rebase
        first; "committed" if a block of it was found at catch-up (`index.commit_landed`),
        "committing" if another commit of it entered `committing` first (roll it forward).

        The target segments' locks are taken first, in segment order as a scale takes them, so
        that one catalog transaction (FULL) can record the flushed bodies, `committing` and each
        segment's `appended_at` (its valid end, which no one moves while we hold its lock). The
        blocks are appended after that commit, still under the locks: a crash before it leaves
        the transaction open with nothing of it in a segment; after it, a retry finds each
        block at `appended_at` or appends it there. A concurrent scale either sealed first (we
        rebase) or sees us committing (and refuses to seal a segment we are landing in)."""
        recorded = self.engine.catalog.query(
            "SELECT segment FROM txn_segments WHERE txn_id=?", (self.txn_id,)
        )
        segments = sorted({seg for seg, *_ in flushed} | {seg for (seg,) in recorded})
        with ExitStack() as locks:
            for seg in segments:
                locks.enter_context(self.engine.segment_file(self.row, seg).locked())
            ends = {seg: self.engine.catch_up(self.row, seg) for seg in segments}
            landing = self._mark_committing(flushed, ends, bounds)
            if landing is None or isinstance(landing, str):
                return landing or "rebase"
            for segment, header, body in landing:
                self._append(segment, header, body)
                self._mark_done(segment)
        return "landed"

    def _mark_committing(
        self, flushed: list[BodyRow], ends: dict[int, int], time_bounds: tuple[int, int] | None
    ) -> list[tuple[int, bytes, tuple[int, int]]] | Literal["committed", "committing"] | None:
        """One catalog transaction: record `flushed`; unless it is committed already (by a
        block found at catch-up: "committed") or another commit of it entered `committing`
        ("committing", nothing recorded), a target segment is sealed (None) or damaged
        (`SegmentDamaged`, the transaction stays open and commits once `repair` has run), enter
        `committing` with `ends` as the segments' `appended_at`. Returns each segment's block
        header and recorded body (length, CRC) to append at its end."""
        t_min, t_max = time_bounds if time_bounds is not None else (None, None)
        ingest_ns, blocked, rows = now_ns(), None, []
        with self.engine.catalog.write() as db:
            state, expiry = self._state_row(db)
            if state != "open":
                blocked = state
            elif now_ns() > expiry:
                blocked = "expired"
            else:
                self._upsert(db, flushed)
                blocked = self._blocked(db)
            if blocked is None:
                db.execute(
                    "UPDATE txns SET state='committing', ingest_ns=?, t_min=?, t_max=?"
                    " WHERE txn_id=?",
                    (ingest_ns, t_min, t_max, self.txn_id),
                )
                db.executemany(
                    "UPDATE txn_segments SET appended_at=? WHERE txn_id=? AND segment=?",
                    [(at, self.txn_id, seg) for seg, at in ends.items()],
                )
                rows = db.execute(
                    "SELECT segment, body_len, events, body_crc FROM txn_segments"
                    " WHERE txn_id=? AND done=0 ORDER BY segment",
                    (self.txn_id,),
                ).fetchall()
        if blocked in ("committed", "committing"):
            return blocked
        if blocked in ("expired", "aborted", "landing"):
            return self._refuse(blocked)
        self._pending.clear()  # recorded: never written again
        if blocked == "sealed":
            return None
        if blocked is not None:
            raise SegmentDamaged(self.row.qualified, *blocked)
        bounds = (t_min, t_max) if t_min is not None else None
        return [
            (seg, self._header(ingest_ns, bounds, body_len, events, crc), (body_len, crc))
            for seg, body_len, events, crc in rows
            if seg in ends  # one another process recorded since lands by `_roll_forward`
        ]

    def _refuse(self, why: str) -> NoReturn:
        """Raise for a transaction that cannot commit now: its lease expired (it is aborted
        now), or another process aborted or committed it meanwhile."""
        if why == "expired":
            self.abort()
            raise TxnFailed(self.txn_id, "aborted", "its lease expired; it has been aborted")
        if why == "aborted":
            self._pending.clear()
            self._remove_bodies()  # what we flushed just now, after the abort removed the rest
        if why == "landing":  # another process is committing it right now
            why = "committing"
        raise TxnFailed(self.txn_id, why, f"it is {why}, so it cannot be committed")

    def _blocked(self, db: sqlite3.Cursor) -> str | tuple[int, int, str] | None:
        """'sealed' if a target segment is sealed, a damaged one's (segment, offset, problem),
        or None when the transaction may land in all of them."""
        sealed = db.execute(
            "SELECT COUNT(*) FROM txn_segments ts JOIN segments s"
            " ON s.stream_id=? AND s.segment=ts.segment WHERE ts.txn_id=? AND s.sealed=1",
            (self.row.id, self.txn_id),
        ).fetchone()[0]
        if sealed:
            return "sealed"
        return db.execute(
            "SELECT d.segment, d.offset, d.problem FROM txn_segments ts JOIN damage d"
            " ON d.stream_id=? AND d.segment=ts.segment WHERE ts.txn_id=? LIMIT 1",
            (self.row.id, self.txn_id),
        ).fetchone()

    def settle(self) -> None:
        """Finish what a commit decided, as sealing the stream needs first: a `committing`
        transaction is rolled forward; a `landing` one left by a committer that died becomes
        committed if its block landed, else open again (`_settled_state`): never committed
        by anyone but its committer."""
        if self._settled_state() == "committing":
            self._roll_forward()

    def _roll_forward(self) -> None:
        """Land what is not landed yet (all of it after a crash), then record `committed`."""
        ingest_ns, t_min, t_max = self.engine.catalog.query_one(
            "SELECT ingest_ns, t_min, t_max FROM txns WHERE txn_id=?", (self.txn_id,)
        )
        bounds = (t_min, t_max) if t_min is not None else None
        rows = self.engine.catalog.query(
            "SELECT segment, body_len, events, body_crc FROM txn_segments"
            " WHERE txn_id=? AND done=0 ORDER BY segment",
            (self.txn_id,),
        )
        for segment, body_len, events, crc in rows:
            header = self._header(ingest_ns, bounds, body_len, events, crc)
            self._land(segment, header, (body_len, crc))
        with self.engine.catalog.write() as db:
            db.execute(
                "UPDATE txns SET state='committed', finished_ns=? WHERE txn_id=?",
                (now_ns(), self.txn_id),
            )
        self._remove_bodies()

    def _land(self, segment: int, header: bytes, body: tuple[int, int]) -> None:
        """Append this transaction's block to one segment unless an earlier try already did;
        `body` is the recorded (length, CRC) of its flushed events. `appended_at` is read
        under the lock: another process rolling the same commit forward may have moved it
        and landed the block there since this one listed what was left to land."""
        segfile = self.engine.segment_file(self.row, segment)
        with segfile.locked():
            at = self.engine.catch_up(self.row, segment)
            found = self.engine.catalog.query_one(
                "SELECT appended_at FROM txn_segments WHERE txn_id=? AND segment=?",
                (self.txn_id, segment),
            )
            appended_at = found[0] if found else None
            if appended_at is not None and self._block_is_mine(segment, appended_at):
                self._mark_done(segment)
                return
            with self.engine.catalog.write() as db:
                db.execute(
                    "UPDATE txn_segments SET appended_at=? WHERE txn_id=? AND segment=?",
                    (at, self.txn_id, segment),
                )
            self._append(segment, header, body)
        self._mark_done(segment)

    def _append(self, segment: int, header: bytes, body: tuple[int, int]) -> None:
        """Append the block at the segment's valid end, which `appended_at` names (caller holds
        the lock); the body is read back and checked against its recorded length and CRC."""
        chunks = self._checked_body(segment, *body)
        self.engine.append_block(self.row, segment, header, chunks)

    def _block_is_mine(self, segment: int, offset: int) -> bool:
        block = self.engine.block_at(self.row, segment, offset)
        if block is None or block.offset != offset:
            return False
        data = self.engine.segment_file(self.row, segment).pread(block.length, offset)
        parsed = parse_header(data, 0, offset)
        return parsed is not None and parsed.txn_id == self.txn_id

    def _mark_done(self, segment: int) -> None:
        # derivable (the block at appended_at names this transaction): no fsync needed
        with self.engine.catalog.write(self.engine.catalog.index) as db:
            db.execute(
                "UPDATE txn_segments SET done=1 WHERE txn_id=? AND segment=?",
                (self.txn_id, segment),
            )

    def abort(self) -> None:
        """Abort, unless it is committed or being committed (`TxnFailed`). An open transaction
        is aborted only once every segment is caught up: a block of it that a power cut left
        in a segment, with the catalog rows that said so lost, commits it instead."""
        while (state := self._settled_state()) == "open" or state == "landing":
            self._catch_up_all()
            if self._abort_if_open():
                break
        if state in ("committing", "committed"):
            raise TxnFailed(self.txn_id, state, "it is already committed; it cannot be aborted")
        self._pending.clear()
        self._remove_bodies()

    def _abort_if_open(self) -> bool:
        """Record `aborted` if the transaction is still open; False if a commit started."""
        with self.engine.catalog.write() as db:
            self._state_row(db)
            return bool(
                db.execute(
                    "UPDATE txns SET state='aborted', finished_ns=? WHERE txn_id=?"
                    " AND state='open'",
                    (now_ns(), self.txn_id),
                ).rowcount
            )
