"""Flatten a batch of JSON events into Arrow rows through a `FlattenPlan`; quarantine the bad.

Runs in Spark executors and must be fast: msgspec decodes an event into a typed struct whose
number arrays stay raw JSON text, parsed straight into numpy arrays; anything unusual goes
through a strict decoder that gives the exact answer, the same as the fast path would. An
event that is not UTF-8 or JSON, misses a field, has a wrong type or unequal parallel arrays
is quarantined with its payload, position and reason, never dropped (`DESIGN.md`)."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa

from pipeline.schemas.plan import NUMERIC, Column, FlattenPlan, describe_fields

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
    "parallel arrays of unequal length)",
    "payload": "the event's bytes, unchanged",
}


def quarantine_columns() -> list[dict[str, Any]]:
    """The quarantine table's columns as `FlattenPlan.describe` gives a plan's."""
    return describe_fields(QUARANTINE_SCHEMA, QUARANTINE_DOC)


_NP = {"int": np.int64, "long": np.int64, "float": np.float64, "double": np.float64}
_I64 = np.iinfo(np.int64)
_I32 = np.iinfo(np.int32)


class _FastPathMiss(Exception):
    """The fast path cannot vouch for this event; decode it strictly."""


class _Quarantine(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


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


class _Columns:
    """Per-column accumulators for the events that flattened cleanly."""

    def __init__(self, plan: FlattenPlan) -> None:
        self.plan = plan
        self.values: dict[str, list] = {c.name: [] for c in plan.columns}
        self.counts: list[int] = []
        self.good: list[int] = []

    def add(self, index: int, count: int, values: dict[str, Any]) -> None:
        for name, value in values.items():
            self.values[name].append(value)
        self.counts.append(count)
        self.good.append(index)


def flatten(plan: FlattenPlan, events: Events, *, dictionary: bool = False) -> Flattened:
    """Flatten `events` (see the module doc); never raises for a bad event.

    `dictionary=True` returns the per-event columns (scalars, `_segment`, `_offset`) as
    Arrow dictionary arrays over the events instead of repeating each value on every row of
    its event: the same values, no copies, and Parquet writes them as dictionary pages as is.
    """
    acc = _Columns(plan)
    bad: list[tuple[int, str]] = []
    with warnings.catch_warnings():
        # numpy warns (instead of failing) when text does not parse to its end.
        warnings.simplefilter("error", DeprecationWarning)
        for index, payload in enumerate(events.payloads):
            try:
                count, values = _event(plan, payload)
            except _Quarantine as exc:
                bad.append((index, exc.reason))
                continue
            acc.add(index, count, values)
    rows, time_ns = _table(plan, events, acc, dictionary)
    return Flattened(rows, time_ns, _quarantine(plan, events, bad), len(events.payloads))


def _event(plan: FlattenPlan, payload: bytes | None) -> tuple[int, dict[str, Any]]:
    if payload is None:
        reason = "invalid JSON: the event has no payload"
        raise _Quarantine(reason)
    if not payload.isascii():
        try:
            payload.decode("utf-8")
        except UnicodeDecodeError as exc:
            reason = f"not UTF-8: {exc}"
            raise _Quarantine(reason) from None
    try:
        return _values(plan, plan.fast.decode(payload))
    except (msgspec.DecodeError, msgspec.ValidationError, _FastPathMiss):
        pass
    try:
        decoded = plan.strict.decode(payload)
    except msgspec.ValidationError as exc:
        raise _Quarantine(_validation_reason(plan, str(exc))) from None
    except msgspec.DecodeError as exc:
        reason = f"invalid JSON: {exc}"
        raise _Quarantine(reason) from None
    try:
        return _values(plan, decoded)
    except _FastPathMiss as exc:  # a bytes value out of Latin-1: a wrong type in Avro JSON
        reason = f"wrong type: {exc}"
        raise _Quarantine(reason) from None


def _validation_reason(plan: FlattenPlan, message: str) -> str:
    if "missing required field" in message:
        return f"missing required field: {message} (schema {plan.name})"
    return f"wrong type: {message} (schema {plan.name})"


def _get(obj: Any, path: tuple[str, ...]) -> Any:
    for attr in path:
        if obj is None:
            return None
        obj = getattr(obj, attr)
    return obj


def _values(plan: FlattenPlan, obj: Any) -> tuple[int, dict[str, Any]]:
    """The row count of one decoded event and each column's value (scalar) or values."""
    arrays = {path: _array(plan, path, _get(obj, path)) for path in plan.arrays}
    lengths = {path: len(value) for path, value in arrays.items() if value is not None}
    if len(set(lengths.values())) > 1:
        sizes = ", ".join(f"{'_'.join(p)} has {n}" for p, n in lengths.items())
        reason = f"unequal arrays: {sizes} items (schema {plan.name})"
        raise _Quarantine(reason)
    count = next(iter(lengths.values()), 1)
    values: dict[str, Any] = {}
    for column in plan.columns:
        if column.kind == "scalar":
            values[column.name] = _scalar(column, _get(obj, column.path))
        else:
            values[column.name] = _samples(column, arrays[column.array_path])
    return count, values


