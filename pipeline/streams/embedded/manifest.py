"""Stream manifests and the store id: what the catalog knows of each stream, beside its data.

`store.json` names the store; `data/<stream id>/stream.json` names the stream (scope, name,
store id) and its segments (key ranges, predecessors, sealed, head). They tie the data files
to their catalog, so a lost or foreign catalog is refused instead of meeting old files, and
`repair` rebuilds a lost catalog from them and the segment files. Each is replaced atomically
before the catalog change it describes commits: a manifest is never behind its catalog.
Details: FORMAT.md ("Manifests").
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from pipeline.config import FileModes
from pipeline.durable import fsync_dir, write_bytes
from pipeline.streams.embedded.space import out_of_space

STORE_FILE = "store.json"
MANIFEST_FILE = "stream.json"
MANIFEST_VERSION = 1


@dataclass(frozen=True, slots=True)
class SegmentEntry:
    """One segment as its manifest records it; `head_block` is where the block holding `head`
    starts (a rebuild scans the file from there: what lies before is truncated)."""

    segment: int
    key_lo: float
    key_hi: float
    sealed: bool
    head: int
    head_block: int
    predecessors: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class StreamManifest:
    """A stream as the catalog knows it, kept in `data/<stream_id>/stream.json`."""

    store_id: str
    stream_id: int
    scope: str
    name: str
    created_ns: int
    sealed: bool
    deleted: bool
    retention_bytes: int | None
    retention_seconds: float | None
    segments: tuple[SegmentEntry, ...]
    version: Literal[1] = MANIFEST_VERSION

    @property
    def qualified(self) -> str:
        return f"{self.scope}/{self.name}"

    def to_bytes(self) -> bytes:
        return (json.dumps(asdict(self), indent=1, sort_keys=True) + "\n").encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> StreamManifest:
        """Parse a manifest; `ValueError` if it is not one this Sluice writes."""
        try:
            raw = json.loads(data)
            if raw.get("version") != MANIFEST_VERSION:
                msg = f"unknown manifest version {raw.get('version')!r}"
                raise ValueError(msg)
            segments = tuple(
                SegmentEntry(**{**s, "predecessors": tuple(s["predecessors"])})
                for s in raw.pop("segments")
            )
            return cls(**raw, segments=segments)
        except (TypeError, KeyError, AttributeError, json.JSONDecodeError) as exc:
            msg = f"not a stream manifest: {exc}"
            raise ValueError(msg) from None


def stream_dir(root: Path, stream_id: int) -> Path:
    return root / "data" / str(stream_id)


def read_manifest(root: Path, stream_id: int) -> StreamManifest | None:
    """The manifest of a stream directory; None if it has none. `ValueError` if unreadable."""
    path = stream_dir(root, stream_id) / MANIFEST_FILE
    try:
        return StreamManifest.from_bytes(path.read_bytes())
    except FileNotFoundError:
        return None


def write_manifest(root: Path, manifest: StreamManifest) -> None:
    """Replace a stream's manifest atomically and durably, unless it already says the same."""
    path = stream_dir(root, manifest.stream_id) / MANIFEST_FILE
    data = manifest.to_bytes()
    try:
        if path.read_bytes() == data:
            return
    except FileNotFoundError:
        pass
    with out_of_space(path):
        if not path.parent.exists():  # a new stream: its directory's entry made durable too
            path.parent.mkdir(mode=FileModes.from_environment().directory, parents=True)
            fsync_dir(path.parent.parent)
            fsync_dir(root)
        write_bytes(path, data)


def stream_ids_on_disk(root: Path) -> list[int]:
    """The stream ids that have a directory under `data/`, ascending."""
    data = root / "data"
    if not data.is_dir():
        return []
    return sorted(int(p.name) for p in data.iterdir() if p.name.isascii() and p.name.isdigit())


UNREADABLE_ID = "unreadable"


def _read_store_file(root: Path) -> dict | None:
    """What `store.json` holds; None when there is none; `ValueError` when it is no object."""
    try:
        raw = json.loads((root / STORE_FILE).read_bytes())  # ValueError if no JSON
    except FileNotFoundError:
        return None
    if not isinstance(raw, dict):
        msg = f"{STORE_FILE} holds no JSON object"
        raise ValueError(msg)
    return raw


def read_store_id(root: Path) -> str | None:
    """The id in `store.json`, or None when there is none (a new store, or a lost file);
    `UNREADABLE_ID` when the file holds no JSON object."""
    try:
        raw = _read_store_file(root)
    except ValueError:
        return UNREADABLE_ID
    return None if raw is None else str(raw.get("store_id"))


def read_store_format(root: Path) -> object | None:
    """The format `store.json` names, as written; None without one (or an unreadable file,
    which `read_store_id` reports)."""
    try:
        raw = _read_store_file(root)
    except ValueError:
        return None
    return None if raw is None else raw.get("format")


def write_store_id(root: Path, store_id: str, store_format: int) -> None:
    path = root / STORE_FILE
    data = {"store_id": store_id, "format": store_format}
    with out_of_space(path):
        write_bytes(path, (json.dumps(data) + "\n").encode())
