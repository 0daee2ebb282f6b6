"""A small backlog as one batch in this process, without Spark.

A run until caught up (`--available-now`) of a one-source job whose checkpoint is settled
(nothing in doubt) and whose backlog is at most `RunOptions.in_process_bytes` runs that one
batch here, the way Spark would run it:

1. Spark's offset log entry for batch N+1 (`spark/offsets/N+1`: the metadata line of batch N
   with a new timestamp, the source's offset, the tail cut) — the batch is now planned;
2. the sink's own code over the batch's ranges: the data source's stream writer (one task over
   every range, then the driver's `commit(messages, N+1)` through the sink's ledger), or the
   job's `foreachBatch` function over the events;
3. Spark's commit log entry (`spark/commits/N+1`, a copy of batch N's) — the batch is done.

A crash or a failure between 1 and 3 leaves batch N+1 planned and uncommitted, as a driver
crash does: the next run finds it (`checkpoint.planned_batch`) and re-runs it over the cuts of
its offset log entry — here when it is small, else in Spark — and the sink's ledger or the
job's batch states make the re-run publish once. A failure here also hands the batch to
Spark in the same run, but for an output that refused a write (`OutputNotWritable`: a full
disk) and a store error that a re-run meets again (`is_retryable`: a truncation, damage),
which stop the run: Spark would fail the same way, after starting. `DESIGN.md`,
"Small backlogs without Spark".
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline import durable
from pipeline.outputs import OutputNotWritable
from pipeline.streams import (
    StoreUnavailable,
    StreamCut,
    StreamStoreError,
    TxnFailed,
    open_store,
)

if TYPE_CHECKING:
    import pyarrow as pa

    from pipeline.spark.reading import SegmentRange

log = logging.getLogger(__name__)

#: Runs batch N (its id, its ranges) in this process; returns its input rows, as Spark's
#: progress counts them (range rows, or events); a sink with a ledger records the rest.
InProcessBatch = Callable[[int, "list[SegmentRange]"], int]

#: The default `RunOptions.in_process_bytes`: a backlog up to this many bytes runs without
#: Spark (a catch-up of 100,000 NIC samples is about 4 MB).
IN_PROCESS_BYTES = 32 << 20
#: Overrides that default for every run of a process and its children (0: always Spark).
IN_PROCESS_ENV = "SLUICE_IN_PROCESS_BYTES"


def default_in_process_bytes() -> int:
    """`$SLUICE_IN_PROCESS_BYTES` when set, else `IN_PROCESS_BYTES`."""
    text = os.environ.get(IN_PROCESS_ENV)
    if text is None:
        return IN_PROCESS_BYTES
    try:
        value = int(text.strip())
    except ValueError:
        value = -1
    if value < 0:
        from pipeline.settings import SettingsError

        problem = f"{text!r} is not a number of bytes, 0 (always Spark) or more"
        raise SettingsError(IN_PROCESS_ENV, problem)
    return value


def is_retryable(error: StreamStoreError) -> bool:
    """Whether Spark's re-run of a batch that failed here with `error` may succeed: a store
    that could not be reached may be back, and an aborted transaction is written anew. Any
    other store error (`Truncated`, `Corrupted`, …) is about the data: a re-run meets it
    again."""
    return isinstance(error, StoreUnavailable | TxnFailed)


@dataclass(frozen=True, slots=True)
class InProcessResult:
    """What a batch run here did: its id, its input rows and how long it took."""

    batch_id: int
    input_rows: int
    duration_ms: int


def stream_writer_batch(format_name: str, options: dict[str, str]) -> InProcessBatch:
    """A batch through the stream writer of the data source `format_name` (`sluice`,
    `sluice-export`), as Spark runs it: `write` as one task over every range row of the
    batch (`emit=ranges`), then the driver's `commit` with the batch id (the sink's ledger
    makes it exactly-once). Nothing of Spark is imported until a batch runs."""

    def run(batch_id: int, ranges: list[SegmentRange]) -> int:
        from pyspark.sql.datasource import CaseInsensitiveDict

        from pipeline.spark.source import DATA_SOURCES

        source = DATA_SOURCES[format_name](CaseInsensitiveDict(options))
        writer = source.streamWriter(None, False)  # type: ignore[arg-type]
        message = writer.write(iter([range_rows(ranges)]))
        writer.commit([message], batch_id)
        return len(ranges)

    return run


def events_batch(process: Callable[[pa.Table, int], None]) -> InProcessBatch:
    """A batch of a `foreachBatch` job: its events as the Arrow table the job gets from
    Spark's `toArrow()` (the `sluice` source's event columns), then `process(events, id)`."""

    def run(batch_id: int, ranges: list[SegmentRange]) -> int:
        import pyarrow as pa

        from pipeline.spark.reading import ARROW_SCHEMA, read_range

        batches = [batch for part in ranges for batch in read_range(part)]
        events = pa.Table.from_batches(batches, schema=ARROW_SCHEMA)
        process(events, batch_id)
        return events.num_rows

    return run


def range_rows(ranges: list[SegmentRange]) -> pa.RecordBatch:
    """The ranges as the `sluice` source's range rows (`emit=ranges`)."""
    import pyarrow as pa

    from pipeline.spark.reading import RANGE_ARROW

    rows = [
        {"store": r.store, "stream": r.stream, "segment": r.segment, "start": r.start, "end": r.end}
        for r in ranges
    ]
    return pa.RecordBatch.from_pylist(rows, schema=RANGE_ARROW)


