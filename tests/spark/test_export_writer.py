"""The export's task side without Spark: rows split by event hour, as slices or picked out;
a task's chunks written in order by its writer thread, and a failed write failing the task."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.spark import export_writer
from pipeline.spark.export_layout import STAGING
from pipeline.spark.export_writer import HOUR_NS, by_hour, export_task
from pipeline.spark.options import ExportOptions

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


def event_batch(first: int, count: int, samples: int = 3) -> pa.RecordBatch:
    """`count` NIC events as rows of the `sluice` source, numbered from `first` (samples 30 s
    apart)."""
    payloads = [
        json.dumps(
            {
                "RemoteAddr": "edge",
                "Interface": "eth0",
                "TimestampNanos": [T0 + (i * samples + k) * 30 * 10**9 for k in range(samples)],
                "RxBytes": [i * 10 + k for k in range(samples)],
                "TxBytes": [k for k in range(samples)],
            }
        ).encode()
        for i in range(first, first + count)
    ]
    return pa.RecordBatch.from_pydict(
        {
            "segment": pa.array([0] * count, pa.int32()),
            "offset": pa.array(range(first, first + count), pa.int64()),
            "payload": pa.array(payloads, pa.binary()),
        }
    )


def options(output: Path, **extra: str) -> ExportOptions:
    return ExportOptions.parse({"schema": "NetworkSamples", "output": str(output), **extra})


def test_a_tasks_chunks_are_written_in_their_order(tmp_path):
    batches = [event_batch(first, 7) for first in range(0, 70, 7)]  # 10 chunks, 2 hours
    message = export_task(options(tmp_path, formats="parquet,csv"), iter(batches))
    assert (message.events, message.rows, message.quarantined) == (70, 210, 0)
    for kind in ("parquet", "csv"):
        files = [Path(f.staged) for f in message.files if f.kind == kind]
        assert len(files) == 2  # one per hour
        if kind == "parquet":
            offsets = [o for f in files for o in pq.read_table(f)["_offset"].to_pylist()]
        else:
            lines = [line for f in files for line in f.read_text().splitlines()[1:]]
            offsets = [int(line.split(",")[6]) for line in lines]
        assert offsets == [i for i in range(70) for _ in range(3)]


def test_a_failed_write_fails_the_task_and_leaves_nothing_staged(tmp_path, monkeypatch):
    calls = []
    write = export_writer._write

    def fail_second(current, table):
        calls.append(table.num_rows)
        if len(calls) == 2:
            msg = "disk full"
            raise OSError(msg)
        write(current, table)

    monkeypatch.setattr(export_writer, "_write", fail_second)
    batches = [event_batch(first, 2) for first in range(0, 20, 2)]
    with pytest.raises(OSError, match=re.escape("disk full")):
        export_task(options(tmp_path, formats="parquet"), iter(batches))
    assert not any((tmp_path / STAGING).iterdir())
