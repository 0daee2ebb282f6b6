"""The task side of the `sluice-export` sink: flatten a task's events into staged files.

Each task reads its events (rows of the `sluice` source, or its own segment ranges when the
source emits ranges), flattens them through the Avro plan (`pipeline.schemas.flatten`) and
writes complete, fsynced files under `<output>/_staging/<task token>/`, rolled at
`maxRowsPerFile` rows and split by the rows' event hour. Nothing here is visible to readers
of the output: the driver publishes the files (`export_sink.py`). Kept apart from it so the
driver's processes (which only publish) do not import pyarrow, numpy and the flatten.
"""

from __future__ import annotations

import contextlib
import shutil
import uuid
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from pyspark.sql.datasource import WriterCommitMessage

from pipeline.outputs import refused_writes
from pipeline.schemas import Events, Flattened, FlattenPlan, flatten, flatten_plan
from pipeline.spark.export_layout import (
    EXTENSIONS,
    RERUN,
    STAGING,
    StagedFile,
    fsync_all,
)
from pipeline.spark.options import ExportOptions, source_store

HOUR_NS = 3600 * 10**9
CHUNK_EVENTS = 1024
CHUNK_BYTES = 32 << 20
#: flattened chunks a task's writer thread may have queued or under way (`_TaskFiles`)
WRITES_AHEAD = 1
#: files a task keeps open at once (`_TaskFiles`): a batch whose events span thousands of
#: hours (a backfill, a clock that jumps) would otherwise hold one open file per hour and
#: format to the end of the task, until the process runs out of file descriptors
MAX_OPEN_FILES = 64


def bucket_of(hour: int) -> str:
    """`date=…/hour=…` of an hour number (hours since the epoch, UTC)."""
    start = datetime.fromtimestamp(hour * 3600, tz=UTC)
    return f"date={start:%Y-%m-%d}/hour={start:%H}"


def by_hour(rows: pa.Table, time_ns: np.ndarray) -> Iterator[tuple[int, pa.Table]]:
    """The rows of each event hour (`time_ns`: each row's event time), hours in ascending
    order, rows in their order: slices of `rows` when the times are sorted, as a collector
    writes them; else each hour's rows picked out."""
    low, high = int(time_ns.min()) // HOUR_NS, int(time_ns.max()) // HOUR_NS
    if low == high:
        yield low, rows
        return
    if (time_ns[:-1] <= time_ns[1:]).all():
        if high - low < len(time_ns):
            # the first row of each later hour: the first time at or after the hour's start
            starts = np.searchsorted(time_ns, np.arange(low + 1, high + 1) * HOUR_NS).tolist()
        else:  # hours far apart (a clock at 1970 beside one at 2026): only the hours held
            hours = time_ns // HOUR_NS
            starts = (np.flatnonzero(hours[1:] != hours[:-1]) + 1).tolist()
        for start, end in pairwise([0, *starts, len(time_ns)]):
            if end > start:
                yield int(time_ns[start]) // HOUR_NS, rows.slice(start, end - start)
        return
    hours = time_ns // HOUR_NS
    for hour in np.unique(hours).tolist():
        yield hour, rows.filter(pa.array(hours == hour))


@dataclass(frozen=True)
class FilesMessage(WriterCommitMessage):
    """One task's staged files and counts."""

    partition: int
    files: tuple[StagedFile, ...]
    events: int
    rows: int
    quarantined: int
    min_time_ns: int | None
    max_time_ns: int | None


@dataclass
class _Open:
    """A staged file being written."""

    path: Path
    writer: Any
    kind: str
    bucket: str
    rows: int = 0


