"""Rebuild a lost, foreign or unreadable catalog from the data files; verify data without one.

The manifests give each stream's id, name, segments, key ranges, predecessors, seals and
heads; the segment files give the block index and writer positions (every block header
carries them) and the committed transactions (a transaction's block names it). The old
catalog is set aside as `catalog.db.lost-<time>`, never deleted. What the data files cannot
tell is reported, not guessed: segment files without a manifest, flushed events of
transactions that no stream of this store issued, reader groups. Flushed events of a
transaction this store issued (its id names its stream, sealed with the store id) are
recovered with it: `open` if none of its blocks landed, `committing` if some did, so that a
writer that recorded the id (the collector's two-phase commit) commits it again or aborts it.
"""

from __future__ import annotations

import os
import sqlite3
from collections import Counter
from pathlib import Path

from pipeline.streams.embedded import txn_ids
from pipeline.streams.embedded.binding import refuse_newer_store_file
from pipeline.streams.embedded.blocks import BadBlock, BlockHeader, body_checksum, frame_at
from pipeline.streams.embedded.catalog import FORMAT_VERSION, REBUILDING, Catalog, now_ns
from pipeline.streams.embedded.engine import Engine
from pipeline.streams.embedded.index import StreamRow
from pipeline.streams.embedded.integrity import Tally, seal_and_continue
from pipeline.streams.embedded.manifest import (
    UNREADABLE_ID,
    StreamManifest,
    read_manifest,
    read_store_id,
    stream_dir,
    stream_ids_on_disk,
    write_store_id,
)
from pipeline.streams.embedded.segment import SegmentFile
from pipeline.streams.values import Problem, Progress, RepairReport, VerifyReport
from pipeline.wording import counted

CATALOG_FILES = ("catalog.db", "catalog.db-wal", "catalog.db-shm")


def read_manifests(root: Path, tally: Tally) -> dict[int, StreamManifest]:
    """Every stream directory's manifest; a directory without a readable one is reported."""
    found: dict[int, StreamManifest] = {}
    for stream_id in stream_ids_on_disk(root):
        try:
            manifest = read_manifest(root, stream_id)
        except ValueError as exc:
            manifest, why = None, f"its manifest is unreadable ({exc})"
        else:
            why = "it has no manifest"
        if manifest is not None:
            found[stream_id] = manifest
        elif any(stream_dir(root, stream_id).glob("*.seg")):
            what = (
                f"data/{stream_id} holds segment files but {why}: its stream's name and key"
                " ranges are unknown, so it is left out (its files stay where they are)"
            )
            tally.problems.append(Problem(None, None, None, what))
    return found


def surveyed_segments(root: Path, manifests: dict[int, StreamManifest]) -> list[tuple]:
    """(manifest, segment entry, segment file) of every live stream's segment."""
    return [
        (m, entry, SegmentFile(stream_dir(root, m.stream_id) / f"{entry.segment}.seg"))
        for m in manifests.values()
        if not m.deleted
        for entry in m.segments
    ]


def verify_data(engine: Engine, progress: Progress | None) -> VerifyReport:
    """Without a usable catalog: report it, and check every segment file block by block."""
    assert engine.problem is not None
    what = f"{engine.problem}"
    tally = Tally(progress, 0)
    tally.problems.append(Problem(None, None, None, what, fixable=True))
    manifests = read_manifests(engine.root, tally)
    segments = surveyed_segments(engine.root, manifests)
    tally.total = sum(f.path.stat().st_size for _, _, f in segments if f.path.exists())
    for manifest, entry, segfile in segments:
        tally.segments += 1
        if segfile.path.exists():
            survey_segment(manifest, entry.segment, entry.head_block, segfile, tally)
            segfile.close()
    return VerifyReport(
        tuple(tally.problems), len(manifests), tally.segments, tally.blocks, tally.done
    )


def survey_segment(
    manifest: StreamManifest, segment: int, start: int, segfile: SegmentFile, tally: Tally
) -> list[BlockHeader]:
    """The valid blocks of a segment file from `start`; damage and a torn tail reported."""
    survey = segfile.survey(start)
    for bad, later in survey.damaged:
        what = f"{later - bad} bytes are no valid block, but valid blocks follow at {later}"
        tally.problems.append(Problem(manifest.qualified, segment, bad, what))
    if survey.torn_tail is not None:
        torn, size = survey.torn_tail
        what = f"a torn tail of {size - torn} bytes"
        tally.problems.append(Problem(manifest.qualified, segment, torn, what, fixable=True))
    tally.blocks += len(survey.blocks)
    tally.advance(survey.size - start)
    return survey.blocks


