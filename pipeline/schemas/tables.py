"""The Arrow side of the flatten (`flatten.py`): the events it is given (`Events`), the rows
of those that flattened (`GoodEvents`) made into the flat table with its lineage columns and
each row's event time, events whose time 64-bit nanoseconds cannot hold moved to the
quarantine, and the quarantine table itself (`QUARANTINE_SCHEMA`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from itertools import compress
from typing import Any

import numpy as np
import pyarrow as pa

from pipeline.schemas.plan import NUMERIC, Column, FlattenPlan, describe_fields

#: The quarantine table: each refused event with its position, the schema and the reason.
QUARANTINE_SCHEMA = pa.schema(
    [
        pa.field("_stream", pa.string()),
        pa.field("_segment", pa.int32()),
        pa.field("_offset", pa.int64()),
        pa.field("_routing_key", pa.string()),
        pa.field("_ingest_time_ns", pa.int64()),
        pa.field("schema", pa.string()),
        pa.field("reason", pa.string()),
        pa.field("payload", pa.binary()),
    ]
)


#: What each column of the quarantine table holds (its column descriptions).
QUARANTINE_DOC = {
    "_stream": "stream the refused event was read from",
    "_segment": "segment of the stream that holds the event",
    "_offset": "byte offset of the event in its segment",
    "_routing_key": "routing key the collector wrote the event with",
    "_ingest_time_ns": "when the event was written to the stream, nanoseconds since the epoch",
    "schema": "the Avro schema the event did not fit",
    "reason": "why the event was refused (not UTF-8 or JSON, a missing field, a wrong type, "
    "parallel arrays of unequal length, an event time out of range)",
    "payload": "the event's bytes, unchanged",
}


def quarantine_columns() -> list[dict[str, Any]]:
    """The quarantine table's columns as `FlattenPlan.describe` gives a plan's."""
    return describe_fields(QUARANTINE_SCHEMA, QUARANTINE_DOC)


#: The machine type a flattened Avro number array is read into.
NUMPY_TYPES = {"int": np.int64, "long": np.int64, "float": np.float64, "double": np.float64}


@dataclass(frozen=True, slots=True)
class Events:
    """The events to flatten: payloads and their positions (one entry per event)."""

    stream: str
    payloads: Sequence[bytes]
    segments: Sequence[int]
    offsets: Sequence[int]
    routing_keys: Sequence[str | None]
    ingest_ns: Sequence[int]

    @classmethod
    def from_arrow(cls, batch: pa.RecordBatch | pa.Table, stream: str = "") -> Events:
        """From the `sluice` source's columns (`ingest_time` as a timestamp or ns)."""
        names = batch.schema.names
        ingest = batch.column("ingest_time") if "ingest_time" in names else None
        if ingest is not None and pa.types.is_timestamp(ingest.type):
            ingest = ingest.cast(pa.timestamp("ns", tz="UTC")).cast(pa.int64())
        count = batch.num_rows
        streams = batch.column("stream").to_pylist() if "stream" in names else [stream]
        return cls(
            stream=(streams[0] if streams else stream) or stream,
            payloads=batch.column("payload").to_pylist(),
            segments=batch.column("segment").to_pylist(),
            offsets=batch.column("offset").to_pylist(),
            routing_keys=batch.column("routing_key").to_pylist()
            if "routing_key" in names
            else [None] * count,
            ingest_ns=ingest.to_pylist() if ingest is not None else [0] * count,
        )


@dataclass(frozen=True, slots=True)
class Flattened:
    """Rows (`plan.arrow_schema`), each row's event time in ns, and quarantined events."""

    rows: pa.Table
    time_ns: np.ndarray
    quarantine: pa.Table
    events: int


@dataclass(frozen=True, slots=True)
class GoodEvents:
    """The events that flattened: their indices, each one's row count, each scalar column's
    value per event, and each sample column's values over all their rows, in event order."""

    index: np.ndarray
    counts: np.ndarray
    scalars: dict[str, list]
    samples: dict[str, pa.Array]


