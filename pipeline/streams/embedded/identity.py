"""Which stream a cut was taken from: a cut of an earlier stream of the same name is refused.

Stream ids are never reused (FORMAT.md), so the id a `v2` cut carries names exactly one stream
of this store: a stream deleted and created again under its name has another id, and a cut of
the deleted one is refused with `StaleCut` wherever it is used (reads, reader groups,
truncation), instead of being read as a position of the new one. A `v1` cut carries no id and
cannot be checked (FORMAT.md, "Stream cuts").
"""

from __future__ import annotations

from datetime import UTC, datetime

from pipeline.streams.cut import StreamCut
from pipeline.streams.embedded.catalog import Catalog
from pipeline.streams.errors import StaleCut


def check_identity(catalog: Catalog, stream_id: int, cut: StreamCut) -> None:
    """Raise `StaleCut` if `cut` names a stream id other than `stream_id`, the id of the live
    stream of the cut's name; the message says what became of the stream it names."""
    if cut.stream_id is None or cut.stream_id == stream_id:
        return
    raise StaleCut(cut.text, cut.stream, cut.stream_id, stream_id, _earlier(catalog, cut))


def _earlier(catalog: Catalog, cut: StreamCut) -> str:
    """What the catalog knows of the stream the cut names."""
    found = catalog.query_one(
        "SELECT scope, name, created_ns, deleted FROM streams WHERE id=?", (cut.stream_id,)
    )
    if found is None:
        return "which this store never had: a cut from another store?"
    scope, name, created_ns, deleted = found
    created = datetime.fromtimestamp(created_ns / 1e9, UTC).isoformat(timespec="seconds")
    if (scope, name) != (cut.scope, cut.stream_name):
        return f"which is {scope}/{name} in this store: a cut from another store?"
    return f"created {created}, {'deleted since' if deleted else 'live'}"
