"""The export's task side without Spark: rows split by event hour, as slices or picked out."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from pipeline.spark.export_writer import HOUR_NS, by_hour

T0 = 1_609_362_000_000_000_000  # 2020-12-30T21:00:00Z


def split(times: list[int]) -> list[tuple[int, list[int]]]:
    """`by_hour` of rows numbered 0.. with these event times: (hour, row numbers) per part."""
    rows = pa.table({"n": pa.array(range(len(times)), pa.int32())})
    return [(h, part.column("n").to_pylist()) for h, part in by_hour(rows, np.array(times))]


def expected(times: list[int]) -> list[tuple[int, list[int]]]:
    hours = [t // HOUR_NS for t in times]
    return [(h, [i for i, x in enumerate(hours) if x == h]) for h in sorted(set(hours))]


def test_sorted_times_split_into_slices_at_each_hour():
    times = [T0 - 1, T0, T0 + 5, T0 + 3 * HOUR_NS, T0 + 3 * HOUR_NS + 1]
    assert (
        split(times)
        == expected(times)
        == [
            (T0 // HOUR_NS - 1, [0]),
            (T0 // HOUR_NS, [1, 2]),
            (T0 // HOUR_NS + 3, [3, 4]),
        ]
    )


def test_unsorted_times_keep_their_rows_order_within_each_hour():
    times = [T0 + HOUR_NS, T0, T0 + HOUR_NS + 7, T0 + 1, T0 - HOUR_NS]
    assert split(times) == expected(times)


def test_one_hour_is_the_rows_as_they_are():
    rows = pa.table({"n": [1, 2, 3]})
    [(hour, part)] = by_hour(rows, np.array([T0, T0 + 2, T0 + 1]))
    assert hour == T0 // HOUR_NS and part is rows


def test_times_before_1970_go_to_their_own_hours():
    times = [-1, 0, HOUR_NS - 1, HOUR_NS]
    assert split(times) == expected(times) == [(-1, [0]), (0, [1, 2]), (1, [3])]