@dataclass
class _TaskFiles:
    """The files one task writes, rolled at `max_rows` rows per file (executor side).

    `write` hands a flattened chunk to one writer thread, which writes the chunks in the
    order given while the task flattens the next one (pyarrow encodes and compresses without
    the GIL): the two share the cores Spark leaves idle, such as when a batch has one task.
    At most one chunk waits behind the one being written; a failed write raises in the task
    at its next `write` or at `close`. At most `max_open` files are open: a new one closes
    the file written to least recently first (later rows of its hour start another file)."""

    opts: ExportOptions
    plan: FlattenPlan
    directory: Path
    open: dict[tuple[str, str], _Open] = field(default_factory=dict)
    done: list[StagedFile] = field(default_factory=list)
    counter: int = 0
    max_open: int = MAX_OPEN_FILES
    #: when each file was last written to (`ticks`: the number of `_append`s so far)
    used: dict[tuple[str, str], int] = field(default_factory=dict)
    ticks: int = 0
    pool: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(1, "export"))
    pending: deque[Future] = field(default_factory=deque)

    def write(self, result: Flattened) -> None:
        """Queue a flattened chunk's rows and quarantined events (see the class doc)."""
        while self.pending and (self.pending[0].done() or len(self.pending) >= WRITES_AHEAD):
            self.pending.popleft().result()  # a failed write raises here
        chunk = (result.rows, result.time_ns, result.quarantine)
        self.pending.append(self.pool.submit(self._write_chunk, *chunk))

    def _write_chunk(self, rows: pa.Table, time_ns: np.ndarray, quarantine: pa.Table) -> None:
        self.write_rows(rows, time_ns)
        self.write_quarantine(quarantine)

    def write_rows(self, rows: pa.Table, time_ns: np.ndarray) -> None:
        if rows.num_rows == 0:
            return
        for hour, part in by_hour(rows, time_ns):
            for kind in self.opts.formats:
                self._append(kind, bucket_of(hour), part)

    def write_quarantine(self, table: pa.Table) -> None:
        if table.num_rows:
            self._append("quarantine", "", table)

    def _append(self, kind: str, bucket: str, table: pa.Table) -> None:
        if kind in ("csv", "jsonl"):
            table = _plain(table)
        start = 0
        self.ticks += 1
        self.used[(kind, bucket)] = self.ticks
        while start < table.num_rows:
            current = self.open.get((kind, bucket)) or self._start(kind, bucket, table.schema)
            take = min(table.num_rows - start, self.opts.max_rows_per_file - current.rows)
            _write(current, table.slice(start, take))
            current.rows += take
            start += take
            if current.rows >= self.opts.max_rows_per_file:
                self._close(current)

    def _start(self, kind: str, bucket: str, schema: pa.Schema) -> _Open:
        if len(self.open) >= self.max_open:
            self._close(self.open[min(self.open, key=self.used.__getitem__)])
        self.counter += 1
        ext = EXTENSIONS.get(kind, "parquet")
        path = self.directory / f"{self.counter:06d}.{ext}"
        opened = _Open(path, _writer(kind, path, schema, self.plan), kind, bucket)
        self.open[(kind, bucket)] = opened
        return opened

    def _close(self, current: _Open) -> None:
        """Finish a file (fsynced later, with the task's others: `close`)."""
        current.writer.close()
        del self.open[(current.kind, current.bucket)]
        self.done.append(
            StagedFile(
                str(current.path),
                current.kind,
                current.bucket,
                current.rows,
                current.path.stat().st_size,
            )
        )

    def close(self) -> tuple[StagedFile, ...]:
        """Finish the open files; make every file and their names durable (fsyncs at once)."""
        try:
            while self.pending:
                self.pending.popleft().result()
        finally:
            self.pool.shutdown()
        for current in list(self.open.values()):
            self._close(current)
        fsync_all([*(Path(f.staged) for f in self.done), self.directory])
        return tuple(self.done)

    def discard(self) -> None:
        for queued in self.pending:
            queued.cancel()
        self.pool.shutdown()  # a write under way ends before its file is closed
        for current in self.open.values():
            with contextlib.suppress(Exception):
                current.writer.close()
        shutil.rmtree(self.directory, ignore_errors=True)


class _JsonLines:
    """JSON lines of flattened rows (binary values as Latin-1 text, as Avro JSON does)."""

    def __init__(self, path: Path) -> None:
        self.handle = path.open("wb")

    def write_table(self, table: pa.Table) -> None:
        rows = table.to_pylist()
        self.handle.write(b"".join(msgspec.json.encode(r, enc_hook=_latin1) + b"\n" for r in rows))

    def close(self) -> None:
        self.handle.close()


