"""The embedded stream store: Pravega's semantics on one machine's disk, many processes at once.

`EmbeddedStore` is the facade: it names streams and speaks the `StreamStore` API, and hands the
work to its parts, which import nothing of it: the engine (engine.py: catalog, segment files,
block index, reads), writers, transactions, reader groups and scaling. The on-disk layout and
the durability argument are in FORMAT.md next to this file.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

from pipeline.streams.api import EventWriter, ReaderGroup, StreamStore, Transaction
from pipeline.streams.cut import StreamCut, as_cut
from pipeline.streams.embedded import integrity, rebuild, scaling
from pipeline.streams.embedded.binding import next_stream_id
from pipeline.streams.embedded.catalog import now_ns
from pipeline.streams.embedded.engine import Engine
from pipeline.streams.embedded.index import StreamRow
from pipeline.streams.embedded.readers import EmbeddedReaderGroup
from pipeline.streams.embedded.reading import read_batches
from pipeline.streams.embedded.routing import key_position
from pipeline.streams.embedded.transactions import EmbeddedTransaction, unsettled
from pipeline.streams.embedded.writer import EmbeddedWriter
from pipeline.streams.errors import InvalidCut, StoreUnavailable, StreamNotSealed
from pipeline.streams.names import check_name, parse_stream
from pipeline.streams.values import (
    DEFAULT_TXN_LEASE_SECONDS,
    Event,
    EventBatch,
    Progress,
    RepairReport,
    Retention,
    ScalingPolicy,
    SegmentInfo,
    StreamInfo,
    VerifyReport,
    check_positive,
    check_retention,
    check_segments,
)

__all__ = ["EmbeddedStore", "key_position"]  # key_position: where benchmarks/store.py finds it


def unopenable(root: Path, exc: OSError | sqlite3.Error) -> str:
    """Why the store in `root` cannot be opened, and what to do, for `StoreUnavailable`."""
    if isinstance(exc, (FileExistsError, NotADirectoryError)):
        file = next((p for p in (root, *root.parents) if p.is_file()), root)
        return f"{file} is a file, not a directory: give a store's directory"
    if isinstance(exc, PermissionError):
        return (
            f"permission denied: {exc.filename or root}: a store's directory and files must be"
            " readable and writable by the user that opens it"
        )
    if isinstance(exc, sqlite3.OperationalError) and "readonly" in str(exc):
        return (
            f"its catalog {root / 'catalog.db'} cannot be written ({exc}): a store is opened"
            " to write, even to read it; make its directory and files writable (or copy it"
            " somewhere writable)"
        )
    return str(exc)


class EmbeddedStore(StreamStore):
    """A durable, crash-safe, multi-process stream store in a local directory."""

    def __init__(self, root: str | Path) -> None:
        """Open (or create) the store in `root`. A catalog that is unreadable or does not match
        the data does not fail here: every use raises the typed error (`CatalogDamaged`,
        `CatalogMismatch`) and `verify`/`repair` work, so `repair` can rebuild it."""
        self.root = Path(root).expanduser().absolute()
        self.uri = f"embedded:{self.root}"
        try:
            self._engine = Engine(self.root)
        except (OSError, sqlite3.Error) as exc:
            raise StoreUnavailable(self.uri, unopenable(self.root, exc)) from None

    def close(self) -> None:
        self._engine.close()

    # --- integrity ----------------------------------------------------------------------
    def verify(self, stream: str | None = None, progress: Progress | None = None) -> VerifyReport:
        """Check every block from each segment's head against its checksum and frames, the
        index against the files, open transactions' bodies, the manifests and the catalog.
        Changes nothing. Without a usable catalog: that problem, and the data files checked
        through their manifests."""
        if self._engine.problem is not None:
            return rebuild.verify_data(self._engine, progress)
        return integrity.verify(self._engine, stream, progress)

    def repair(self, stream: str | None = None, progress: Progress | None = None) -> RepairReport:
        """Fix what needs no guess and report the rest (see integrity.py). A lost, foreign or
        damaged catalog is rebuilt from the data files, for the whole store; run it while no
        other process uses the store."""
        engine = self._engine
        if engine.problem is not None or engine.catalog.query("PRAGMA quick_check") != [("ok",)]:
            return rebuild.rebuild(engine, progress)
        return integrity.repair(engine, stream, progress)

    # --- scopes and streams -------------------------------------------------------------
    def create_scope(self, scope: str) -> bool:
        check_name("scope", scope)
        with self._engine.catalog.write() as db:
            db.execute(
                "INSERT OR IGNORE INTO scopes(name, created_ns) VALUES (?, ?)", (scope, now_ns())
            )
            return db.rowcount == 1

    def list_scopes(self) -> list[str]:
        return [r[0] for r in self._engine.catalog.query("SELECT name FROM scopes ORDER BY name")]

    def create_stream(
        self, stream: str, segments: int = 1, retention: Retention | None = None
    ) -> bool:
        scope, name = parse_stream(stream)
        check_segments(segments)
        retention = check_retention(retention or Retention())
        self.create_scope(scope)
        with self._engine.catalog.write() as db:
            if db.execute(
                "SELECT 1 FROM streams WHERE scope=? AND name=? AND deleted=0", (scope, name)
            ).fetchone():
                return False
            sid = next_stream_id(self.root, db)  # never an id whose directory exists
            db.execute(
                "INSERT INTO streams(id, scope, name, created_ns, retention_bytes,"
                " retention_seconds) VALUES (?, ?, ?, ?, ?, ?)",
                (sid, scope, name, now_ns(), retention.max_bytes, retention.max_age_seconds),
            )
            db.executemany(
                "INSERT INTO segments(stream_id, segment, key_lo, key_hi) VALUES (?, ?, ?, ?)",
                [(sid, i, i / segments, (i + 1) / segments) for i in range(segments)],
            )
        # after the commit: a crash before it leaves no directory that the catalog lacks
        try:
            self._engine.sync_manifest(StreamRow(sid, scope, name))
        except OSError:  # its directory cannot be made (permissions): no half-made stream
            with self._engine.catalog.write() as db:  # (its id stays used: AUTOINCREMENT)
                db.execute("DELETE FROM segments WHERE stream_id=?", (sid,))
                db.execute("DELETE FROM streams WHERE id=?", (sid,))
            raise
        return True

    def list_streams(self, scope: str | None = None) -> list[str]:
        if scope is not None:
            check_name("scope", scope)
            rows = self._engine.catalog.query(
                "SELECT scope, name FROM streams WHERE deleted=0 AND scope=? ORDER BY name",
                (scope,),
            )
        else:
            rows = self._engine.catalog.query(
                "SELECT scope, name FROM streams WHERE deleted=0 ORDER BY scope, name"
            )
        return [f"{s}/{n}" for s, n in rows]

    def stream_exists(self, stream: str) -> bool:
        scope, name = parse_stream(stream)
        return self._engine.lookup(scope, name) is not None

    def seal_stream(self, stream: str) -> None:
        """Seal the stream: once this returns, no event is ever added to it (as in Pravega).

        The catalog changes under the locks of the active segments (as a scale's does), so an
        append or a one-segment commit in flight lands first. A transaction whose commit was
        decided is settled first (rolled forward if `committing`, from any process), so a reader
        that reads to the end of the sealed stream sees all it will ever hold; its error (a
        damaged segment or body) refuses the seal. Open transactions stay open; their commit
        raises `StreamSealed`, and they can be aborted."""
        engine = self._engine
        row = engine.stream_row(stream)
        while True:
            with scaling.active_segments_locked(engine, row):
                waiting = unsettled(engine, row)  # none can start while we hold the locks
                if not waiting:
                    with engine.changing(row) as db:
                        db.execute("UPDATE streams SET sealed=1 WHERE id=?", (row.id,))
                        db.execute("UPDATE segments SET sealed=1 WHERE stream_id=?", (row.id,))
                    return
            for txn_id in waiting:  # outside the locks: landing takes them
                EmbeddedTransaction.lookup(engine, row, txn_id).settle()

    def delete_stream(self, stream: str) -> None:
        engine = self._engine
        row = engine.stream_row(stream)
        if not engine.is_sealed(row):
            raise StreamNotSealed(row.scope, row.name)
        with engine.changing(row) as db:  # the manifest stays as a tombstone: ids never reused
            db.execute("UPDATE streams SET deleted=1 WHERE id=?", (row.id,))
            for table in ("segments", "segment_predecessors", "writers"):
                db.execute(f"DELETE FROM {table} WHERE stream_id=?", (row.id,))
        with engine.catalog.write(engine.catalog.index) as db:
            db.execute("DELETE FROM blocks WHERE stream_id=?", (row.id,))
        engine.remove_files(row)

    def info(self, stream: str) -> StreamInfo:
        engine = self._engine
        row = engine.stream_row(stream)
        sealed = engine.is_sealed(row)
        segs = []
        for seg, lo, hi, seg_sealed, head in engine.catalog.query(
            "SELECT segment, key_lo, key_hi, sealed, head FROM segments"
            " WHERE stream_id=? ORDER BY segment",
            (row.id,),
        ):
            tail = engine.catch_up(row, seg)
            events, size = self._count_from(row, seg, head, tail)
            damaged = engine.damage(row, seg)
            segs.append(
                SegmentInfo(seg, (lo, hi), bool(seg_sealed), head, tail, events, size, damaged)
            )
        retention = engine.catalog.query_one(
            "SELECT retention_bytes, retention_seconds FROM streams WHERE id=?", (row.id,)
        )
        return StreamInfo(
            scope=row.scope,
            stream=row.name,
            sealed=sealed,
            head=StreamCut.of(row.scope, row.name, {s.segment: s.head for s in segs}, row.id),
            tail=StreamCut.of(row.scope, row.name, {s.segment: s.tail for s in segs}, row.id),
            segments=tuple(segs),
            retention=Retention(*retention) if retention else Retention(),
        )

    def _count_from(self, row: StreamRow, seg: int, head: int, tail: int) -> tuple[int, int]:
        first = self._engine.block_at(row, seg, head)
        events = self._engine.catalog.query_one(
            "SELECT COALESCE(SUM(events), 0) FROM blocks"
            " WHERE stream_id=? AND segment=? AND offset>=?",
            (row.id, seg, head),
            index=True,
        )[0]
        if first is not None and first.offset < head:
            events += sum(1 for e in self._engine.read_segment(row, seg, head, first.end))
        return events, tail - head

    # --- writing ------------------------------------------------------------------------
    def writer(self, stream: str, writer_id: str | None = None) -> EventWriter:
        return EmbeddedWriter(self._engine, self._engine.stream_row(stream), writer_id)

    def begin_transaction(
        self, stream: str, lease_seconds: float = DEFAULT_TXN_LEASE_SECONDS
    ) -> Transaction:
        row = self._engine.stream_row(stream)
        return EmbeddedTransaction.begin(self._engine, row, lease_seconds)

    def get_transaction(self, stream: str, txn_id: str) -> Transaction:
        return EmbeddedTransaction.lookup(self._engine, self._engine.stream_row(stream), txn_id)

    # --- cuts ---------------------------------------------------------------------------
    def head(self, stream: str) -> StreamCut:
        return self._engine.head(self._engine.stream_row(stream))

    def tail(self, stream: str) -> StreamCut:
        return self._engine.tail(self._engine.stream_row(stream))

    def time_cuts(self, stream: str, start_ns: int, end_ns: int) -> tuple[StreamCut, StreamCut]:
        engine = self._engine
        row = engine.stream_row(stream)
        starts, ends = {}, {}
        for seg, _, _ in engine.segments(row):
            tail = engine.catch_up(row, seg)
            head = engine.segment_head(row, seg)
            inside = []
            for b in engine.blocks(row, seg, head, tail):
                low = b.t_min if b.t_min is not None else b.ingest_ns
                high = b.t_max if b.t_max is not None else b.ingest_ns
                # bounds written min after max (kept as given) still span the times between
                if max(low, high) >= start_ns and min(low, high) < end_ns:
                    inside.append(b)
            starts[seg] = max(head, inside[0].offset) if inside else tail
            ends[seg] = inside[-1].end if inside else starts[seg]
        return (
            StreamCut.of(row.scope, row.name, starts, row.id),
            StreamCut.of(row.scope, row.name, ends, row.id),
        )

    # --- reading ------------------------------------------------------------------------
    def read(
        self, stream: str, start: StreamCut | None = None, end: StreamCut | None = None
    ) -> Iterator[Event]:
        for seg, begin, finish in self._ranges(stream, start, end):
            yield from self.read_segment(stream, seg, begin, finish)

    def read_batches(
        self, stream: str, start: StreamCut | None = None, end: StreamCut | None = None
    ) -> Iterator[EventBatch]:
        for seg, begin, finish in self._ranges(stream, start, end):
            yield from self.read_segment_batches(stream, seg, begin, finish)

    def _ranges(
        self, stream: str, start: StreamCut | None, end: StreamCut | None
    ) -> Iterator[tuple[int, int, int]]:
        """(segment, start, end) of each segment between two cuts, in segment order."""
        engine = self._engine
        row = engine.stream_row(stream)
        start = engine.check_cut(row, start) if start else engine.head(row)
        end = engine.check_cut(row, end) if end else engine.tail(row)
        for seg, first, stop in start.spans_until(end):  # both are whole cuts (`check_cut`)
            if stop < first:
                raise InvalidCut(end.text, f"it is before the start cut in segment {seg}")
            yield seg, first, stop

    def read_segment(
        self, stream: str, segment: int, start: int, end: int | None = None
    ) -> Iterator[Event]:
        return self._engine.read_segment(self._engine.stream_row(stream), segment, start, end)

    def read_segment_batches(
        self, stream: str, segment: int, start: int, end: int | None = None
    ) -> Iterator[EventBatch]:
        row = self._engine.stream_row(stream)
        return self._engine.read_segment(row, segment, start, end, reading=read_batches)

    def split_points(
        self, stream: str, segment: int, start: int, end: int, parts: int
    ) -> list[int]:
        row = self._engine.stream_row(stream)
        if parts <= 1 or end <= start:
            return []
        blocks = [b for b in self._engine.blocks(row, segment, start, end) if b.offset > start]
        step = (end - start) / parts
        points: list[int] = []
        for b in blocks:
            if b.offset >= start + step * (len(points) + 1) and b.offset < end:
                points.append(b.offset)
        return points

    # --- scaling ------------------------------------------------------------------------
    def scale(self, stream: str, seal: list[int], ranges: list[tuple[float, float]]) -> list[int]:
        row = self._engine.stream_row(stream)
        return scaling.scale(self._engine, row, list(seal), list(ranges))

    def auto_scale(
        self, stream: str, policy: ScalingPolicy, window_seconds: float = 60.0
    ) -> list[int]:
        check_positive("scaling window", window_seconds, "a number of seconds above 0")
        row = self._engine.stream_row(stream)
        plan = scaling.plan_auto_scale(self._engine, row, policy, window_seconds)
        created = [
            seg
            for hot in plan.split
            for seg in self.split_segment(stream, hot, policy.scale_factor)
        ]
        if created or plan.merge is None:
            return created
        return [self.merge_segments(stream, list(plan.merge))]

    # --- reader groups ------------------------------------------------------------------
    def reader_group(self, name: str, stream: str, start: StreamCut | None = None) -> ReaderGroup:
        row = self._engine.stream_row(stream)
        return EmbeddedReaderGroup.open(self._engine, name, row, start)

    def delete_reader_group(self, name: str) -> None:
        EmbeddedReaderGroup.delete(self._engine, name)

    # --- truncation and retention -------------------------------------------------------
    def truncate(self, cut: StreamCut) -> None:
        engine = self._engine
        cut = as_cut(cut)
        row = engine.stream_row(cut.stream)
        cut = engine.check_cut(row, cut)
        heads = engine.head(row).segments
        for seg, off in cut.positions:
            if off > heads[seg]:  # a position the head has passed is truncated already
                engine.check_boundary(row, seg, off)
        with engine.changing(row) as db:
            for seg, off in cut.positions:
                db.execute(
                    "UPDATE segments SET head = MAX(head, ?) WHERE stream_id=? AND segment=?",
                    (off, row.id, seg),
                )
        for seg, off in cut.positions:
            first = engine.block_at(row, seg, off)
            engine.segment_file(row, seg).punch_hole(first.offset if first else off)

    def apply_retention(self, stream: str, now_ns: int | None = None) -> StreamCut | None:
        """Truncate at the first block young enough (and within the byte limit) per segment.

        Safe beside writers, transactions and readers in other processes: appends and commits
        go on at the tail, the head only moves forward (a racing truncation keeps the later
        head), and a read that reaches data dropped under it raises `Truncated`."""
        engine = self._engine
        row = engine.stream_row(stream)
        max_bytes, max_age = engine.catalog.query_one(
            "SELECT retention_bytes, retention_seconds FROM streams WHERE id=?", (row.id,)
        )
        if max_bytes is None and max_age is None:
            return None
        # a policy recorded before create_stream checked it may keep nothing: never apply it
        check_retention(Retention(max_bytes, max_age))
        now_ns = now_ns if now_ns is not None else time.time_ns()
        head = engine.head(row).segments
        tail = engine.tail(row).segments
        blocks = {seg: engine.blocks(row, seg, head[seg], tail[seg]) for seg in head}
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
            # The first block may start before the head (a cut inside it): keep its events
            # from the head on while the block is young enough, never move the head back.
            keep = [b for b in bs if b.ingest_ns >= cutoff]
            new_heads[seg] = max(head[seg], keep[0].offset) if keep else tail[seg]
        if new_heads == head:
            return None
        cut = StreamCut.of(row.scope, row.name, new_heads, row.id)
        self.truncate(cut)
        return cut