def rebuild(engine: Engine, progress: Progress | None) -> RepairReport:
    """Set the catalog aside and build a new one from the manifests and segment files."""
    root = engine.root
    refuse_newer_store_file(root)  # a newer Sluice's store: its catalog is not ours to replace
    tally = Tally(progress, 0)
    lost_groups = reader_groups_of(root / "catalog.db")
    manifests = read_manifests(root, tally)
    store_id = choose_store_id(root, manifests, tally)
    engine.close()
    aside = set_aside(root)
    catalog = Catalog(root / "catalog.db")
    try:
        fill_catalog(catalog, store_id, manifests)
    finally:
        catalog.close()
    write_store_id(root, store_id, FORMAT_VERSION)
    engine.open_catalog(rebuilding=True)
    if engine.problem is not None:
        raise engine.problem
    segments = surveyed_segments(root, manifests)
    tally.total = sum(f.path.stat().st_size for _, _, f in segments if f.path.exists())
    committed: dict[str, list[tuple[int, int, BlockHeader]]] = {}
    for manifest, entry, segfile in segments:
        row = StreamRow(manifest.stream_id, manifest.scope, manifest.name)
        index_segment(
            engine, row, entry.segment, entry.head_block, tally=tally, committed=committed
        )
        segfile.close()
        if engine.damage(row, entry.segment) is not None:
            seal_and_continue(engine, row, entry.segment, (entry.key_lo, entry.key_hi), tally)
    bodies = leftover_bodies(root, committed)
    recovered = recover_bodies(
        engine, store_id, manifests=manifests, committed=committed, bodies=bodies, tally=tally
    )
    record_transactions(engine, {k: v for k, v in committed.items() if k not in recovered})
    with engine.catalog.write() as db:  # the catalog is whole: served from now on
        db.execute("DELETE FROM meta WHERE key = ?", (REBUILDING,))
    if lost_groups:
        what = f"reader groups {', '.join(lost_groups)} were in the lost catalog: recreate them"
        tally.problems.append(Problem(None, None, None, what))
    what = (
        "rebuilt the catalog from the manifests and segment files of"
        f" {counted(len(manifests), 'stream')}"
        f" (the old one is kept as {aside or 'nothing: there was none'})"
    )
    tally.fixed.insert(0, Problem(None, None, None, what, True))
    tally.finish()
    return RepairReport(tuple(tally.fixed), tuple(tally.problems))


def reader_groups_of(path: Path) -> list[str]:
    """The reader groups an old catalog names, if it can still be read at all."""
    if not path.exists():
        return []
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            return [r[0] for r in conn.execute("SELECT name FROM reader_groups ORDER BY name")]
        finally:
            conn.close()
    except sqlite3.Error:
        return []


def choose_store_id(root: Path, manifests: dict[int, StreamManifest], tally: Tally) -> str:
    """The store id of `store.json`, else the one most manifests carry; manifests of another
    store are left out (reported)."""
    store_id = read_store_id(root)
    if store_id in (None, UNREADABLE_ID):
        counts = Counter(m.store_id for m in manifests.values())
        store_id = counts.most_common(1)[0][0] if counts else os.urandom(16).hex()
    for stream_id, manifest in list(manifests.items()):
        if manifest.store_id != store_id:
            del manifests[stream_id]
            what = (
                f"data/{stream_id} ({manifest.qualified}) belongs to store {manifest.store_id},"
                f" not {store_id}: left out (its files stay where they are)"
            )
            tally.problems.append(Problem(None, None, None, what))
    return store_id


def set_aside(root: Path) -> str | None:
    """Move the old catalog's files to `catalog.db.lost-<time>*`; the name, or None."""
    stamp = f"lost-{now_ns()}"
    moved = None
    for name in CATALOG_FILES:
        path = root / name
        if path.exists():
            target = root / name.replace("catalog.db", f"catalog.db.{stamp}")
            path.rename(target)
            moved = moved or target.name
    return moved