def rows_table(
    plan: FlattenPlan, events: Events, good: GoodEvents, dictionary: bool
) -> tuple[pa.Table, np.ndarray]:
    counts, index = good.counts, good.index
    parent = pa.array(np.repeat(np.arange(len(counts), dtype=np.int32), counts))
    arrays = [
        _scalar_column(c, good.scalars[c.name], parent, dictionary)
        if c.kind == "scalar"
        else good.samples[c.name]
        for c in plan.columns
    ]
    segments = np.asarray(events.segments, dtype=np.int32)[index]
    offsets = np.asarray(events.offsets, dtype=np.int64)[index]
    arrays += [
        _per_event(segments, counts, parent, dictionary),
        _per_event(offsets, counts, parent, dictionary),
        pa.array(_sample_index(counts)),
    ]
    fields = [
        pa.field(f.name, a.type, nullable=f.nullable)
        for f, a in zip(plan.arrow_schema, arrays, strict=True)
    ]
    rows = pa.Table.from_arrays(arrays, schema=pa.schema(fields))
    ingest = np.asarray(events.ingest_ns, dtype=np.int64)[index]
    time = None if plan.time is None else arrays[plan.arrow_schema.get_field_index(plan.time.name)]
    return rows, _event_time(plan, time, lambda: np.repeat(ingest, counts))


def _scalar_column(column: Column, values: list, parent: pa.Array, dictionary: bool) -> pa.Array:
    """A scalar column: each event's value on each of its rows."""
    scalars = pa.array(values, type=column.arrow_type)
    if dictionary and not scalars.null_count:
        return _dictionary(scalars, parent)
    return scalars.take(parent)


def _per_event(
    values: np.ndarray, counts: np.ndarray, parent: pa.Array, dictionary: bool
) -> pa.Array:
    """A value per event, repeated on each of its rows."""
    if dictionary:
        return _dictionary(pa.array(values), parent)
    if len(values) and (values == values[0]).all():
        return pa.array(np.full(len(parent), values[0], dtype=values.dtype))
    return pa.array(np.repeat(values, counts))


def _dictionary(values: pa.Array, parent: pa.Array) -> pa.DictionaryArray:
    """`values` (one per event) on their events' rows, as a dictionary array over the
    distinct values: one entry when every event has the same (a sensor's name, a segment)."""
    encoded = values.dictionary_encode()
    distinct = len(encoded.dictionary)
    # safe=False: the indices are in range by construction (event numbers, or the
    # dictionary's own indices), so Arrow need not check each of them again
    if distinct == len(values):
        return pa.DictionaryArray.from_arrays(parent, values, safe=False)
    if distinct == 1:
        indices = pa.array(np.zeros(len(parent), dtype=np.int32))
    else:
        indices = encoded.indices.take(parent)
    return pa.DictionaryArray.from_arrays(indices, encoded.dictionary, safe=False)


def _sample_index(counts: np.ndarray) -> np.ndarray:
    """Each row's index within its event (0, 1, … per event), as int32."""
    if len(counts) and (counts == counts[0]).all():
        return np.tile(np.arange(counts[0], dtype=np.int32), len(counts))
    starts = np.cumsum(counts) - counts
    index = np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(starts, counts)
    return index.astype(np.int32)


def sample_column(column: Column, values: list, counts: np.ndarray) -> pa.Array:
    """A sample column from each event's values (an array, a list, or None: no array)."""
    kind = column.arrow_type
    if column.avro in NUMERIC and not column.path and not any(isinstance(v, list) for v in values):
        dtype = NUMPY_TYPES[column.avro]
        chunks = [
            np.zeros(int(n), dtype=dtype) if v is None else v
            for v, n in zip(values, counts, strict=True)
        ]
        data = np.concatenate(chunks).astype(kind.to_pandas_dtype(), copy=False) if chunks else []
        mask = None
        if any(v is None for v in values):
            mask = np.repeat(np.array([v is None for v in values]), counts)
        return pa.array(data, type=kind, mask=mask)
    flat: list = []
    for value, count in zip(values, counts, strict=True):
        flat.extend(value if value is not None else [None] * int(count))
    return pa.array(flat, type=kind)


