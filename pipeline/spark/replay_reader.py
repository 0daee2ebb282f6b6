"""A replay's read: each Spark task flattens its segment ranges; the driver merges the rows.

    chunks = ranges.mapInArrow(SliceReader(plan, bounds), CHUNK_SCHEMA).toArrow()
    rows, quarantine, events = slice_rows(chunks, plan)

The tasks run over the range rows of the `sluice` source (`emit=ranges`), like the export's:
each reads its ranges from the store (`export_writer.range_events`), keeps the events of the
slice's routing key, flattens them (`pipeline.schemas.flatten`, per-event columns as
dictionaries), keeps the rows inside the slice's time bounds and sensor, sorts them by event
time and ships each chunk as one row (`CHUNK_SCHEMA`) that holds its rows as an Arrow IPC
stream, or, when the executors share the driver's files, the path of a spool file holding
it: Spark moves bytes, or only a path, instead of converting every value. On the driver
`slice_rows` merges the chunks into one table in (event time, segment, offset, sample)
order, with the columns of a driver-side flatten: the same rows, the same types.

Delivery: the tasks hold no state and read the same events for the same cuts; Spark keeps
the output of one attempt of each task, so the driver sees every event of the slice once.
Why IPC bytes and spool files, and how the order is kept: `pipeline/jobs/DESIGN.md`,
"replay"."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.schemas import Events, FlattenPlan, flatten
from pipeline.schemas.sensors import sensor_names

ROW_TIME, ROW_KEY = "_time_ns", "_routing_key"
CHUNK_SCHEMA = "segment int, start long, events long, rows binary, path string, quarantine binary"
CHUNK_ARROW = pa.schema(
    [
        ("segment", pa.int32()),
        ("start", pa.int64()),
        ("events", pa.int64()),
        ("rows", pa.binary()),
        ("path", pa.string()),
        ("quarantine", pa.binary()),
    ]
)
#: Bytes of stream per task, at most: a task's chunks travel to the driver in one Arrow
#: batch, whose binary column Spark caps at 2 GiB (flattened rows take about as many bytes
#: as the JSON they come from).
TASK_BYTES = 256 << 20


@dataclass(frozen=True, slots=True)
class SliceBounds:
    """What of the slice's events a replay keeps: rows of `sensor` (its routing key, or the
    `sensor_by` columns joined with `/`; None for every sensor) whose event time is in
    [start_time_ns, end_time_ns]."""

    sensor: str | None
    sensor_by: str | None
    start_time_ns: int
    end_time_ns: int

    @property
    def by_key(self) -> bool:
        return self.sensor is not None and self.sensor_by in (None, "routing_key")


@dataclass(frozen=True, slots=True)
class SliceReader:
    """The function `mapInArrow` runs over range rows (executor side; pickled to tasks).

    With `spool` (a directory the driver reads too) each chunk's rows go to a file there and
    only its path travels through Spark; without, the rows travel as bytes in the row."""

    plan: FlattenPlan
    bounds: SliceBounds
    spool: str | None = None

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pipeline.spark.export_writer import range_events

        for batch in batches:
            for part in batch.to_pylist():
                span = (part["start"], part["end"])
                for events in range_events(part["store"], part["stream"], part["segment"], span):
                    yield self.chunk(events)

    def chunk(self, events: Events) -> pa.RecordBatch:
        """One chunk of one segment's events as one `CHUNK_ARROW` row."""
        read = len(events.payloads)
        start = int(events.offsets[0]) if read else 0
        segment = int(events.segments[0]) if read else 0
        events = _as_read_by_source(events, self.bounds)
        out = flatten(self.plan, events, dictionary=True)
        rows = _kept(self.bounds, _with_time_and_key(out.rows, out.time_ns, events))
        if _time_is_column(self.plan, rows):
            rows = rows.drop_columns([ROW_TIME])
        inline = path = None
        if rows.num_rows and self.spool is not None:
            path = str(Path(self.spool) / f"{segment}-{start}-{uuid.uuid4().hex}.arrows")
            with pa.OSFile(path, "wb") as sink:
                _write_ipc(rows, sink)
        elif rows.num_rows:
            inline = _ipc(rows)
        columns = [
            pa.array([segment], pa.int32()),
            pa.array([start], pa.int64()),
            pa.array([read], pa.int64()),
            _binary(inline),
            pa.array([path], pa.string()),
            _binary(_ipc(out.quarantine) if out.quarantine.num_rows else None),
        ]
        return pa.RecordBatch.from_arrays(columns, schema=CHUNK_ARROW)