def fill_catalog(catalog: Catalog, store_id: str, manifests: dict[int, StreamManifest]) -> None:
    """Streams, segments and predecessors from the manifests, under their own ids."""
    with catalog.write() as db:
        db.executemany(
            "INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)",
            [
                ("format_version", str(FORMAT_VERSION)),
                ("store_id", store_id),
                ("rebuilt_ns", str(now_ns())),  # transaction ids issued before: not rebuilt
                (REBUILDING, "1"),  # until every segment is indexed: refused if stopped before
            ],
        )
        for m in manifests.values():
            db.execute(
                "INSERT OR IGNORE INTO scopes(name, created_ns) VALUES (?, ?)",
                (m.scope, m.created_ns),
            )
            db.execute(
                "INSERT INTO streams(id, scope, name, created_ns, sealed, deleted,"
                " retention_bytes, retention_seconds) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    m.stream_id,
                    m.scope,
                    m.name,
                    m.created_ns,
                    int(m.sealed),
                    int(m.deleted),
                    m.retention_bytes,
                    m.retention_seconds,
                ),
            )
            if m.deleted:
                continue
            db.executemany(
                "INSERT INTO segments(stream_id, segment, key_lo, key_hi, sealed, head)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                [
                    (m.stream_id, s.segment, s.key_lo, s.key_hi, int(s.sealed), s.head)
                    for s in m.segments
                ],
            )
            db.executemany(
                "INSERT INTO segment_predecessors(stream_id, segment, predecessor)"
                " VALUES (?, ?, ?)",
                [(m.stream_id, s.segment, p) for s in m.segments for p in s.predecessors],
            )
        if manifests:
            db.execute(
                "INSERT OR REPLACE INTO sqlite_sequence(name, seq) VALUES ('streams', ?)",
                (max(manifests),),
            )


def index_segment(
    engine: Engine,
    row: StreamRow,
    segment: int,
    start: int,
    *,
    tally: Tally,
    committed: dict[str, list[tuple[int, int, BlockHeader]]],
) -> None:
    """Index a segment's valid blocks from `start` (a torn tail cut, damage marked) and note
    the transactions whose blocks it holds."""
    segfile = engine.segment_file(row, segment)
    if not segfile.path.exists():
        return
    with segfile.locked():
        survey = segfile.survey(start)
        engine.index_blocks(row, segment, survey.blocks, landed=False)  # recorded below
        for bad, later in survey.damaged:
            what = f"{later - bad} bytes are no valid block (valid blocks follow at {later})"
            tally.problems.append(Problem(row.qualified, segment, bad, what))
            engine.mark_damaged(row, segment, bad, what)
        if survey.torn_tail is not None:
            segfile.repair(survey.torn_tail[0])
            what = f"cut a torn tail of {survey.size - survey.torn_tail[0]} bytes"
            tally.fixed.append(Problem(row.qualified, segment, survey.torn_tail[0], what, True))
    for h in survey.blocks:
        if h.txn_id is not None:
            committed.setdefault(h.txn_id, []).append((row.id, segment, h))
    tally.blocks += len(survey.blocks)
    tally.advance(survey.size - start)


def record_transactions(
    engine: Engine, committed: dict[str, list[tuple[int, int, BlockHeader]]]
) -> None:
    """A committed row for every transaction whose blocks landed (`get_transaction(id)`
    finds it committed; committing it again is a no-op)."""
    with engine.catalog.write() as db:
        for txn_id, landed in committed.items():
            stream_id, _, first = landed[0]
            at = first.ingest_ns
            db.execute(
                "INSERT INTO txns(txn_id, stream_id, state, created_ns, lease_expiry_ns, t_min,"
                " t_max, ingest_ns, finished_ns) VALUES (?, ?, 'committed', ?, ?, ?, ?, ?, ?)",
                (txn_id, stream_id, at, at, first.t_min, first.t_max, at, at),
            )
            db.executemany(
                "INSERT INTO txn_segments(txn_id, segment, body_len, events, appended_at, done)"
                " VALUES (?, ?, ?, ?, ?, 1)",
                [(txn_id, seg, h.body_len, h.events, h.offset) for _, seg, h in landed],
            )


#: A flushed body left in `txn/`: (transaction id, segment) -> its file.
Bodies = dict[tuple[str, int], Path]


def leftover_bodies(root: Path, committed: dict[str, list[tuple[int, int, BlockHeader]]]) -> Bodies:
    """The flushed bodies in `txn/` whose events did not land in their segment."""
    bodies: Bodies = {}
    folder = root / "txn"
    if not folder.is_dir():
        return bodies
    for path in sorted(folder.glob("*.body")):
        txn_id, _, rest = path.name.partition(".")
        segment = rest.partition(".")[0]
        if not (segment.isascii() and segment.isdigit()):
            continue
        if int(segment) not in {seg for _, seg, _ in committed.get(txn_id, [])}:
            bodies[txn_id, int(segment)] = path
    return bodies