def _event_time(
    plan: FlattenPlan, column: pa.Array | None, ingest: Callable[[], np.ndarray]
) -> np.ndarray:
    """Each row's event time in ns: the plan's time column, else the event's ingest time."""
    if plan.time is None or column is None or len(column) == 0:
        return ingest()
    if pa.types.is_dictionary(column.type):
        column = column.cast(column.type.value_type)
    unit = plan.time.ns_per_unit
    if not column.null_count:
        values = column.to_numpy()
        # a new array (never a view of the rows' buffer), as the multiplication makes one
        return values.astype(np.int64) if unit == 1 else values.astype(np.int64) * unit
    values = column.fill_null(0).to_numpy().astype(np.int64) * unit
    nulls = column.is_null().to_numpy(zero_copy_only=False)
    return np.where(nulls, ingest(), values)


#: The first and last days 64-bit nanoseconds since 1970 reach (the rows' `time_ns`).
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_FIRST_DAY = f"{_EPOCH + timedelta(microseconds=-(2**63) // 1000):%Y-%m-%d}"
_LAST_DAY = f"{_EPOCH + timedelta(microseconds=(2**63 - 1) // 1000):%Y-%m-%d}"
_UNITS = {1_000: "microseconds", 1_000_000: "milliseconds"}


def placeable(plan: FlattenPlan, good: GoodEvents, bad: list[tuple[int, str]]) -> GoodEvents:
    """The events whose every event time fits 64-bit nanoseconds; the others go to `bad`
    (kept in event order), with their first value that does not. Only a `timestamp-millis`
    or `-micros` long column can hold one: its value times the unit would wrap around and
    put the rows in a wrong hour (year 50,000 in microseconds is no time in nanoseconds)."""
    time = plan.time
    if time is None or time.ns_per_unit == 1 or not len(good.counts):
        return good
    unit = time.ns_per_unit
    low, high = -(2**63 // unit), (2**63 - 1) // unit
    column = next(c for c in plan.columns if c.name == time.name)
    events = np.arange(len(good.counts))
    if column.kind == "scalar":
        values = pa.array(good.scalars[column.name], type=pa.int64())
    else:
        values, events = good.samples[column.name], np.repeat(events, good.counts)
    numbers = values.fill_null(0).to_numpy()
    if not len(numbers) or (numbers.min() >= low and numbers.max() <= high):
        return good
    out = np.flatnonzero((numbers < low) | (numbers > high))
    refused, first = np.unique(events[out], return_index=True)
    for event, value in zip(refused.tolist(), numbers[out[first]].tolist(), strict=True):
        edge = f"after {_LAST_DAY}" if value > high else f"before {_FIRST_DAY}"
        reason = (
            f"event time out of range: {column.name} = {value} {_UNITS[unit]} since 1970 is "
            f"{edge}, beyond 64-bit nanoseconds: no hour to put it in (schema {plan.name})"
        )
        bad.append((int(good.index[event]), reason))
    bad.sort(key=lambda item: item[0])
    keep = np.ones(len(good.counts), dtype=bool)
    keep[refused] = False
    return _kept(good, keep)


def _kept(good: GoodEvents, keep: np.ndarray) -> GoodEvents:
    """`good` without the events `keep` is False for (`keep`: one per event)."""
    rows = pa.array(np.repeat(keep, good.counts))
    return GoodEvents(
        good.index[keep],
        good.counts[keep],
        {name: list(compress(values, keep)) for name, values in good.scalars.items()},
        {name: values.filter(rows) for name, values in good.samples.items()},
    )


def quarantine_table(plan: FlattenPlan, events: Events, bad: list[tuple[int, str]]) -> pa.Table:
    idx = [i for i, _ in bad]
    return pa.Table.from_pydict(
        {
            "_stream": [events.stream] * len(idx),
            "_segment": [events.segments[i] for i in idx],
            "_offset": [events.offsets[i] for i in idx],
            "_routing_key": [events.routing_keys[i] for i in idx],
            "_ingest_time_ns": [events.ingest_ns[i] for i in idx],
            "schema": [plan.name] * len(idx),
            "reason": [reason for _, reason in bad],
            "payload": [events.payloads[i] for i in idx],
        },
        schema=QUARANTINE_SCHEMA,
    )
