"""Flatten a batch of JSON events into Arrow rows through a `FlattenPlan`; quarantine the bad.

Runs in Spark executors and must be fast: simdjson parses each event whole, its scalars
checked as msgspec would decode them and its number arrays turned straight into buffers of
machine numbers; where the plan or an event needs more, msgspec decodes each event into a typed
struct whose number arrays stay raw JSON text, which simdjson then parses; anything unusual
sends the batch event by event, through a strict decoder where needed, which gives the exact
answer, the same as the fast paths would. An event that is not
UTF-8 or JSON, misses a field, has a wrong type, unequal parallel arrays or an event time
that nanoseconds cannot hold is quarantined with its payload, position and reason, never
dropped (`DESIGN.md`)."""

from __future__ import annotations

import keyword
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from itertools import compress
from operator import attrgetter
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import simdjson

from pipeline.schemas.plan import FLOAT32_MAX, NUMERIC, Column, FlattenPlan, describe_fields

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


_NP = {"int": np.int64, "long": np.int64, "float": np.float64, "double": np.float64}
#: simdjson's buffer type for each Avro number: int64 ("i") or float64 ("d"), as `_NP`.
_BUFFER = {"int": "i", "long": "i", "float": "d", "double": "d"}
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


@dataclass(frozen=True, slots=True)
class _Good:
    """The events that flattened: their indices, each one's row count, each scalar column's
    value per event, and each sample column's values over all their rows, in event order."""

    index: np.ndarray
    counts: np.ndarray
    scalars: dict[str, list]
    samples: dict[str, pa.Array]


class _Columns:
    """Per-column accumulators for the events that flattened cleanly, one at a time."""

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

    def good_events(self) -> _Good:
        counts = np.asarray(self.counts, dtype=np.int64)
        scalars, samples = {}, {}
        for column in self.plan.columns:
            values = self.values[column.name]
            if column.kind == "scalar":
                scalars[column.name] = values
            else:
                samples[column.name] = _sample_column(column, values, counts)
        return _Good(np.asarray(self.good, dtype=np.int64), counts, scalars, samples)


def flatten(plan: FlattenPlan, events: Events, *, dictionary: bool = False) -> Flattened:
    """Flatten `events` (see the module doc); never raises for a bad event.

    `dictionary=True` returns the per-event columns (scalars, `_segment`, `_offset`) as
    Arrow dictionary arrays over their distinct values instead of repeating each value on
    every row of its event: the same values, and Parquet writes them as dictionary pages as is.
    """
    bad: list[tuple[int, str]] = []
    good = _all_at_once(plan, events.payloads)
    if good is None:
        good = _one_by_one(plan, events.payloads, bad)
    good = _placeable(plan, good, bad)
    rows, time_ns = _table(plan, events, good, dictionary)
    return Flattened(rows, time_ns, _quarantine(plan, events, bad), len(events.payloads))


def _one_by_one(
    plan: FlattenPlan, payloads: Sequence[bytes | None], bad: list[tuple[int, str]]
) -> _Good:
    """Each event on its own: the exact answer for any event, rows or a quarantine reason."""
    acc = _Columns(plan)
    for index, payload in enumerate(payloads):
        try:
            count, values = _event(plan, payload)
        except _Quarantine as exc:
            bad.append((index, exc.reason))
            continue
        acc.add(index, count, values)
    return acc.good_events()


def _all_at_once(plan: FlattenPlan, payloads: Sequence[bytes | None]) -> _Good | None:
    """Every event at once, column by column (`DESIGN.md`, "All at once"), or None when any
    event needs a closer look: the batch then goes one event at a time, which gives the same
    rows for the good events and a reason for each bad one."""
    if not _batchable(plan, payloads):
        return None
    good = _read_whole(plan, payloads)
    return good if good is not None else _decoded_at_once(plan, payloads)


def _batchable(plan: FlattenPlan, payloads: Sequence[bytes | None]) -> bool:
    """Whether a batch may go all at once: the plan's arrays all of numbers, every event
    UTF-8 and its arrays flat."""
    if not payloads or not _columnar(plan):
        return False
    for payload in payloads:
        if payload is None or not (payload.isascii() or _utf8(payload)):
            return False
    return _flat_arrays(plan, payloads)


