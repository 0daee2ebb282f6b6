"""Rebuild a lost, foreign or unreadable catalog from the data files; verify data without one.

The manifests give each stream's id, name, segments, key ranges, predecessors, seals and
heads; the segment files give the block index and writer positions (every block header
carries them) and the committed transactions (a transaction's block names it). The old
catalog is set aside as `catalog.db.lost-<time>`, never deleted. What the data files cannot
tell is reported, not guessed: segment files without a manifest, flushed events of
transactions that never committed, reader groups.
"""

from __future__ import annotations

import os
import sqlite3
from collections import Counter
from pathlib import Path

from pipeline.streams.api import Problem, Progress, RepairReport, VerifyReport
from pipeline.streams.embedded.binding import refuse_newer_store_file
from pipeline.streams.embedded.blocks import BlockHeader
from pipeline.streams.embedded.catalog import FORMAT_VERSION, REBUILDING, Catalog, now_ns
from pipeline.streams.embedded.engine import Engine, StreamRow
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
    record_transactions(engine, committed)
    report_leftover_bodies(root, committed, tally)
    with engine.catalog.write() as db:  # the catalog is whole: served from now on
        db.execute("DELETE FROM meta WHERE key = ?", (REBUILDING,))
    if lost_groups:
        what = f"reader groups {', '.join(lost_groups)} were in the lost catalog: recreate them"
        tally.problems.append(Problem(None, None, None, what))
    what = (
        f"rebuilt the catalog from {len(manifests)} stream manifests and their segment files"
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


def report_leftover_bodies(
    root: Path, committed: dict[str, list[tuple[int, int, BlockHeader]]], tally: Tally
) -> None:
    """Flushed events of transactions that did not land whole cannot be tied to a stream."""
    bodies = root / "txn"
    if not bodies.is_dir():
        return
    for path in sorted(bodies.glob("*.body")):
        txn_id, _, rest = path.name.partition(".")
        segment = int(rest.partition(".")[0]) if rest.partition(".")[0].isdigit() else None
        landed = {seg for _, seg, _ in committed.get(txn_id, [])}
        if segment in landed:
            continue
        state = "was half committed" if landed else "was not committed"
        what = (
            f"transaction {txn_id} {state}: its flushed events in {path.name} cannot be tied"
            " to a stream without the catalog; left in txn/"
        )
        tally.problems.append(Problem(None, segment, None, what))