def _as_read_by_source(events: Events, bounds: SliceBounds) -> Events:
    """The events as the `sluice` source's rows give them (ingest time in whole microseconds),
    only those of the slice's routing key when it is sliced by key."""
    keep = range(len(events.payloads))
    if bounds.by_key:
        keep = [i for i, key in enumerate(events.routing_keys) if key == bounds.sensor]
    return Events(
        events.stream,
        [events.payloads[i] for i in keep],
        [events.segments[i] for i in keep],
        [events.offsets[i] for i in keep],
        [events.routing_keys[i] for i in keep],
        [events.ingest_ns[i] // 1000 * 1000 for i in keep],
    )


def _with_time_and_key(rows: pa.Table, time_ns: np.ndarray, events: Events) -> pa.Table:
    """`rows` plus each row's event time and its event's routing key (as a dictionary over
    the events when `_offset` is one)."""
    rows = rows.combine_chunks()
    offsets = rows.column("_offset").chunk(0) if rows.num_rows else pa.array([], pa.int64())
    keys = pa.array(events.routing_keys, pa.string())
    where = np.asarray(events.offsets, dtype=np.int64)  # ascending: one segment, in order
    if pa.types.is_dictionary(offsets.type):
        owners = np.searchsorted(where, offsets.dictionary.to_numpy())
        key = pa.DictionaryArray.from_arrays(offsets.indices, keys.take(pa.array(owners)))
    else:
        key = keys.take(pa.array(np.searchsorted(where, offsets.to_numpy())))
    rows = rows.append_column(ROW_TIME, pa.array(time_ns, pa.int64()))
    return rows.append_column(pa.field(ROW_KEY, key.type), key)


def _time_is_column(plan: FlattenPlan, rows: pa.Table) -> bool:
    """Whether each row's event time is its value of the plan's time column (integer
    nanoseconds, no nulls): a chunk then leaves `_time_ns` out and the driver takes that
    column for it (fewer bytes to write, read and merge)."""
    if plan.time is None or plan.time.ns_per_unit != 1:
        return False
    column = rows.column(plan.time.name)
    return column.type == pa.int64() and column.null_count == 0


def _kept(bounds: SliceBounds, rows: pa.Table) -> pa.Table:
    """The rows of the sensor inside the time bounds, sorted by event time (stable: among
    equal times they stay in stream order, offset and sample)."""
    times = rows.column(ROW_TIME).to_numpy()
    keep = (times >= bounds.start_time_ns) & (times <= bounds.end_time_ns)
    if bounds.sensor is not None and not bounds.by_key:
        keep &= _sensor_by_columns(rows, bounds)
    if keep.all() and _ascending(times):
        return rows
    picked = np.flatnonzero(keep)
    kept = times[picked]
    order = picked if _ascending(kept) else picked[np.argsort(kept, kind="stable")]
    if len(order) == rows.num_rows and (len(order) < 2 or (np.diff(order) > 0).all()):
        return rows
    return rows.take(pa.array(order))


def _sensor_by_columns(rows: pa.Table, bounds: SliceBounds) -> np.ndarray:
    """Rows whose `sensor_by` columns, as text joined with `/`, are the sensor (a null is
    not): named as the bookmark job names them (`sensor_names`)."""
    names = sensor_names(rows, str(bounds.sensor_by))
    return pc.equal(names, bounds.sensor).fill_null(False).to_numpy(zero_copy_only=False)


def _ipc(table: pa.Table) -> pa.Buffer:
    sink = pa.BufferOutputStream()
    _write_ipc(table, sink)
    return sink.getvalue()


def _write_ipc(table: pa.Table, sink: pa.NativeFile) -> None:
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)