def _decoded_at_once(plan: FlattenPlan, payloads: Sequence[bytes]) -> _Good | None:
    """Each event decoded by msgspec (its number arrays kept as raw text), each scalar column
    gathered, each array parsed by simdjson."""
    try:
        decoded = [plan.fast.decode(payload) for payload in payloads]
        scalars = {c.name: _scalars(c, decoded) for c in plan.columns if c.kind == "scalar"}
    except (msgspec.DecodeError, msgspec.ValidationError, _FastPathMiss, RecursionError):
        return None
    parser = simdjson.Parser()
    buffers: dict[tuple[str, ...], list[memoryview]] = {}
    for path, avro in plan.number_arrays.items():
        raws = [_get(obj, path) for obj in decoded]
        if not all(isinstance(raw, msgspec.Raw) for raw in raws):
            return None  # an optional array: decoded as a list or None
        try:
            buffers[path] = [_number_buffer(parser, raw, avro) for raw in raws]
        except _FastPathMiss:
            return None
    return _gathered(plan, len(payloads), scalars, buffers)


def _gathered(
    plan: FlattenPlan,
    events: int,
    scalars: dict[str, list],
    buffers: dict[tuple[str, ...], list[memoryview]],
) -> _Good | None:
    """The batch from each scalar column's values and each number array's buffers (one per
    event, `_number_buffer`'s): each array's buffers joined, so the values come out
    concatenated and each event's count is its buffer's size; None when the parallel arrays'
    counts differ or a value does not fit its Avro type."""
    counts = np.ones(events, dtype=np.int64)  # an event without arrays is one row
    numbers: dict[tuple[str, ...], np.ndarray] = {}
    for path, avro in plan.number_arrays.items():
        joined = _joined(buffers[path], avro)
        if joined is None or (numbers and not np.array_equal(joined[1], counts)):
            return None
        numbers[path], counts = joined
    samples = {c.name: _typed(c, numbers[c.array_path]) for c in plan.columns if c.kind == "sample"}
    return _Good(np.arange(events, dtype=np.int64), counts, scalars, samples)


#: The Avro types of the scalars `_read_whole` reads, as simdjson gives them (`type(value)`).
_WHOLE = {"string": str, "boolean": bool, "int": int, "long": int, "double": float, "float": float}
_RANGE = {
    "int": (_I32.min, _I32.max),
    "long": (-(2**63), 2**63 - 1),
    "float": (-FLOAT32_MAX, FLOAT32_MAX),
    "double": (-float("inf"), float("inf")),
}


def _read_whole(plan: FlattenPlan, payloads: Sequence[bytes]) -> _Good | None:
    """Every event parsed once, whole, by simdjson (its scalars and its number arrays), when
    the plan's scalars are all required strings, booleans and numbers at plain JSON names;
    None when the plan or any event needs more (then msgspec decodes the batch).

    It gives what msgspec's decode and the arrays' parse give, without msgspec's pass over
    every byte of the arrays, which it only skips (`DESIGN.md`, "Whole events"): each value
    must have its type exactly (an int is no bool; a long, an int fit their ranges; a double
    takes a whole number too), and an object with a key twice goes to msgspec (it keeps the
    last, simdjson the first)."""
    scalars = [c for c in plan.columns if c.kind == "scalar"]
    paths = [c.path for c in scalars] + list(plan.number_arrays)
    if not all(c.avro in _WHOLE and not c.nullable for c in scalars) or not all(
        _plain_name(name) for path in paths for name in path
    ):
        return None
    values: dict[str, list] = {c.name: [] for c in scalars}
    buffers: dict[tuple[str, ...], list] = {path: [] for path in plan.number_arrays}
    parser = simdjson.Parser()
    try:
        for payload in payloads:
            doc = parser.parse(payload)
            _unique_keys(doc)
            for column in scalars:
                value = _scalar_at(doc, column)
                if value is None:
                    return None
                values[column.name].append(value)
            for path, avro in plan.number_arrays.items():
                array = _member(doc, path)
                if not isinstance(array, simdjson.Array):
                    return None
                buffers[path].append(memoryview(array.as_buffer(of_type=_BUFFER[avro])))
                del array
            del doc  # (simdjson refuses to parse again while a value of the last parse lives)
    except (TypeError, ValueError, RuntimeError, KeyError):  # not an object, a bad value
        return None
    return _gathered(plan, len(payloads), values, buffers)


