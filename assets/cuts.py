"""Typed metadata shared by Sluice's assets: the cut range a step covered, its counts, its lag.

Every materialization of a streaming asset records the stream positions it covered as
`start_cut` / `end_cut` (stream-cut texts, `v1~scope~stream~seg-off...`), so the lineage of any
output row can be followed back to stream positions, and a later step can pick up where this
one ended (`last_end_cut`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import dagster as dg

from pipeline.streams import StreamCut

START_CUT = "start_cut"
END_CUT = "end_cut"


def cut_range_metadata(start: StreamCut | str | None, end: StreamCut | str) -> dict[str, Any]:
    """`start_cut` and `end_cut` as text metadata (start `head` when the step began at the head)."""
    return {
        START_CUT: dg.MetadataValue.text(str(start) if start is not None else "head"),
        END_CUT: dg.MetadataValue.text(str(end)),
    }


def lag_metadata(position: StreamCut, tail: StreamCut) -> dict[str, Any]:
    """How far `position` is behind the source's `tail`, in bytes over all segments."""
    return {"lag_bytes": dg.MetadataValue.int(position.bytes_until(tail))}


def metadata_text(metadata: Mapping[str, Any], key: str) -> str | None:
    """The text of a metadata entry read back from the instance (or None)."""
    value = metadata.get(key)
    if value is None:
        return None
    return str(getattr(value, "value", getattr(value, "text", value)))


def last_end_cut(instance: dg.DagsterInstance, key: dg.AssetKey) -> StreamCut | None:
    """The `end_cut` of the latest materialization of `key`, if it has one."""
    event = instance.get_latest_materialization_event(key)
    if event is None or event.asset_materialization is None:
        return None
    text = metadata_text(event.asset_materialization.metadata, END_CUT)
    if not text or text == "head":
        return None
    return StreamCut.parse(text)