def _binary(value: pa.Buffer | None) -> pa.Array:
    """A binary array of one value, over `value`'s memory (no copy)."""
    if value is None:
        return pa.nulls(1, pa.binary())
    offsets = pa.py_buffer(np.array([0, value.size], dtype=np.int32).tobytes())
    return pa.Array.from_buffers(pa.binary(), 1, [None, offsets, value])


def _read_ipc(source: pa.Buffer | pa.NativeFile) -> pa.Table:
    return pa.ipc.open_stream(source).read_all()


def _values(column: pa.ChunkedArray) -> list[pa.Buffer | None]:
    """The values of a binary column as buffers over its memory (no copy)."""
    values: list[pa.Buffer | None] = []
    for array in column.chunks:
        _, offsets, data = array.buffers()
        valid = array.is_valid().to_numpy(zero_copy_only=False)
        ends = np.frombuffer(offsets, np.int32, len(array) + 1, array.offset * 4)
        values += [
            data.slice(int(ends[i]), int(ends[i + 1] - ends[i])) if valid[i] else None
            for i in range(len(array))
        ]
    return values


# --- the driver -----------------------------------------------------------------------------


def slice_rows(
    chunks: pa.Table, plan: FlattenPlan, *, decode: bool = True
) -> tuple[pa.Table, pa.Table, int]:
    """(rows, quarantined events, events read) of the chunks the tasks returned.

    Rows have the columns of `flatten(plan, …)`, then `_time_ns` and `_routing_key`, sorted
    by (event time, segment, offset, sample); quarantined events are in (segment, offset)
    order. Each chunk's rows are sorted by time already and the chunks are put in stream
    order, so one stable sort by time merges them. With `decode=False` the per-event
    columns stay dictionary-encoded (the same values; `decoded` decodes them)."""
    where = chunks.select(["segment", "start"])
    order = pc.sort_indices(where, [("segment", "ascending"), ("start", "ascending")])
    inline, paths = _values(chunks.column("rows")), chunks.column("path").to_pylist()
    bad_of = _values(chunks.column("quarantine"))
    parts = [
        _read_ipc(pa.memory_map(paths[i]) if paths[i] is not None else inline[i])
        for i in order.to_pylist()
        if paths[i] is not None or inline[i] is not None
    ]
    bad = [_read_ipc(bad_of[i]) for i in order.to_pylist() if bad_of[i] is not None]
    events = int(pc.sum(chunks.column("events")).as_py() or 0)
    quarantine = pa.concat_tables(bad) if bad else flatten(plan, _no_events()).quarantine
    quarantine = quarantine.sort_by([("_segment", "ascending"), ("_offset", "ascending")])
    schema = row_schema(plan)
    if not parts:
        return schema.empty_table(), quarantine, events
    time_column = plan.time.name if plan.time is not None else None
    return _merged_rows(parts, schema, decode, time_column), quarantine, events


def decoded(rows: pa.Table) -> pa.Table:
    """`rows` with its dictionary columns decoded to their values' type."""
    for i, field in enumerate(rows.schema):
        if pa.types.is_dictionary(field.type):
            plain = field.with_type(field.type.value_type)
            rows = rows.set_column(i, plain, rows.column(i).cast(plain.type))
    return rows


def _with_row_time(part: pa.Table, time_column: str | None) -> pa.Table:
    """A part with `_time_ns`: a chunk left it out when it is `time_column`."""
    if ROW_TIME in part.column_names or time_column is None:
        return part
    return part.append_column(pa.field(ROW_TIME, pa.int64()), part.column(time_column))