def _array(plan: FlattenPlan, path: tuple[str, ...], value: Any) -> Any:
    """A parallel array as decoded; raw JSON numbers are parsed here, once."""
    if isinstance(value, msgspec.Raw):
        return _numbers(value, plan.number_arrays[path])
    return value


def _scalar(column: Column, value: Any) -> Any:
    if value is None:
        return None
    if column.avro in ("bytes", "fixed"):
        try:
            return value.encode("latin-1")
        except UnicodeEncodeError:
            msg = f"{column.name}: Avro bytes in JSON are characters U+0000..U+00FF"
            raise _FastPathMiss(msg) from None
    if column.avro == "map":
        return msgspec.json.encode(value).decode()
    return value


def _samples(column: Column, array: Any) -> Any:
    """One event's values of a sample column: a numpy array for numbers, else a list."""
    if array is None or isinstance(array, np.ndarray):
        return array
    if column.avro in NUMERIC and not column.path:
        return np.array(array, dtype=_NP[column.avro])
    return [_scalar(column, _get(item, column.path)) for item in array]


def _numbers(raw: msgspec.Raw, avro: str) -> np.ndarray:
    """Parse a JSON array of numbers (already checked as JSON by msgspec) with numpy."""
    text = bytes(raw)
    if text[:1] != b"[" or text[-1:] != b"]":
        raise _FastPathMiss(avro)
    inner = text[1:-1]
    if not inner.strip():
        return np.empty(0, dtype=_NP[avro])
    try:
        # msgspec has checked the JSON, so the text is numbers and commas; numpy stops at the
        # first token that is not a number of this type, with a warning raised as an error.
        parsed = np.fromstring(inner, dtype=_NP[avro], sep=",")
    except (ValueError, DeprecationWarning):
        raise _FastPathMiss(avro) from None
    if avro in ("int", "long") and parsed.size:
        low, high = (_I32.min, _I32.max) if avro == "int" else (_I64.min, _I64.max)
        # numpy saturates out-of-range text at the int64 limits: let msgspec judge those.
        if parsed.min() <= low or parsed.max() >= high:
            raise _FastPathMiss(avro)
    elif parsed.size and not np.isfinite(parsed).all():
        raise _FastPathMiss(avro)
    return parsed


def _table(
    plan: FlattenPlan, events: Events, acc: _Columns, dictionary: bool
) -> tuple[pa.Table, np.ndarray]:
    counts = np.asarray(acc.counts, dtype=np.int64)
    good = np.asarray(acc.good, dtype=np.int64)
    parent = np.repeat(np.arange(len(counts), dtype=np.int32), counts)
    arrays = [_column(c, acc.values[c.name], counts, parent, dictionary) for c in plan.columns]
    segments = np.asarray(events.segments, dtype=np.int32)[good]
    offsets = np.asarray(events.offsets, dtype=np.int64)[good]
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
    ingest = np.asarray(events.ingest_ns, dtype=np.int64)[good]
    return rows, _event_time(plan, rows, lambda: np.repeat(ingest, counts))


def _per_event(
    values: np.ndarray, counts: np.ndarray, parent: np.ndarray, dictionary: bool
) -> pa.Array:
    """A value per event, repeated on each of its rows."""
    if dictionary:
        return pa.DictionaryArray.from_arrays(pa.array(parent), pa.array(values))
    if len(values) and (values == values[0]).all():
        return pa.array(np.full(len(parent), values[0], dtype=values.dtype))
    return pa.array(np.repeat(values, counts))


def _sample_index(counts: np.ndarray) -> np.ndarray:
    """Each row's index within its event (0, 1, … per event), as int32."""
    if len(counts) and (counts == counts[0]).all():
        return np.tile(np.arange(counts[0], dtype=np.int32), len(counts))
    starts = np.cumsum(counts) - counts
    index = np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(starts, counts)
    return index.astype(np.int32)


def _column(
    column: Column, values: list, counts: np.ndarray, parent: np.ndarray, dictionary: bool
) -> pa.Array:
    kind = column.arrow_type
    if column.kind == "scalar":
        scalars = pa.array(values, type=kind)
        if dictionary and not scalars.null_count:
            return pa.DictionaryArray.from_arrays(pa.array(parent), scalars)
        return scalars.take(pa.array(parent))
    if column.avro in NUMERIC and not column.path:
        dtype = _NP[column.avro]
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


def _event_time(plan: FlattenPlan, rows: pa.Table, ingest: Callable[[], np.ndarray]) -> np.ndarray:
    """Each row's event time in ns: the plan's time column, else the event's ingest time."""
    if plan.time is None or rows.num_rows == 0:
        return ingest()
    column = rows.column(plan.time.name)
    if pa.types.is_dictionary(column.type):
        column = column.cast(column.type.value_type)
    if not column.null_count:
        return column.to_numpy().astype(np.int64, copy=False) * plan.time.ns_per_unit
    values = column.fill_null(0).to_numpy().astype(np.int64) * plan.time.ns_per_unit
    nulls = column.is_null().to_numpy(zero_copy_only=False)
    return np.where(nulls, ingest(), values)


def _quarantine(plan: FlattenPlan, events: Events, bad: list[tuple[int, str]]) -> pa.Table:
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
