"""Binding the catalog to the data beside it: the store id, stream ids, and stream manifests.

On open, a catalog that does not describe the data under `data/` (new or emptied over existing
streams, another store's, or an older copy missing streams) is refused with `CatalogMismatch`;
nothing is changed, and `repair` rebuilds it from the manifests and segment files. Stream ids
are allocated above every id the catalog or the disk has used, so a stream never meets
another's files. A version-1 catalog (no store id) is adopted: it gets an id and manifests;
a version-2 store is upgraded (FORMAT.md, "Versions"). A store of a format newer than this code
knows is refused with `StoreFormatTooNew` before anything is written.
"""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Callable
from pathlib import Path

from pipeline.streams.embedded.catalog import FORMAT_VERSION, Catalog, is_newer
from pipeline.streams.embedded.manifest import (
    STORE_FILE,
    UNREADABLE_ID,
    SegmentEntry,
    StreamManifest,
    read_manifest,
    read_store_format,
    read_store_id,
    stream_ids_on_disk,
    write_manifest,
    write_store_id,
)
from pipeline.streams.errors import CatalogMismatch, StoreFormatTooNew
from pipeline.wording import counted

#: (segment, head) -> where the block holding `head` starts
HeadBlock = Callable[[int, int], int]


def bind(root: Path, catalog: Catalog, head_block: Callable[[int], HeadBlock]) -> str:
    """The store id, once the catalog is known to describe the data; else `CatalogMismatch`.
    The store is then of this code's format (upgraded if it was older). One of a newer format
    is refused with `StoreFormatTooNew`, nothing written, and the catalog closed.

    `head_block(stream_id)` gives the head-block function of one stream (for manifests
    written when a version-1 catalog is adopted).
    """
    try:  # (the engine refused a newer `store.json` before it opened the catalog)
        store_id = _bind(root, catalog, head_block)
        _upgrade(root, catalog, store_id)
    except StoreFormatTooNew:
        catalog.close()  # the store does not open: let go of its catalog at once
        raise
    return store_id


def refuse_newer_store_file(root: Path) -> None:
    """`StoreFormatTooNew` if `store.json` names a format newer than this code knows."""
    found = read_store_format(root)
    if found is not None and is_newer(found):
        raise StoreFormatTooNew(str(root / STORE_FILE), str(found), FORMAT_VERSION)


def _bind(root: Path, catalog: Catalog, head_block: Callable[[int], HeadBlock]) -> str:
    on_disk = stream_ids_on_disk(root)  # before the catalog is read: see `_unknown_streams`
    written = _written_segments(root, on_disk)  # likewise (`_unknown_segments`)
    file_id = read_store_id(root)
    version, store_id = catalog.identity()
    if version is None or store_id is None:
        with catalog.write(unchecked=True) as db:
            store_id = _initialise(
                root, catalog, db, file_id=file_id, on_disk=on_disk, head_block=head_block
            )
    path = str(catalog.path)
    if file_id is None:  # a new or adopted store, or the file alone was lost
        write_store_id(root, store_id, FORMAT_VERSION)
    elif file_id != store_id:
        reason = f"the catalog belongs to store {store_id}, the data files to store {file_id}"
        raise CatalogMismatch(path, reason)
    unknown = _unknown_streams(root, catalog, on_disk, store_id)
    if unknown:
        reason = (
            f"the data files hold streams the catalog does not know ({', '.join(unknown)}):"
            " the catalog is older than the data"
        )
        raise CatalogMismatch(path, reason)
    unknown = _unknown_segments(catalog, written)
    if unknown:
        reason = (
            f"the data files hold segments the catalog does not know ({', '.join(unknown)}):"
            " the catalog is older than the data (a restored copy?)"
        )
        raise CatalogMismatch(path, reason)
    return store_id


def _written_segments(root: Path, on_disk: list[int]) -> dict[int, list[int]]:
    """The segments of each stream directory whose file holds data."""
    written: dict[int, list[int]] = {}
    for stream_id in on_disk:
        for path in (root / "data" / str(stream_id)).glob("*.seg"):
            if path.stem.isascii() and path.stem.isdigit() and path.stat().st_size > 0:
                written.setdefault(stream_id, []).append(int(path.stem))
    return written


def _unknown_segments(catalog: Catalog, written: dict[int, list[int]]) -> list[str]:
    """Segments with data of live streams the catalog knows, that it has no row of: what a
    catalog restored from before a scale misses (the events written to the new segments).

    The files are listed before the catalog is read: a segment is committed (and so known)
    before its file is first written."""
    names: dict[int, str] = {}
    known: set[tuple[int, int]] = set()
    for stream_id, name, segment in catalog.query(
        "SELECT s.id, s.scope || '/' || s.name, g.segment FROM streams s"
        " JOIN segments g ON g.stream_id = s.id WHERE s.deleted = 0",
        unchecked=True,
    ):
        names[stream_id] = name
        known.add((stream_id, segment))
    unknown = []
    for stream_id, segments in sorted(written.items()):
        # unknown streams are `_unknown_streams`' to find; deleted ones are gone
        missing = sorted(seg for seg in segments if (stream_id, seg) not in known)
        if stream_id in names and missing:
            listed = ", ".join(map(str, missing))
            word = "segment" if len(missing) == 1 else "segments"
            unknown.append(f"{names[stream_id]} {word} {listed}")
    return unknown