def _latin1(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("latin-1")
    msg = f"cannot write {type(value).__name__} as JSON"
    raise TypeError(msg)


def parquet_options(plan: FlattenPlan) -> dict[str, Any]:
    """Encodings per column, chosen for speed of writing (zstd on top of all of them, at its
    fast level -1: on the NIC export, about a tenth less Parquet CPU than its default level
    for about 1% more bytes).

    Dictionary pages only for values that repeat within an event (its scalars, its
    position): trying dictionaries on per-sample counters costs about half the write time and
    then falls back to plain pages anyway. Delta encoding for the sample index and an integer
    event-time column: their steps are nearly constant, so there is little left to compress.
    Statistics (min/max) only for the columns queries prune by. Values go to the encoders in
    batches of 64 Ki rows rather than 1 Ki: fewer rounds of per-batch work (a dictionary
    column's statistics, the page-size checks) for the same pages' content.
    """
    scalars = [c.name for c in plan.columns if c.kind == "scalar"]
    delta = ["_sample"]
    time = [plan.time.name] if plan.time is not None else []
    if time and time[0] not in scalars:
        delta.append(time[0])
    return {
        "compression": "zstd",
        "compression_level": -1,
        "use_dictionary": [*scalars, "_segment", "_offset"],
        "column_encoding": dict.fromkeys(delta, "DELTA_BINARY_PACKED"),
        # min/max where queries prune by them: sensor, time, position (not every counter)
        "write_statistics": [*scalars, *time, "_segment", "_offset"],
        "write_batch_size": 64 << 10,
    }


def _writer(kind: str, path: Path, schema: pa.Schema, plan: FlattenPlan) -> Any:
    if kind == "parquet":
        return pq.ParquetWriter(path, schema, **parquet_options(plan))
    if kind == "quarantine":
        names = [f.name for f in schema if f.name != "payload"]
        return pq.ParquetWriter(path, schema, compression="zstd", use_dictionary=names)
    if kind == "csv":
        options = pacsv.WriteOptions(include_header=True, quoting_style="needed")
        return pacsv.CSVWriter(path, _csv_schema(schema), write_options=options)
    return _JsonLines(path)


def _plain(table: pa.Table) -> pa.Table:
    """Dictionary columns decoded to their values (for the text formats)."""
    fields = [
        pa.field(f.name, f.type.value_type, f.nullable) if pa.types.is_dictionary(f.type) else f
        for f in table.schema
    ]
    return table.cast(pa.schema(fields))


def _csv_schema(schema: pa.Schema) -> pa.Schema:
    """CSV has no binary type: binary columns are written as Latin-1 text (Avro JSON's form)."""
    return pa.schema(
        [pa.field(f.name, pa.string()) if pa.types.is_binary(f.type) else f for f in schema]
    )


def _write(current: _Open, table: pa.Table) -> None:
    if current.kind == "csv" and any(pa.types.is_binary(t) for t in table.schema.types):
        arrays = [
            pa.array([v.decode("latin-1") if v is not None else None for v in c.to_pylist()])
            if pa.types.is_binary(c.type)
            else c
            for c in table.columns
        ]
        table = pa.Table.from_arrays(arrays, schema=_csv_schema(table.schema))
    current.writer.write_table(table)


def export_task(opts: ExportOptions, batches: Iterator[pa.RecordBatch]) -> FilesMessage:
    """Flatten one task's events and write them as staged files (executor side). A disk
    that refuses a write (full, read-only) fails the task with `OutputNotWritable`, its
    staged files removed."""
    from pyspark import TaskContext

    context = TaskContext.get()
    partition = context.partitionId() if context is not None else 0
    with refused_writes(Path(opts.output), RERUN):
        return _stage(opts, partition, batches)


def _stage(opts: ExportOptions, partition: int, batches: Iterator[pa.RecordBatch]) -> FilesMessage:
    plan = flatten_plan(opts.schema, opts.time_field)
    directory = Path(opts.output) / STAGING / f"t{partition:04d}-{uuid.uuid4().hex}"
    directory.mkdir(parents=True)
    files = _TaskFiles(opts, plan, directory)
    events = rows = quarantined = 0
    low: int | None = None
    high: int | None = None
    try:
        for events_chunk in event_chunks(batches):
            result = flatten(plan, events_chunk, dictionary=True)
            files.write(result)
            events += result.events
            rows += result.rows.num_rows
            quarantined += result.quarantine.num_rows
            if result.rows.num_rows:  # (an event time of 0, 1970-01-01, is a time)
                first, last = int(result.time_ns.min()), int(result.time_ns.max())
                low = first if low is None else min(low, first)
                high = last if high is None else max(high, last)
        staged = files.close()
    except BaseException:
        files.discard()
        raise
    return FilesMessage(partition, staged, events, rows, quarantined, low, high)


def event_chunks(batches: Iterator[pa.RecordBatch]) -> Iterator[Events]:
    """Events from rows of the `sluice` source: event rows, or range rows (`emit=ranges`),
    whose events this task reads from the store itself."""
    for batch in batches:
        if "payload" in batch.schema.names:
            yield Events.from_arrow(batch)
            continue
        for row in batch.to_pylist():
            yield from range_events(
                row["store"], row["stream"], row["segment"], (row["start"], row["end"])
            )


def range_events(
    store_uri: str, stream: str, segment: int, span: tuple[int, int]
) -> Iterator[Events]:
    """The events of one segment range, in chunks of at most CHUNK_EVENTS / CHUNK_BYTES."""
    columns: tuple[list, ...] = ([], [], [], [])
    size = 0
    with source_store(store_uri) as store:
        for event in store.read_segment(stream, segment, span[0], span[1]):
            for column, value in zip(
                columns,
                (event.payload, event.offset, event.routing_key, event.ingest_time_ns),
                strict=True,
            ):
                column.append(value)
            size += len(event.payload)
            if len(columns[0]) >= CHUNK_EVENTS or size >= CHUNK_BYTES:
                yield _events(stream, segment, columns)
                columns, size = ([], [], [], []), 0
    if columns[0]:
        yield _events(stream, segment, columns)


def _events(stream: str, segment: int, columns: tuple[list, ...]) -> Events:
    payloads, offsets, keys, ingest = columns
    return Events(stream, payloads, [segment] * len(payloads), offsets, keys, ingest)
