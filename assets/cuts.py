"""Typed metadata shared by Sluice's assets: the cut range a step covered.

Every materialization of a streaming asset records the stream positions it covered as
`start_cut` / `end_cut` (stream-cut texts, `v1~scope~stream~seg-off...`, or `head` for the
start of a stream), so the lineage of any output row can be followed back to stream
positions, and a later step can tell where this one ended.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import dagster as dg

from assets.keys import END_CUT, START_CUT
from pipeline.streams import StreamCut


def cut_range_metadata(start: StreamCut | str | None, end: StreamCut | str) -> dict[str, Any]:
    """`start_cut` and `end_cut` as text metadata (start `head` when the step began at the head)."""
    return {
        START_CUT: dg.MetadataValue.text(str(start) if start is not None else "head"),
        END_CUT: dg.MetadataValue.text(str(end)),
    }


def metadata_text(metadata: Mapping[str, Any], key: str) -> str | None:
    """The text of a metadata entry read back from the instance (or None)."""
    value = metadata.get(key)
    if value is None:
        return None
    return str(getattr(value, "value", getattr(value, "text", value)))