def _upgrade(root: Path, catalog: Catalog, store_id: str) -> None:
    """Bring an older store (or one whose upgrade a crash cut short) to this code's format:
    `store.json`, then the catalog's meta, in one catalog transaction, so that one process
    does it and a store a newer Sluice upgraded meanwhile is refused, not downgraded."""
    if catalog.identity()[0] == str(FORMAT_VERSION) == str(read_store_format(root)):
        return
    with catalog.write() as db:
        version = db.execute("SELECT value FROM meta WHERE key='format_version'").fetchone()[0]
        if is_newer(version):
            raise StoreFormatTooNew(str(catalog.path), version, FORMAT_VERSION)
        refuse_newer_store_file(root)
        if read_store_format(root) != FORMAT_VERSION:
            write_store_id(root, store_id, FORMAT_VERSION)
        db.execute("UPDATE meta SET value=? WHERE key='format_version'", (str(FORMAT_VERSION),))


def _initialise(
    root: Path,
    catalog: Catalog,
    db: sqlite3.Cursor,
    *,
    file_id: str | None,
    on_disk: list[int],
    head_block: Callable[[int], HeadBlock],
) -> str:
    """Give a new store its id, or adopt a version-1 catalog; inside a catalog transaction,
    so that only one process does it. `store.json` is written after it commits (`_bind`): a
    version-1 catalog beside a `store.json` is one restored over newer data."""
    rows = dict(db.execute("SELECT key, value FROM meta").fetchall())
    version, store_id = rows.get("format_version"), rows.get("store_id")
    if version is not None and store_id is not None:
        return store_id  # another process got here first
    path = str(catalog.path)
    if version is None and on_disk:
        streams = counted(len(on_disk), "stream")
        reason = f"it is new or empty, but data/ holds the directories of {streams}"
        raise CatalogMismatch(path, reason)
    if version is not None and file_id is not None:
        raise CatalogMismatch(path, "it is a version-1 catalog, older than the data beside it")
    # A new catalog beside a `store.json` but no stream directory: the process that created
    # the store died between writing the file and committing this transaction (or the catalog
    # was lost before any stream held data: its segment files live in its directory). No data
    # can be mixed up, so the store keeps the id of its file.
    store_id = file_id if version is None and _readable_id(file_id) else uuid.uuid4().hex
    if version is not None:  # adopt: every stream gets its manifest now
        for (stream_id,) in db.execute("SELECT id FROM streams").fetchall():
            write_manifest(root, manifest_of(db, store_id, stream_id, head_block(stream_id)))
    db.executemany(
        "INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)",
        [("format_version", str(FORMAT_VERSION)), ("store_id", store_id)],
    )
    return store_id


def _readable_id(file_id: str | None) -> bool:
    return file_id is not None and file_id != UNREADABLE_ID


def _unknown_streams(root: Path, catalog: Catalog, on_disk: list[int], store_id: str) -> list[str]:
    """Live streams of this store under `data/` above every id the catalog knows.

    The directories are listed before the catalog is read: a stream created in between is
    committed (and so known) before its directory exists.
    """
    known = catalog.query_one("SELECT MAX(id) FROM streams", unchecked=True)[0] or 0
    unknown = []
    for stream_id in (i for i in on_disk if i > known):
        try:
            manifest = read_manifest(root, stream_id)
        except ValueError:
            manifest = None
        if manifest is None:
            unknown.append(f"data/{stream_id}")
        elif manifest.store_id == store_id and not manifest.deleted:
            unknown.append(manifest.qualified)
    return unknown


def next_stream_id(root: Path, db: sqlite3.Cursor) -> int:
    """An id above every stream id the catalog or the disk has ever used."""
    known = db.execute("SELECT MAX(id) FROM streams").fetchone()[0] or 0
    sequence = db.execute("SELECT seq FROM sqlite_sequence WHERE name='streams'").fetchone()
    return max(known, sequence[0] if sequence else 0, *stream_ids_on_disk(root), 0) + 1


def manifest_of(
    db: sqlite3.Cursor | sqlite3.Connection, store_id: str, stream_id: int, head_block: HeadBlock
) -> StreamManifest:
    """A stream's manifest as the catalog (this transaction's view of it) describes it."""
    scope, name, created, sealed, deleted, max_bytes, max_age = db.execute(
        "SELECT scope, name, created_ns, sealed, deleted, retention_bytes, retention_seconds"
        " FROM streams WHERE id=?",
        (stream_id,),
    ).fetchone()
    preds: dict[int, list[int]] = {}
    for seg, pred in db.execute(
        "SELECT segment, predecessor FROM segment_predecessors WHERE stream_id=?", (stream_id,)
    ):
        preds.setdefault(seg, []).append(pred)
    segments = tuple(
        SegmentEntry(
            seg,
            lo,
            hi,
            bool(seg_sealed),
            head,
            head_block(seg, head),
            tuple(sorted(preds.get(seg, []))),
        )
        for seg, lo, hi, seg_sealed, head in db.execute(
            "SELECT segment, key_lo, key_hi, sealed, head FROM segments WHERE stream_id=?"
            " ORDER BY segment",
            (stream_id,),
        ).fetchall()
    )
    return StreamManifest(
        store_id=store_id,
        stream_id=stream_id,
        scope=scope,
        name=name,
        created_ns=created,
        sealed=bool(sealed),
        deleted=bool(deleted),
        retention_bytes=max_bytes,
        retention_seconds=max_age,
        segments=segments,
    )