def run_in_process(
    spark_dir: Path,
    store: str,
    stream: str,
    *,
    batch_id: int,
    cuts: tuple[StreamCut, StreamCut],
    planned: bool,
    batch: InProcessBatch,
) -> InProcessResult | None:
    """Batch `batch_id` over `cuts` here (module doc): planned first unless it is `planned`
    already (a batch an earlier run planned and never committed: it is re-run over the cuts
    of its offset log entry, as Spark's restart would). None, with the batch left planned for
    Spark to re-run, when the sink failed; an `OutputNotWritable` or a store error that is
    not `is_retryable` is raised instead (the batch stays planned all the same)."""
    start, end = cuts
    last = batch_id - 1
    started = time.monotonic()
    from pipeline.spark.options import SourceOptions
    from pipeline.spark.reading import plan_ranges

    with open_store(store) as opened:
        options = SourceOptions.parse({"store": store, "stream": stream, "minPartitions": "1"})
        ranges = plan_ranges(opened, options, start, end)
    if not planned:
        write_offset_entry(spark_dir, last, batch_id, end)
    try:
        input_rows = batch(batch_id, ranges)
    except OutputNotWritable:  # Spark would fail the same way, after starting: stop here
        raise
    except Exception as exc:  # the batch stays planned: Spark re-runs it from the offset log
        if isinstance(exc, StreamStoreError) and not is_retryable(exc):
            raise  # a truncation, damage: Spark would fail the same way, after starting
        log.warning("batch %d in this process failed (%s): Spark runs it", batch_id, exc)
        return None
    write_commit_entry(spark_dir, last, batch_id)
    duration = int((time.monotonic() - started) * 1000)
    return InProcessResult(batch_id, input_rows, duration)


def write_offset_entry(spark_dir: Path, last: int, batch_id: int, end: StreamCut) -> None:
    """Spark's offset log entry for `batch_id`: the version line and the metadata of batch
    `last` (Spark's own settings for this query) with this batch's time, then the `sluice`
    source's offset, `{"cut": …}` (`reading.offset_of`), as Spark writes them."""
    lines = (spark_dir / "offsets" / str(last)).read_text().splitlines()
    metadata = json.loads(lines[1])
    metadata["batchTimestampMs"] = time.time_ns() // 10**6
    entry = [lines[0], json.dumps(metadata, separators=(",", ":")), json.dumps({"cut": end.text})]
    durable.write_text(spark_dir / "offsets" / str(batch_id), "\n".join(entry))


def write_commit_entry(spark_dir: Path, last: int, batch_id: int) -> None:
    """Spark's commit log entry for `batch_id`: the same as batch `last`'s (a stateless query
    records only its watermark, which a `sluice` job does not use)."""
    text = (spark_dir / "commits" / str(last)).read_text()
    durable.write_text(spark_dir / "commits" / str(batch_id), text)