def _merged_rows(
    parts: list[pa.Table], schema: pa.Schema, decode: bool, time_column: str | None = None
) -> pa.Table:
    """The parts' rows, each part sorted by time and the parts in stream order, as one
    table sorted by time (stable), dictionary columns decoded unless not `decode` (those
    that share their indices then share one indices array); the columns are gathered in
    threads (numpy and Arrow release the GIL), one per core. When no part has `_time_ns`
    (`_time_is_column`), it is the merged `time_column`."""
    same_time = time_column is not None and all(ROW_TIME not in p.column_names for p in parts)
    parts = [_with_row_time(p, time_column) for p in parts]
    times = np.concatenate([p.column(ROW_TIME).to_numpy() for p in parts])
    order = None if _ascending(times) else np.argsort(times, kind="stable")
    jobs: list[Callable[[], pa.Array]] = []
    fields = []
    known: tuple[list[np.ndarray], list[int], pa.Array] | None = None
    for field in schema:
        fields.append(field)
        if same_time and field.name == ROW_TIME:
            continue
        arrays = [p.column(field.name).combine_chunks() for p in parts]
        if not all(pa.types.is_dictionary(a.type) for a in arrays):
            jobs.append(partial(_merged, arrays, order))
            continue
        # Per-event columns share their indices (each row's event): order those once.
        indices = [a.indices.to_numpy() for a in arrays]
        sizes = [len(a.dictionary) for a in arrays]
        if known is None or sizes != known[1] or not _same(known[0], indices):
            known = (indices, sizes, pa.array(_global_indices(sizes, indices, order)))
        values = pa.concat_arrays([a.dictionary for a in arrays])
        if decode:
            jobs.append(partial(values.take, known[2]))
        else:
            fields[-1] = field.with_type(pa.dictionary(known[2].type, field.type))
            jobs.append(partial(pa.DictionaryArray.from_arrays, known[2], values))
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        columns = list(pool.map(lambda job: job(), jobs))
    if same_time:
        names = [f.name for f in fields]
        columns.insert(names.index(ROW_TIME), columns[names.index(str(time_column))])
    return pa.Table.from_arrays(columns, schema=pa.schema(fields))


def _same(known: list[np.ndarray], indices: list[np.ndarray]) -> bool:
    return all(a is b or np.array_equal(a, b) for a, b in zip(known, indices, strict=True))


def _global_indices(
    sizes: list[int], indices: list[np.ndarray], order: np.ndarray | None
) -> np.ndarray:
    """Indices into the parts' dictionaries (of `sizes` values each) concatenated, in
    `order`."""
    bases = np.cumsum([0, *sizes[:-1]])
    merged = np.concatenate(
        [i.astype(np.int64) + base for i, base in zip(indices, bases, strict=True)]
    )
    return merged if order is None else merged[order]


def row_schema(plan: FlattenPlan) -> pa.Schema:
    """The rows' schema: a driver-side flatten's, then `_time_ns` and `_routing_key`."""
    rows = flatten(plan, _no_events()).rows
    return rows.schema.append(pa.field(ROW_TIME, pa.int64())).append(pa.field(ROW_KEY, pa.string()))


def _no_events() -> Events:
    return Events("", [], [], [], [], [])


def _ascending(values: np.ndarray) -> bool:
    return len(values) < 2 or bool((values[1:] >= values[:-1]).all())


def _merged(arrays: list[pa.Array], order: np.ndarray | None) -> pa.Array:
    """One column of every part, concatenated, in `order`; dictionaries decoded. Arrow's
    take rather than numpy's: its memory pool keeps freed pages, numpy's big arrays are
    fresh pages from the kernel each time (measured: the merge 0.5-1.3 s against 1.3-1.8 s)."""
    arrays = [a.dictionary_decode() if pa.types.is_dictionary(a.type) else a for a in arrays]
    if order is None:
        return pa.concat_arrays(arrays)
    return pa.chunked_array(arrays).take(pa.array(order)).combine_chunks()
