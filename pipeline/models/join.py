"""The time-series join as a replay model: two series of one slice, each record paired with
its nearest predecessor and successor in the other (`pipeline.timejoin` has the semantics).

The two series are the rows whose `split_column` equals `left` and `right` (by default two
interfaces of the NIC samples: `Interface` = `eth0` / `wlan0`). Times are `time_column`
(integer nanoseconds by default, joined exactly); `max_gap_seconds` limits pairs.
"""

from __future__ import annotations

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.timejoin import JoinInputError, gap_in_units, join_tables

NS = 1_000_000_000


def join(
    frame: pd.DataFrame,
    *,
    left: str = "eth0",
    right: str = "wlan0",
    split_column: str = "Interface",
    time_column: str = "TimestampNanos",
    max_gap_seconds: float | None = None,
) -> tuple[pd.DataFrame, dict]:
    """Pairs as rows with `left_*` and `right_*` columns; counts as metrics."""
    table = pa.Table.from_pandas(frame, preserve_index=False)
    names = table.column_names
    if split_column not in names:
        reason = f"it has no column {split_column!r} to split (columns: {', '.join(names)})"
        source = "the slice"
        raise JoinInputError(source, reason)
    series = [table.filter(pc.equal(table[split_column], v)) for v in (left, right)]
    is_int = time_column in names and pa.types.is_integer(table[time_column].type)
    gap = gap_in_units(max_gap_seconds, NS if is_int else 1)  # a timestamp: in seconds
    result = join_tables(series[0], series[1], time_column=time_column, max_gap=gap)
    metrics = {"left": left, "right": right, **result.as_dict()}
    return result.table.to_pandas(), metrics