def _plain_name(name: str) -> bool:
    """Whether a path's attribute is the JSON name itself (`plan._attr` renames keywords)."""
    return not (name.endswith("_") and keyword.iskeyword(name[:-1]))


def _member(doc: Any, path: tuple[str, ...]) -> Any:
    """The value at `path` of a parsed event (the event checked by `_unique_keys` already),
    each object below it checked on the way; `KeyError` when it is missing."""
    obj = doc
    for depth, name in enumerate(path):
        if depth:
            _unique_keys(obj)
        obj = obj[name]
    return obj


def _unique_keys(obj: Any) -> None:
    """`TypeError` for a value that is not an object, `KeyError` for one with a key twice."""
    if not isinstance(obj, simdjson.Object):
        raise TypeError(obj)
    if len(set(obj.keys())) != len(obj):
        raise KeyError(obj)


def _scalar_at(doc: Any, column: Column) -> Any:
    """A scalar's value as msgspec decodes it, or None when only msgspec can say."""
    value = _member(doc, column.path)
    kind = type(value)
    if kind is int and column.avro in ("double", "float"):
        value, kind = float(value), float  # as msgspec reads a whole number (`-0` too: 0.0)
    if kind is not _WHOLE[column.avro]:
        return None
    if column.avro in _RANGE:
        low, high = _RANGE[column.avro]
        return value if low <= value <= high else None
    return value


def _columnar(plan: FlattenPlan) -> bool:
    """Whether every array of the plan is a required array of numbers: the fast decoder keeps
    those as raw JSON text, the only arrays `_all_at_once` handles (an optional one, or one
    of optional numbers, decodes as a list)."""
    samples = [c for c in plan.columns if c.kind == "sample"]
    numbers = all(path in plan.number_arrays for path in plan.arrays)
    return numbers and not any(c.nullable for c in samples)


def _utf8(payload: bytes) -> bool:
    try:
        payload.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _scalars(column: Column, decoded: list) -> list:
    """One scalar column's value for each decoded event."""
    if len(column.path) == 1:
        values = list(map(attrgetter(column.path[0]), decoded))
    else:
        values = [_get(obj, column.path) for obj in decoded]
    if column.avro in ("bytes", "fixed", "map"):
        return [_scalar(column, value) for value in values]
    return values


def _flat_arrays(plan: FlattenPlan, payloads: Sequence[bytes]) -> bool:
    """Whether every event holds exactly one `[` per array of the plan: then its arrays hold
    no arrays (simdjson's buffers flatten nested ones). A `[` inside a string only sends the
    batch one event at a time."""
    brackets = len(plan.arrays)
    return all(_holds(payload, b"[", brackets) for payload in payloads)


def _holds(text: bytes, char: bytes, times: int) -> bool:
    """Whether `text` holds `char` exactly `times` times, by `find` (memchr's speed; a
    one-byte `count` walks the text byte by byte)."""
    at = -1
    for _ in range(times):
        at = text.find(char, at + 1)
        if at < 0:
            return False
    return text.find(char, at + 1) < 0


def _joined(buffers: list[memoryview], avro: str) -> tuple[np.ndarray, np.ndarray] | None:
    """Each event's buffer of numbers joined: the values and each event's count, or None
    when a value does not fit the Avro type (`_plain`)."""
    counts = np.fromiter((b.nbytes for b in buffers), dtype=np.int64, count=len(buffers)) // 8
    values = np.frombuffer(b"".join(buffers), dtype=_NP[avro])
    if not _plain(values, avro):
        return None
    return values, counts