def recover_bodies(
    engine: Engine,
    store_id: str,
    *,
    manifests: dict[int, StreamManifest],
    committed: dict[str, list[tuple[int, int, BlockHeader]]],
    bodies: Bodies,
    tally: Tally,
) -> set[str]:
    """Record the transactions of leftover bodies whose id this store issued for a live
    stream: `open` with their flushed events, or `committing` (the rest lands at the next
    commit) if some of their blocks landed. A body is taken up to its last whole event
    frame. Returns the ids recorded `committing`; others' bodies are reported."""
    by_txn: dict[str, dict[int, Path]] = {}
    for (txn_id, segment), path in bodies.items():
        by_txn.setdefault(txn_id, {})[segment] = path
    committing: set[str] = set()
    for txn_id, paths in by_txn.items():
        owner = issuing_stream(store_id, manifests, txn_id)
        if owner is None:
            for segment, path in paths.items():
                state = "was half committed" if txn_id in committed else "was not committed"
                what = (
                    f"transaction {txn_id} {state}, and no stream of this store issued it: its"
                    f" flushed events in {path.name} cannot be tied to a stream; left in txn/"
                )
                tally.problems.append(Problem(None, segment, None, what))
            continue
        manifest, begun = owner
        rows = [(segment, *whole_frames(path)) for segment, path in sorted(paths.items())]
        landed = committed.get(txn_id, [])
        with engine.catalog.write() as db:
            record_recovered(db, txn_id, manifest.stream_id, begun=begun, rows=rows, landed=landed)
        if landed:
            committing.add(txn_id)
        state = "committing (its next commit lands the rest)" if landed else "open"
        events = counted(sum(row[2] for row in rows), "flushed event")
        what = f"recovered transaction {txn_id} as {state} with its {events}: commit or abort it"
        tally.fixed.append(Problem(manifest.qualified, None, None, what, True))
    return committing


def issuing_stream(
    store_id: str, manifests: dict[int, StreamManifest], txn_id: str
) -> tuple[StreamManifest, tuple[int, int]] | None:
    """The live stream this store issued `txn_id` for, with the id's (created, expiry)."""
    for manifest in manifests.values():
        begun = txn_ids.begin_row(store_id, manifest.stream_id, txn_id)
        if begun is not None and not manifest.deleted:
            return manifest, begun
    return None


def whole_frames(path: Path) -> tuple[int, int, int]:
    """(length, events, running checksum) of a body's whole event frames from its start.

    The catalog that recorded the body's length is lost; bytes past the last whole frame (a
    flush cut short) count for nothing, as bytes past a recorded length do."""
    data = path.read_bytes()
    pos = events = 0
    while pos < len(data):
        try:
            _, payload_at, payload_len = frame_at(data, pos)
        except BadBlock:
            break
        if payload_at + payload_len > len(data):
            break
        pos, events = payload_at + payload_len, events + 1
    return pos, events, body_checksum(0, 0, data[:pos])


def record_recovered(
    db: sqlite3.Cursor,
    txn_id: str,
    stream_id: int,
    *,
    begun: tuple[int, int],
    rows: list[tuple[int, int, int, int]],
    landed: list[tuple[int, int, BlockHeader]],
) -> None:
    """The catalog rows of a recovered transaction: `open` with its bodies, or `committing`
    with its landed blocks done and the bodies still to land."""
    created, expiry = begun
    if landed:
        first = landed[0][2]
        db.execute(
            "INSERT INTO txns(txn_id, stream_id, state, created_ns, lease_expiry_ns, t_min,"
            " t_max, ingest_ns) VALUES (?, ?, 'committing', ?, ?, ?, ?, ?)",
            (txn_id, stream_id, created, expiry, first.t_min, first.t_max, first.ingest_ns),
        )
    else:
        db.execute(
            "INSERT INTO txns(txn_id, stream_id, state, created_ns, lease_expiry_ns)"
            " VALUES (?, ?, 'open', ?, ?)",
            (txn_id, stream_id, created, expiry),
        )
    db.executemany(
        "INSERT INTO txn_segments(txn_id, segment, body_len, events, body_crc, appended_at,"
        " done) VALUES (?, ?, ?, ?, ?, ?, 1)",
        [(txn_id, seg, h.body_len, h.events, 0, h.offset) for _, seg, h in landed],
    )
    db.executemany(
        "INSERT INTO txn_segments(txn_id, segment, body_len, events, body_crc)"
        " VALUES (?, ?, ?, ?, ?)",
        [(txn_id, *row) for row in rows],
    )