def _number_buffer(parser: simdjson.Parser, raw: msgspec.Raw | bytes, avro: str) -> memoryview:
    """One JSON array's numbers as 8-byte machine numbers, exactly as JSON reads them; raises
    `_FastPathMiss` for anything else: not an array, a value that is not a number of this
    type (a fraction or exponent in an int array, null, a string, true), or out of range."""
    try:
        array = parser.parse(raw)
        if not isinstance(array, simdjson.Array):
            raise _FastPathMiss(avro)
        return memoryview(array.as_buffer(of_type=_BUFFER[avro]))
    except (TypeError, ValueError, RuntimeError):  # simdjson's type, range and big-int errors
        raise _FastPathMiss(avro) from None


def _plain(values: np.ndarray, avro: str) -> bool:
    """Whether the values fit the Avro type as JSON reads them: an Avro int in 32 bits, a
    double finite, a float finite in 32 bits (simdjson refuses an int64's overflow and an
    infinite double already)."""
    if not values.size:
        return True
    if avro == "int":
        return bool(values.min() >= _I32.min and values.max() <= _I32.max)
    if avro == "float":
        return bool(values.min() >= -FLOAT32_MAX and values.max() <= FLOAT32_MAX)
    return avro == "long" or bool(np.isfinite(values).all())


def _typed(column: Column, values: np.ndarray) -> pa.Array:
    kind = column.arrow_type
    return pa.array(values.astype(kind.to_pandas_dtype(), copy=False), type=kind)


def _event(plan: FlattenPlan, payload: bytes | None) -> tuple[int, dict[str, Any]]:
    if not payload:
        reason = "invalid JSON: the event is empty"
        raise _Quarantine(reason)
    if not payload.isascii():
        try:
            payload.decode("utf-8")
        except UnicodeDecodeError as exc:
            reason = f"not UTF-8: {exc}"
            raise _Quarantine(reason) from None
    try:
        return _values(plan, plan.fast.decode(payload))
    except (msgspec.DecodeError, msgspec.ValidationError, _FastPathMiss, RecursionError):
        pass
    try:
        decoded = plan.strict.decode(payload)
    except RecursionError:
        return _deep(plan, payload)
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


def _deep(plan: FlattenPlan, payload: bytes) -> tuple[int, dict[str, Any]]:
    """An event too deep for msgspec (Python's recursion limit): what the whole-event read
    gives (simdjson takes 1024 levels), so that its answer does not depend on the other
    events of its batch; else quarantined."""
    good = _read_whole(plan, [payload]) if _batchable(plan, [payload]) else None
    if good is None:
        limit = sys.getrecursionlimit()
        reason = f"nested too deeply: more levels than the decoder takes (about {limit})"
        raise _Quarantine(reason)
    values = {name: column[0] for name, column in good.scalars.items()}
    values |= {name: array.to_numpy() for name, array in good.samples.items()}
    return int(good.counts[0]), values


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
    if column.avro in NUMERIC and not column.path and None not in array:
        return np.array(array, dtype=_NP[column.avro])
    return [_scalar(column, _get(item, column.path)) for item in array]


def _numbers(raw: msgspec.Raw, avro: str) -> np.ndarray:
    """One event's JSON array of numbers (already checked as JSON by msgspec) as numpy."""
    if not _holds(bytes(raw), b"[", 1):
        raise _FastPathMiss(avro)  # not an array, or one holding arrays
    values = np.frombuffer(_number_buffer(simdjson.Parser(), raw, avro), dtype=_NP[avro])
    if not _plain(values, avro):
        raise _FastPathMiss(avro)
    return values


def _table(
    plan: FlattenPlan, events: Events, good: _Good, dictionary: bool
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


def _sample_column(column: Column, values: list, counts: np.ndarray) -> pa.Array:
    """A sample column from each event's values (an array, a list, or None: no array)."""
    kind = column.arrow_type
    if column.avro in NUMERIC and not column.path and not any(isinstance(v, list) for v in values):
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


def _placeable(plan: FlattenPlan, good: _Good, bad: list[tuple[int, str]]) -> _Good:
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


def _kept(good: _Good, keep: np.ndarray) -> _Good:
    """`good` without the events `keep` is False for (`keep`: one per event)."""
    rows = pa.array(np.repeat(keep, good.counts))
    return _Good(
        good.index[keep],
        good.counts[keep],
        {name: list(compress(values, keep)) for name, values in good.scalars.items()},
        {name: values.filter(rows) for name, values in good.samples.items()},
    )


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
